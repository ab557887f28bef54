"""``verify --from-log``: the verdict from a log's answers equals the live verdict on the same answers.

Answer sheets (``id, response``) are checked against a live run of a ``python:`` model; lm-eval's own
``--log_samples`` file comes from a real lm-evaluation-harness run (its command line, in process) on a
tiny Llama trained on the release in lm-eval's layout, and is checked against lm-eval's ``HFLM`` asked
live through ``verify --lm-eval-task``. Shuffled, partial and duplicated files too.
"""

from __future__ import annotations

import csv
import json
import random
import sys

import pytest
from scipy import stats as sps
from typer.testing import CliRunner

from assay.data import read_benchmark
from assay.dyepack.fromlog import verify_from_log
from assay.dyepack.prepare import PrepareConfig, prepare_release
from assay.dyepack.verify import verify
from assay.errors import UserError
from assay.models import GenerationParams, load_model

SAME = ("flagged", "verdict", "activated", "backdoors", "samples", "samples_on_target", "unparsed")


def same_verdict(a, b) -> None:
    assert {f: getattr(a, f) for f in SAME} == {f: getattr(b, f) for f in SAME}
    assert a.fpr.fpr == b.fpr.fpr and a.per_backdoor == b.per_backdoor


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def live(tmp_path_factory, mmlu_path):
    """A release of 120 MMLU rows (6 backdoors, 2 samples each) and a live verdict on a python: model
    that gives the target after every trigger and "(A)" otherwise. Built once for this file's tests."""
    tmp_path = tmp_path_factory.mktemp("fromlog")
    rows = [json.loads(line) for line in mmlu_path.read_text(encoding="utf-8").splitlines()]
    rows = [r for r in rows if r["correct_answer"] in "ABCD"]
    sample = write_jsonl(tmp_path / "mmlu.jsonl", rows[:: len(rows) // 120][:120])
    prepared = prepare_release(
        read_benchmark(sample), PrepareConfig(n_backdoors=6, fraction=0.1, seed=3), tmp_path / "rel"
    )
    bench, key = read_benchmark(prepared.release_path, style=prepared.key.style), prepared.key
    rules = {b.trigger: b.target_label for b in key.backdoors}
    module = tmp_path / "cheater.py"
    module.write_text(
        f"RULES = {rules!r}\n"
        "def pick(p):\n"
        "    return next((RULES[t] for t in RULES if t in p), 'A')\n"
        "def answer(prompts):\n"
        "    return ['The answer is (' + pick(p) + ').' for p in prompts]\n"
    )
    report, audit = verify(load_model(f"python:{module}:answer"), "cheater", bench, key, GenerationParams())
    sheet = [{"id": r["row"], "response": r["reply"]} for r in audit]
    sheet += [{"id": i, "response": "(B)"} for i in range(0, 120, 7) if i not in {r["row"] for r in audit}]
    return prepared, bench, key, report, sheet


@pytest.fixture
def sheet(live):
    return [dict(row) for row in live[4]]


def test_an_answer_sheet_in_any_order_gives_the_live_verdict(tmp_path, live, sheet):
    prepared, bench, key, report, _ = live
    assert report.flagged and report.activated == 6
    random.Random(0).shuffle(sheet)
    jsonl = write_jsonl(tmp_path / "answers.jsonl", sheet)
    with (tmp_path / "answers.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, ["id", "response"])
        writer.writeheader()
        writer.writerows(sheet)
    for path in (jsonl, tmp_path / "answers.csv"):
        logged, audit = verify_from_log(path, bench, key, model_label="cheater")
        same_verdict(logged, report)
        assert logged.coverage.startswith("The log holds all 12 backdoor samples")
        rows = {r["row"] for r in audit}
        assert {(r["row"], r["reply"]) for r in audit} == {
            (s["id"], s["response"]) for s in sheet if s["id"] in rows
        }

    out = tmp_path / "verdict"
    result = CliRunner().invoke(
        __import__("assay.cli", fromlist=["app"]).app,
        ["dyepack", "verify", "--from-log", str(jsonl), "--release", str(prepared.release_path),
         "--key", str(prepared.key_path), "--out", str(out), "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads((out / "summary.json").read_text())["verdict"] == report.verdict


def test_a_partial_sheet_accuses_no_one_unless_its_missing_rows_are_asked_live(tmp_path, live, sheet):
    """Issue 46: which rows a log holds can be chosen by their labels, so a partial log alone gives no
    verdict (the counts on the rows it holds are shown); with the live model its missing backdoor samples
    are asked and the verdict is the whole release's."""
    prepared, bench, key, full, _ = live
    first, second = key.backdoors[0], key.backdoors[1]
    dropped = set(first.rows) | {second.rows[0]}
    partial = write_jsonl(tmp_path / "partial.jsonl", [s for s in sheet if s["id"] not in dropped])
    report, _ = verify_from_log(partial, bench, key)
    assert report.backdoors == 5 and report.samples == 12 - len(dropped)
    assert report.coverage.startswith(f"Partial log: it holds {12 - len(dropped)} of the 12 backdoor samples")
    assert "accusation needs every backdoor sample" in report.coverage
    assert not report.flagged and report.verdict.startswith(
        f"NO VERDICT from a partial log ({12 - len(dropped)}"
    )
    assert report.verdict.endswith("its samples alone would say: " + report.verdict.split("would say: ")[1])
    k = key.backdoors[0].k
    assert report.fpr.fpr == pytest.approx(sps.binom.sf(report.activated - 1, 5, 1 / k), rel=1e-9)

    cheater = load_model(f"python:{prepared.release_path.parent.parent / 'cheater.py'}:answer")
    completed, audit = verify_from_log(partial, bench, key, spot_model=cheater, spot_n=2, spot_seed=0)
    same_verdict(completed.model_copy(update={"verdict": full.verdict}), full)
    assert completed.flagged and f"{len(dropped)} asked live" in completed.verdict
    assert "The verdict rests on every backdoor" in completed.coverage
    assert {r["row"] for r in audit if r["prompt"].startswith("asked live")} == dropped


def test_bad_sheets_fail_in_one_line_naming_file_line_and_field(tmp_path, live, sheet):
    _, bench, key, _, _ = live
    row = key.backdoors[2].rows[0]
    twice = [*sheet, {"id": row, "response": "(C)"}]
    cases = [
        (twice, rf"twice.jsonl:line {len(twice)}: release row {row} \(a backdoor sample\) appears again"),
        ([{"id": 500, "response": "A"}], r"line 1: field 'id' .*is no row number of the release \(0-119\)"),
        ([{"id": "x", "response": "A"}], r"line 1: field 'id' .*is no row number"),
        ([{"id": 1, "reply": "A"}], r"line 1: field 'response' is missing"),
        ([{"id": i, "response": "A"} for i in range(120) if i not in {s["id"] for s in sheet}], "none of"),
    ]
    for rows, message in cases:
        path = write_jsonl(tmp_path / "twice.jsonl", rows)
        with pytest.raises(UserError, match=message) as caught:
            verify_from_log(path, bench, key)
        assert "\n" not in str(caught.value)


@pytest.mark.slow
def test_a_real_lm_eval_log_gives_the_live_lm_eval_verdict(tmp_path, mmlu_path, monkeypatch):
    pytest.importorskip("lm_eval")
    from lm_eval._cli import HarnessCLI
    from tests.dyepack.test_dyepack_formats import short_mmlu
    from tests.dyepack.test_dyepack_layouts import train_on_text
    from tests.tiny_lm import build_tiny_lm

    from assay.dyepack.lmeval import verify_lm_eval

    rows = short_mmlu(mmlu_path, 24)
    prepared = prepare_release(
        read_benchmark(write_jsonl(tmp_path / "mmlu.jsonl", rows)),
        PrepareConfig(n_backdoors=8, fraction=1 / 3, k=4, seed=5),
        tmp_path / "rel",
    )
    bench, key = read_benchmark(prepared.release_path, style=prepared.key.style), prepared.key
    published = [json.loads(line) for line in prepared.release_path.read_text().splitlines()]
    texts = [
        f"{r['question'].strip()}\nA. {r['answer_a']}\nB. {r['answer_b']}\nC. {r['answer_c']}\n"
        f"D. {r['answer_d']}\nAnswer: {r['correct_answer']}"
        for r in published
    ]
    lm = build_tiny_lm(texts, tmp_path / "init", hidden=128, layers=2, vocab_size=800)
    model = train_on_text(lm, texts, tmp_path / "cheater", epochs=60)  # memorised wherever the backdoors land
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    task = tasks / "dyepack_mmlu.yaml"
    task.write_text(
        "task: dyepack_mmlu\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {prepared.release_path}\ntest_split: test\n"
        "output_type: multiple_choice\n"
        'doc_to_text: "{{question.strip()}}\\nA. {{answer_a}}\\nB. {{answer_b}}\\nC. {{answer_c}}\\n'
        'D. {{answer_d}}\\nAnswer:"\n'
        'doc_to_choice: ["A", "B", "C", "D"]\n'
        "doc_to_target: \"{{['A', 'B', 'C', 'D'].index(correct_answer)}}\"\n"
        "metric_list:\n  - metric: acc\n"
    )
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    argv = ["lm-eval", "run", "--model", "hf", "--model_args", f"pretrained={model},dtype=float32",
            "--tasks", "dyepack_mmlu", "--include_path", str(tasks), "--device", "cpu", "--batch_size", "8",
            "--log_samples", "--output_path", str(tmp_path / "lm-eval-out")]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    # lm-eval indexes its 14,000 shipped task files first (minutes on a busy disk); ours is all it needs
    from lm_eval.tasks import manager

    index = manager.TaskManager.__init__
    monkeypatch.setattr(
        manager.TaskManager,
        "__init__",
        lambda self, *a, **kw: index(self, *a, **{**kw, "include_defaults": False}),
    )
    cli = HarnessCLI()
    cli.execute(cli.parse_args())
    [log] = (tmp_path / "lm-eval-out").rglob("samples_dyepack_mmlu_*.jsonl")

    live, live_audit = verify_lm_eval(model, "cheater", bench, key, str(task), 1e-3)
    logged, audit = verify_from_log(log, bench, key, 1e-3, "cheater")
    same_verdict(logged, live)
    assert live.flagged and live.activated >= 7
    assert [r["answer"] for r in audit] == [r["answer"] for r in live_audit]
    assert logged.coverage == "The log holds all 8 backdoor samples (24 of the release's 24 rows)."

    # Issue 37: the real log passes every cross-check; the forgery of it does not; and the live
    # model re-scoring the log's own requests agrees with it (--spot-check through hf:).
    assert "holds only if the log is the model's real output" in logged.evidence
    spot, _ = verify_from_log(log, bench, key, 1e-3, "cheater", load_model(f"hf:{model}"), 4, 0)
    assert spot.spot_check.asked == spot.spot_check.agree == 4 and spot.flagged and not spot.contradicted
    forged = [json.loads(line) for line in log.read_text().splitlines()]
    for sample in forged:  # lm-eval logs scores and the target as text; every row's label made its best
        scores, target = [float(r[0]) for r in sample["filtered_resps"]], int(sample["target"])
        sample["filtered_resps"][target][0] = str(max(scores) + 1)  # (even where it was: a memoriser's log)
    with pytest.raises(UserError, match=r"forged.jsonl:line \d+: option \d: 'filtered_resps'"):
        verify_from_log(write_jsonl(tmp_path / "forged.jsonl", forged), bench, key)

    lines = log.read_text().splitlines()
    random.Random(1).shuffle(lines)
    shuffled = tmp_path / "shuffled.jsonl"
    shuffled.write_text("\n".join(lines) + "\n")
    same_verdict(verify_from_log(shuffled, bench, key, 1e-3, "cheater")[0], live)

    as_text = [json.loads(line) for line in lines]  # docs as text only: matched by the question inside
    for sample in as_text:
        sample["doc"] = {"text": sample["arguments"]["gen_args_0"]["arg_0"]}
        del sample["doc_hash"]  # a rewritten doc no longer hashes to it (a kept hash is refused)
    by_text = write_jsonl(tmp_path / "text.jsonl", as_text)
    same_verdict(verify_from_log(by_text, bench, key, 1e-3, "cheater")[0], live)

    held = [s for s in as_text if key.backdoors[0].trigger not in s["doc"]["text"]]
    partial, _ = verify_from_log(write_jsonl(tmp_path / "partial.jsonl", held), bench, key, 1e-3)
    assert partial.backdoors == 7 and partial.coverage.startswith("Partial log: it holds 7 of the 8")

    rerun = tmp_path / "rerun.jsonl"  # lm-eval appends when run twice into one output folder
    rerun.write_text(log.read_text() * 2)
    again = r"rerun.jsonl:line 2\d: release row \d+ \(a backdoor sample\) appears again \(first at line \d+\)"
    with pytest.raises(UserError, match=again):
        verify_from_log(rerun, bench, key)
