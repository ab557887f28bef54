"""Verify through lm-evaluation-harness: a maintainer's own task config and lm-eval's model backend.

Why: a maintainer who already evaluates with an lm-eval task has the exact prompt (``doc_to_text``,
``doc_to_choice``, ``target_delimiter``, description, few-shot layout) that models were compared with; a
model trained on that format is best asked in it, by lm-eval's own code rather than a copy of it. This
adapter (the optional extra ``assay[lm-eval]``, lm_eval 0.4.13) builds the task from its YAML with the
release's rows as its documents, scores every option of each backdoor row with lm-eval's ``HFLM``
(``multiple_choice`` tasks: the option of highest log-likelihood, lm-eval's ``acc``) and hands the chosen
option of each row back to :func:`assay.dyepack.verify.build_report`.

The task sees two splits made here, whatever its YAML names: the backdoor rows to score, and the rows
without a backdoor for its few-shot sampler, so a few-shot example can never show a trigger and its target.
Only ``hf:`` models are wired (lm-eval's ``HFLM``); ``generate_until`` tasks are refused.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from assay.data import Benchmark
from assay.data.items import MultipleChoice
from assay.dyepack.binding import bind_choices
from assay.dyepack.key import DyePackKey
from assay.dyepack.prompts import FormatRecord
from assay.dyepack.verify import (
    Answer,
    Query,
    VerifyReport,
    backdoor_queries,
    backdoor_rows,
    build_report,
    check_release,
)
from assay.errors import UserError
from assay.models.base import GenerationParams

SCORED, FEWSHOT = "assay_backdoor", "assay_fewshot"


def require_lm_eval() -> None:
    if importlib.util.find_spec("lm_eval") is None:
        raise UserError("--lm-eval-task needs lm-evaluation-harness: pip install 'assay[lm-eval]'")


def task_config(task: str) -> dict[str, Any]:
    """The task's full config: a YAML file (with its ``include``s and ``!function``s), or the name of a
    task lm-eval ships (its index is searched, nothing is downloaded)."""
    require_lm_eval()
    from lm_eval.tasks._yaml_loader import load_yaml

    path = Path(task)
    if path.suffix not in (".yaml", ".yml"):
        from lm_eval.tasks import TaskManager

        entry = TaskManager().task_index.get(task)
        if entry is None or entry.yaml_path is None:
            raise UserError(f"--lm-eval-task {task!r}: not a .yaml file and not a task lm-eval ships")
        path = Path(entry.yaml_path)
    elif not path.is_file():
        raise UserError(f"{path}: lm-eval task file not found")
    try:
        config = load_yaml(path, resolve_func=True)
    except (OSError, ValueError, ImportError, AttributeError) as exc:
        raise UserError(f"{path}: cannot read the lm-eval task: {exc}") from None
    if config.get("output_type") != "multiple_choice":
        raise UserError(
            f"{path}: output_type is {config.get('output_type')!r}; only multiple_choice tasks are "
            "supported (each option scored by log-likelihood)"
        )
    return config


def build_task(config: dict[str, Any], scored: list[dict], fewshot_pool: list[dict]) -> Any:
    """An lm-eval ``ConfigurableTask`` whose documents are ``scored`` and few-shot pool ``fewshot_pool``."""
    from datasets import Dataset, DatasetDict
    from lm_eval.api.task import ConfigurableTask

    splits = DatasetDict({SCORED: Dataset.from_list(scored)})
    if fewshot_pool:
        splits[FEWSHOT] = Dataset.from_list(fewshot_pool)
    config = {k: v for k, v in config.items() if k not in ("tag", "group", "task_list", "include")}
    config.update(
        custom_dataset=lambda **_: splits,
        dataset_path=None,
        test_split=SCORED,
        validation_split=None,
        training_split=None,
        fewshot_split=FEWSHOT if fewshot_pool else None,
    )
    try:
        return ConfigurableTask(config=config)
    except (KeyError, TypeError, ValueError) as exc:  # a template naming a column the release lacks
        raise UserError(f"lm-eval task {config.get('task')!r} on this release: {exc!r}") from None


def lm_eval_answers(
    task: Any, lm: Any, queries: Sequence[Query], docs: Sequence[dict], fewshot: int, seed: int
) -> tuple[list[Query], list[Answer]]:
    """Per query, the option lm-eval's model finds most likely (ties: the first), with all scores; the
    queries come back with lm-eval's own prompt for the audit."""
    from lm_eval.api.instance import Instance

    task.set_fewshot_seed(seed)
    per_doc: list[list[Instance]] = []
    asked = []
    form = None
    for query, doc in zip(queries, docs, strict=True):
        context = task.fewshot_context(doc, fewshot)
        asked.append(replace(query, prompt=str(context)))
        instances = task.construct_requests(doc, context, metadata=(task.config.task, query.row, 1))
        choices = task.doc_to_choice(doc)
        item = query.item
        if not isinstance(item, MultipleChoice) or len(choices) != item.k:
            raise UserError(
                f"row {query.row}: the lm-eval task gives {len(choices)} choices, the release item has "
                f"{getattr(item, 'k', 'no')} options; the task must list the row's options in order"
            )
        instances = instances if isinstance(instances, list) else [instances]
        # the one binding every log path passes: request i is option i of the release row (its letter
        # or text), so the best score's position is the release's option
        form = bind_choices(
            item, [i.args[1] for i in instances], f"lm-eval task {task.config.task}", query.row, form
        )
        per_doc.append(instances)
    flat = [instance for instances in per_doc for instance in instances]
    scores = [float(ll) for ll, _greedy in lm.loglikelihood(flat, disable_tqdm=True)]
    answers, start = [], 0
    for instances in per_doc:
        mine = scores[start : start + len(instances)]
        start += len(instances)
        best = max(range(len(mine)), key=lambda i: (mine[i], -i))
        answers.append(Answer(instances[best].args[1].strip(), best, mine))
    return asked, answers


def verify_lm_eval(
    model_dir: str | Path,
    model_label: str,
    bench: Benchmark,
    key: DyePackKey,
    task: str,
    alpha: float,
    fewshot: int | None = None,
    seed: int = 1234,
    batch_size: int = 8,
) -> tuple[VerifyReport, list[dict]]:
    """Verify ``model_dir`` (an HF folder) through lm-eval's ``HFLM`` and the task ``task``."""
    require_lm_eval()
    from lm_eval.models.huggingface import HFLM

    from assay.models.hf import quiet_transformers

    check_release(bench, key)
    quiet_transformers()  # the CLI shows its own progress; lm-eval's notes and bars would drown it
    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    config = task_config(task)
    queries = backdoor_queries(bench, key)
    rows = bench.table.rows
    excluded = backdoor_rows(key)
    shots = (config.get("num_fewshot") or 0) if fewshot is None else fewshot
    lm_task = build_task(
        config,
        [dict(rows[q.row]) for q in queries],
        [dict(row) for i, row in enumerate(rows) if i not in excluded] if shots else [],
    )
    lm = HFLM(pretrained=str(model_dir), device="cpu", batch_size=batch_size, dtype="float32")
    docs = list(lm_task.eval_docs)
    asked, answers = lm_eval_answers(lm_task, lm, queries, docs, shots, seed)
    record = FormatRecord(
        mode="loglikelihood",
        template=f"lm-eval:{config.get('task')}",
        fewshot=shots,
        fewshot_seed=seed if shots else None,
        lm_eval_task=str(task),
    )
    params = GenerationParams(max_new_tokens=1)
    return build_report(model_label, bench, key, params, alpha, record, asked, answers)
