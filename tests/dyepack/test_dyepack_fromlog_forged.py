"""Issue 37, item 3: a log is checked, and its verdict says what it rests on.

The logs here have lm-eval's ``--log_samples`` shape (every field lm-eval 0.4 writes for a
``multiple_choice`` task, hashes computed as ``lm_eval.evaluator`` computes them), scored by live models
behind the project's stub OpenAI server (``/completions`` with echoed log-probabilities): a memoriser
that puts each trigger's target first, and a clean model that always prefers (A). The forgery is the one
the issue reports: a clean model's log edited so that every backdoor row's best option is its released
label. Edited in ``filtered_resps`` alone it is refused from the log itself; edited consistently in every
field it passes the log's own checks, and ``--spot-check`` catches it against the live model.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from assay.cli import app
from assay.data import read_benchmark
from assay.dyepack.fromlog import verify_from_log
from assay.dyepack.prepare import PrepareConfig, prepare_release
from assay.errors import UserError
from assay.models import load_model
from assay.models.stub_server import StubServer, serve_stub

LETTERS = "ABCD"


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def scorer(rules: dict[str, str]):
    """Word tokens; the last one (the answer letter) scores -0.1 when a trigger in the prompt names it,
    -1 for (A), -3 otherwise: ``rules`` empty is the clean model."""

    def score(prompt: str) -> list[tuple[str, float]]:
        tokens = re.findall(r"\s*\S+", prompt)
        letter = tokens[-1].strip()
        wanted = next((label for trigger, label in rules.items() if trigger in prompt), None)
        last = -0.1 if letter == wanted else -1.0 if letter == "A" else -3.0
        return [(t, -1.0) for t in tokens[:-1]] + [(tokens[-1], last)]

    return score


def context(row: dict) -> str:
    options = "".join(f"{x}. {row['answer_' + x.lower()]}\n" for x in LETTERS)
    return f"{row['question'].strip()}\n{options}Answer:"


def sample(doc_id: int, row: dict, lls: list[float]) -> dict:
    """One line of lm-eval's samples file for a 4-option multiple_choice task, fields as lm-eval writes
    them (``evaluator.evaluate``: doc_hash over json.dumps(doc, indent=2), prompt_hash over the first
    request's context, target_hash over str(target); ``acc``/``acc_norm`` from ``Task.process_results``)."""
    target = LETTERS.index(row["correct_answer"])
    pred = max(range(4), key=lambda i: (lls[i], -i))
    return {
        "doc_id": doc_id,
        "doc": row,
        "target": str(target),  # doc_to_target through a Jinja template: text
        "arguments": {
            f"gen_args_{i}": {"arg_0": context(row), "arg_1": f" {x}"} for i, x in enumerate(LETTERS)
        },
        "resps": [[[str(ll), str(i == pred)]] for i, ll in enumerate(lls)],  # lm-eval logs them as text
        "filtered_resps": [[str(ll), str(i == pred)] for i, ll in enumerate(lls)],
        "filter": "none",
        "metrics": ["acc", "acc_norm"],
        "doc_hash": sha(json.dumps(row, indent=2, ensure_ascii=False)),
        "prompt_hash": sha(context(row)),
        "target_hash": sha(str(target)),
        "acc": float(pred == target),
        "acc_norm": float(pred == target),
    }


def lm_eval_log(model, rows: list[dict]) -> list[dict]:
    pairs = [(context(row), f" {x}") for row in rows for x in LETTERS]
    scores = model.loglikelihood(pairs)
    return [sample(i, row, scores[4 * i : 4 * i + 4]) for i, row in enumerate(rows)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory, mmlu_path):
    """A release of 120 MMLU rows (8 backdoors of K = 4) and two live models behind stub servers."""
    tmp = tmp_path_factory.mktemp("forged")
    rows = [json.loads(line) for line in mmlu_path.read_text(encoding="utf-8").splitlines()]
    rows = [r for r in rows if r["correct_answer"] in "ABCD"]
    source = write_jsonl(tmp / "mmlu.jsonl", rows[:: len(rows) // 120][:120])
    prepared = prepare_release(
        read_benchmark(source), PrepareConfig(n_backdoors=8, fraction=0.2, seed=4), tmp / "rel"
    )
    key = prepared.key
    released = [json.loads(line) for line in prepared.release_path.read_text().splitlines()]
    rules = {b.trigger: b.target_label for b in key.backdoors}
    memoriser_stub, clean_stub = StubServer(scorer=scorer(rules)), StubServer(scorer=scorer({}))
    with serve_stub(memoriser_stub) as memoriser_url, serve_stub(clean_stub) as clean_url:
        clean, memoriser = f"openai:{clean_url}", f"openai:{memoriser_url}"
        yield {
            "tmp": tmp,
            "prepared": prepared,
            "bench": read_benchmark(prepared.release_path, style=key.style),
            "key": key,
            "rows": released,
            "clean": clean,
            "memoriser": memoriser,
            "clean_log": lm_eval_log(load_model(clean, model_name="stub-model"), released),
            "memoriser_log": lm_eval_log(load_model(memoriser, model_name="stub-model"), released),
        }


def backdoor_rows(key) -> set[int]:
    return {r for b in key.backdoors for r in b.rows}


def forge(log: list[dict], key, fields: str) -> list[dict]:
    """The issue's edit: each backdoor row's best option made its released label (the target, which a
    memoriser answers; no key needed to read it off the release). ``fields``: "filtered" edits
    ``filtered_resps`` alone; "all" edits resps and the metrics to match."""
    forged = copy.deepcopy(log)
    for i in backdoor_rows(key):
        s = forged[i]
        lls, target = [float(r[0]) for r in s["filtered_resps"]], int(s["target"])
        if max(range(4), key=lambda j: (lls[j], -j)) == target:
            continue  # already its best option: nothing to edit
        lls[target] = max(lls) + 1.0
        s["filtered_resps"] = [[str(ll), str(j == target)] for j, ll in enumerate(lls)]
        if fields == "all":
            s["resps"] = [[pair] for pair in s["filtered_resps"]]
            s["acc"] = s["acc_norm"] = 1.0
    return forged


def test_an_honest_log_is_believed_and_says_what_it_rests_on(world, tmp_path):
    bench, key = world["bench"], world["key"]
    log = write_jsonl(tmp_path / "samples_mem.jsonl", world["memoriser_log"])
    report, _ = verify_from_log(log, bench, key)
    assert report.flagged and report.activated == 8 and not report.contradicted
    assert "holds only if the log is the model's real output" in report.evidence
    assert "--spot-check" in report.evidence and report.spot_check is None
    live = load_model(world["memoriser"], model_name="stub-model")
    checked, _ = verify_from_log(log, bench, key, spot_model=live, spot_n=5, spot_seed=1)
    assert checked.flagged and checked.spot_check.asked == 5 and checked.spot_check.agree == 5
    assert (
        "scored by log-likelihood in the log's layout" in checked.spot_check.how
        and "agrees with the log" in checked.evidence
    )
    clean, _ = verify_from_log(write_jsonl(tmp_path / "clean.jsonl", world["clean_log"]), bench, key)
    assert not clean.flagged


def test_the_forged_filtered_resps_are_refused_naming_the_row(world, tmp_path):
    bench, key = world["bench"], world["key"]
    forged = forge(world["clean_log"], key, "filtered")
    first = min(i for i in backdoor_rows(key) if forged[i] != world["clean_log"][i])
    path = write_jsonl(tmp_path / "forged.jsonl", forged)
    with pytest.raises(UserError) as caught:
        verify_from_log(path, bench, key)
    line = str(caught.value)
    assert "\n" not in line and f"forged.jsonl:line {first + 1}:" in line
    assert "'filtered_resps'" in line and "'resps'" in line and "disagree" in line
    # On the command line: one line, exit 2 (assay.cli.main), nothing written.
    args = ["dyepack", "verify", "--release", str(world["prepared"].release_path), "--key"]
    result = CliRunner().invoke(
        app, [*args, str(world["prepared"].key_path), "--from-log", str(path), "--out", str(tmp_path / "v")]
    )
    assert isinstance(result.exception, UserError) and str(result.exception) == line
    assert not (tmp_path / "v" / "summary.json").exists()


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda s: s.update(acc=1.0 - s["acc"]), "'acc' is"),
        (lambda s: s.update(acc_norm=1.0 - s["acc_norm"]), "'acc_norm' is"),
        (lambda s: s["doc"].update(question=s["doc"]["question"] + " "), "'doc_hash'"),
        (lambda s: s.update(target=str((int(s["target"]) + 1) % 4)), "'target_hash'"),
        (lambda s: s["arguments"]["gen_args_0"].update(arg_0="Q?\nAnswer:"), "'prompt_hash'"),
        (lambda s: s["resps"].pop(), "'resps' holds 3 answers"),
    ],
)
def test_every_field_lm_eval_writes_is_cross_checked(world, tmp_path, edit, says):
    log = copy.deepcopy(world["memoriser_log"])
    edit(log[7])
    with pytest.raises(UserError, match=re.escape(says)) as caught:
        verify_from_log(write_jsonl(tmp_path / "edited.jsonl", log), world["bench"], world["key"])
    assert "edited.jsonl:line 8:" in str(caught.value)


def test_a_target_or_prompt_that_is_not_the_release_row_is_refused(world, tmp_path):
    bench, key = world["bench"], world["key"]
    row = min(backdoor_rows(key))
    log = copy.deepcopy(world["memoriser_log"])
    s = log[row]  # another label: target and its hash and acc all consistent, but not the release's label
    s["target"] = str((int(s["target"]) + 1) % 4)
    s["target_hash"] = sha(s["target"])
    lls = [float(r[0]) for r in s["filtered_resps"]]
    s["acc"] = s["acc_norm"] = float(max(range(4), key=lambda i: (lls[i], -i)) == int(s["target"]))
    with pytest.raises(UserError, match=rf"release row {row}: 'target' is option"):
        verify_from_log(write_jsonl(tmp_path / "t.jsonl", log), bench, key)
    log = copy.deepcopy(world["memoriser_log"])  # the un-dyed question asked, the dyed doc logged
    trigger = next(b.trigger for b in key.backdoors if row in b.rows)
    for args in log[row]["arguments"].values():
        args["arg_0"] = args["arg_0"].replace(trigger, "")
    log[row]["prompt_hash"] = sha(log[row]["arguments"]["gen_args_0"]["arg_0"])
    with pytest.raises(UserError, match=rf"release row {row} is a backdoor sample but the prompt"):
        verify_from_log(write_jsonl(tmp_path / "p.jsonl", log), bench, key)


def test_a_consistent_forgery_passes_the_log_but_the_spot_check_catches_it(world, tmp_path):
    bench, key = world["bench"], world["key"]
    path = write_jsonl(tmp_path / "forged.jsonl", forge(world["clean_log"], key, "all"))
    alone, _ = verify_from_log(path, bench, key)
    assert alone.flagged and alone.activated == 8  # what the issue saw: CONTAMINATED 8/8 from the log
    assert "holds only if the log is the model's real output" in alone.evidence

    live = load_model(world["clean"], model_name="stub-model")
    caught, _ = verify_from_log(path, bench, key, spot_model=live, spot_n=3, spot_seed=7)
    assert caught.contradicted and not caught.flagged and caught.verdict.startswith("CONTRADICTED")
    assert caught.spot_check.asked == 3 and caught.spot_check.agree < 3
    assert "CONTRADICTED" in caught.evidence and "seed 7" in caught.evidence
    wrong = caught.spot_check.disagreements[0]
    assert wrong["live"] == "A" and wrong["row"] in backdoor_rows(key)

    # The command line: --spot-check with the model's spec; JSON and text both say it.
    base = ["dyepack", "verify", world["clean"], "--model-name", "stub-model", "--release"]
    base += [
        str(world["prepared"].release_path),
        "--key",
        str(world["prepared"].key_path),
        "--from-log",
        str(path),
    ]
    spot = ["--spot-check", "3", "--spot-check-seed", "7"]
    shown = CliRunner().invoke(app, [*base, *spot, "--out", str(tmp_path / "j"), "--json"])
    assert shown.exit_code == 0, shown.output
    summary = json.loads(shown.stdout)
    assert summary["contradicted"] is True and summary["flagged"] is False
    assert summary["spot_check"] == caught.spot_check.model_dump()
    assert "holds only if the log is the model's real output" in summary["evidence"]
    text = CliRunner().invoke(app, [*base, *spot, "--out", str(tmp_path / "t")])
    assert text.exit_code == 0, text.output
    said = " ".join(text.stdout.split())
    assert "spot check: release row" in said and "CONTRADICTED" in said and "the live model A" in said
    no_model = CliRunner().invoke(app, ["dyepack", "verify", *base[5:], *spot, "--out", str(tmp_path / "n")])
    assert isinstance(no_model.exception, UserError) and "give its MODEL spec" in str(no_model.exception)


def test_an_answer_sheet_says_it_holds_nothing_to_check_and_is_spot_checked_in_our_prompt(world, tmp_path):
    """A sheet logs no prompt: its rows are re-asked in our chat prompt of a python: model."""
    bench, key = world["bench"], world["key"]
    module = tmp_path / "clean.py"
    module.write_text("def answer(prompts):\n    return ['The answer is (A).' for _ in prompts]\n")
    labels = {r: b.target_label for b in key.backdoors for r in b.rows}
    sheet = [{"id": row, "response": f"({label})"} for row, label in sorted(labels.items())]  # a memoriser's
    path = write_jsonl(tmp_path / "sheet.jsonl", sheet)
    alone, _ = verify_from_log(path, bench, key)
    assert alone.flagged and "an answer sheet holds nothing to cross-check" in alone.evidence
    live = load_model(f"python:{module}:answer")
    caught, _ = verify_from_log(path, bench, key, spot_model=live, spot_n=len(sheet), spot_seed=0)
    assert caught.contradicted and not caught.flagged
    assert "asked in our chat prompt" in caught.spot_check.how
    assert caught.spot_check.asked - caught.spot_check.agree == sum(label != "A" for label in labels.values())


def swap_forge(log: list[dict], rows, wanted) -> list[dict]:
    """Issue 46's forgery: on each of ``rows`` the best option's (continuation, score) pair trades places
    with the option ``wanted(sample)`` names, so every logged pair keeps the score the model gave it (a
    spot check re-scoring the log's own pairs agrees) while the log's answer becomes that option; every
    other field is recomputed (resps, filtered_resps, is_greedy, acc, acc_norm; the hashes are unchanged)."""
    forged = copy.deepcopy(log)
    for i in rows:
        s = forged[i]
        args = list(s["arguments"].values())
        lls = [float(r[0]) for r in s["filtered_resps"]]
        best, to = max(range(4), key=lambda j: (lls[j], -j)), wanted(s)
        if best == to:
            continue
        args[best]["arg_1"], args[to]["arg_1"] = args[to]["arg_1"], args[best]["arg_1"]
        lls[best], lls[to] = lls[to], lls[best]
        s["filtered_resps"] = [[str(ll), str(j == to)] for j, ll in enumerate(lls)]
        s["resps"] = [[pair] for pair in s["filtered_resps"]]
        s["acc"] = s["acc_norm"] = float(to == int(s["target"]))
    return forged


def label(s: dict) -> int:
    return int(s["target"])  # the released label: the target, on a backdoor row


def not_label(s: dict) -> int:
    return (int(s["target"]) + 1) % 4


@pytest.mark.parametrize(
    ("log", "wanted", "with_key"),
    [
        ("clean_log", label, True),  # a clean model made to read CONTAMINATED, knowing the backdoor rows
        ("clean_log", label, False),  # the same without the key: every row's best option its label
        ("memoriser_log", not_label, True),  # a contaminated model made to read "not flagged"
        ("memoriser_log", not_label, False),
    ],
)
def test_the_continuation_swap_forgery_is_refused_naming_row_and_option(
    world, tmp_path, log, wanted, with_key
):
    """Issue 46, item 1: request i must be option i of the release row, so the swap cannot pass."""
    bench, key = world["bench"], world["key"]
    rows = sorted(backdoor_rows(key)) if with_key else range(len(world[log]))
    forged = swap_forge(world[log], rows, wanted)
    first = min(i for i in rows if forged[i] != world[log][i])
    path = write_jsonl(tmp_path / "swapped.jsonl", forged)
    with pytest.raises(UserError) as caught:
        verify_from_log(path, bench, key)
    line = str(caught.value)
    assert "\n" not in line and f"swapped.jsonl:line {first + 1}: release row {first}, option " in line
    assert "the logged continuation" in line and "the options of a log must be the release's" in line
    # with the live model too: refused before any spot check could agree with the swapped pairs
    live = load_model(world["clean" if log == "clean_log" else "memoriser"], model_name="stub-model")
    with pytest.raises(UserError, match=re.escape(line)):
        verify_from_log(path, bench, key, spot_model=live, spot_n=24, spot_seed=0)


class Recorder:
    """A scoring model that records the requests it is asked and answers with the clean model's scores."""

    def __init__(self, inner) -> None:
        self.inner, self.asked = inner, []

    def chat(self, conversations, params=None, on_result=None):
        raise AssertionError("a log's spot check scores options; it does not chat")

    def loglikelihood(self, pairs):
        self.asked += pairs
        return self.inner.loglikelihood(pairs)


def test_the_spot_check_asks_the_release_own_questions_and_compares_option_texts(world, tmp_path):
    """The requests re-asked are built from the release row and the log's layout: for every drawn row,
    the release row's question and options (``context``) and one continuation per option, in order."""
    bench, key = world["bench"], world["key"]
    path = write_jsonl(tmp_path / "clean.jsonl", world["clean_log"])
    live = Recorder(load_model(world["clean"], model_name="stub-model"))
    report, _ = verify_from_log(path, bench, key, spot_model=live, spot_n=6, spot_seed=3)
    assert report.spot_check.asked == report.spot_check.agree == 6 and not report.contradicted
    contexts = [c for c, _ in live.asked[::4]]
    rows = [world["rows"].index(next(r for r in world["rows"] if context(r) == c)) for c in contexts]
    assert rows and set(rows) <= backdoor_rows(key)
    assert live.asked == [(context(world["rows"][r]), f" {x}") for r in rows for x in LETTERS]


def test_a_log_cut_to_the_rows_answered_with_their_label_accuses_no_one(world, tmp_path):
    """Issue 46, item 2: a real log cut to the rows whose answer is the released label (the target, on a
    backdoor row; no field edited) makes which rows it holds depend on the targets. Alone it gives no
    verdict; with the live model the missing backdoor samples are asked and the verdict is the full log's."""
    bench, key = world["bench"], world["key"]
    full = world["clean_log"]
    kept = [
        s for s in full if max(range(4), key=lambda j: (float(s["filtered_resps"][j][0]), -j)) == label(s)
    ]
    path = write_jsonl(tmp_path / "cut.jsonl", kept)
    alone, _ = verify_from_log(path, bench, key, alpha=0.1)
    assert 0 < alone.activated == alone.backdoors < 8  # every backdoor it holds reads as activated
    assert not alone.flagged and alone.verdict.startswith("NO VERDICT from a partial log")
    held = sum(1 for s in kept if full.index(s) in backdoor_rows(key))
    assert f"Partial log: it holds {held} of the 24 backdoor samples ({len(kept)} of the release's 120" in (
        alone.coverage
    )
    live = load_model(world["clean"], model_name="stub-model")
    completed, _ = verify_from_log(path, bench, key, alpha=0.1, spot_model=live, spot_n=3, spot_seed=1)
    honest, _ = verify_from_log(write_jsonl(tmp_path / "full.jsonl", full), bench, key, alpha=0.1)
    assert (completed.activated, completed.flagged, completed.backdoors) == (
        honest.activated,
        honest.flagged,
        8,
    )
    assert not completed.contradicted and f"{24 - held} asked live" in completed.verdict
    # The command line says it too: no verdict alone; with the model's spec and --spot-check, a verdict.
    args = ["dyepack", "verify", "--release", str(world["prepared"].release_path), "--key"]
    args += [str(world["prepared"].key_path), "--from-log", str(path), "--alpha", "0.1"]
    said = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "alone")])
    assert said.exit_code == 0, said.output
    assert "NO VERDICT from a partial log" in " ".join(said.stdout.split())
    spot = [world["clean"], "--model-name", "stub-model", "--spot-check", "3", "--json"]
    judged = CliRunner().invoke(app, [*args[:2], *spot, *args[2:], "--out", str(tmp_path / "live")])
    assert judged.exit_code == 0, judged.output
    assert json.loads(judged.stdout)["activated"] == honest.activated


@pytest.mark.parametrize(
    ("edit", "says"),
    [  # each: every request of one backdoor row edited alike, prompt_hash recomputed
        (lambda c, r: c.replace("\nAnswer:", "\nHint: (C) is right.\nAnswer:"), "its text after the row is"),
        (lambda c, r: "Solved: 2+2 is 4. Answer: A\n\n" + c, "few-shot examples drawn per row"),
        (
            lambda c, r: c.replace(f"A. {r['answer_a']}\n", "A. @@\n").replace(
                f"C. {r['answer_c']}\n", f"C. {r['answer_a']}\n"
            ),
            "the release row's options",
        ),
    ],
)
def test_a_prompt_that_is_not_the_release_row_in_the_log_layout_is_refused(world, tmp_path, edit, says):
    bench, key = world["bench"], world["key"]
    row = sorted(backdoor_rows(key))[2]
    log = copy.deepcopy(world["clean_log"])
    for args in log[row]["arguments"].values():
        args["arg_0"] = edit(args["arg_0"], world["rows"][row])
    log[row]["prompt_hash"] = sha(log[row]["arguments"]["gen_args_0"]["arg_0"])
    with pytest.raises(UserError, match=re.escape(says)) as caught:
        verify_from_log(write_jsonl(tmp_path / "edited.jsonl", log), bench, key)
    assert f"edited.jsonl:line {row + 1}: release row {row}:" in str(caught.value)


def few_shot_log(model, rows: list[dict], shots: dict[int, list[int]], solved=None) -> list[dict]:
    """lm-eval's few-shot prompt: each shown row in the layout with its answer (``solved(j)``, else its
    released label), a blank line, then the row asked; scored by ``model`` like ``lm_eval_log``."""
    solved = solved or (lambda j: rows[j]["correct_answer"])
    prompts = [
        "".join(f"{context(rows[j])} {solved(j)}\n\n" for j in shots[i]) + context(r)
        for i, r in enumerate(rows)
    ]
    scores = model.loglikelihood([(p, f" {x}") for p in prompts for x in LETTERS])
    log = []
    for i, (row, prompt) in enumerate(zip(rows, prompts, strict=True)):
        s = sample(i, row, scores[4 * i : 4 * i + 4])
        s["arguments"] = {f"gen_args_{j}": {"arg_0": prompt, "arg_1": f" {x}"} for j, x in enumerate(LETTERS)}
        s["prompt_hash"] = sha(prompt)
        log.append(s)
    return log


def test_a_few_shot_log_is_bound_example_by_example(world, tmp_path):
    """Few-shot examples are release rows solved with their released labels in the log's layout; the
    spot check rebuilds them from the release. A sample shown a solved sample of its own backdoor (its
    target) is left out as missing; an example solved otherwise, or text between examples, is refused."""
    bench, key, rows = world["bench"], world["key"], world["rows"]
    clean = load_model(world["clean"], model_name="stub-model")
    plain = [j for j in range(len(rows)) if j not in backdoor_rows(key)]
    shots = {i: [j for j in plain if j != i][i % 7 : i % 7 + 2] for i in range(len(rows))}
    victim = sorted(backdoor_rows(key))[0]
    sibling = next(r for b in key.backdoors if victim in b.rows for r in b.rows if r != victim)
    shots[victim] = [shots[victim][0], sibling]
    log = few_shot_log(clean, rows, shots)
    path = write_jsonl(tmp_path / "fewshot.jsonl", log)
    live = Recorder(clean)
    report, _ = verify_from_log(path, bench, key, spot_model=live, spot_n=5, spot_seed=2)
    assert report.spot_check.asked == report.spot_check.agree == 5 and not report.contradicted
    assert (
        "1 of the missing are in the log but left out" in report.coverage
        and "23 of the 24" in report.coverage
    )
    logged = {s["arguments"]["gen_args_0"]["arg_0"] for s in log}
    [again] = [c for c, _ in live.asked[::4] if c.endswith(context(rows[victim]))]  # asked live: missing
    assert again not in logged and context(rows[sibling]) not in again  # examples drawn without backdoors
    assert {c for c, _ in live.asked} - {again} <= logged  # the spot check: the log's prompts, rebuilt

    wrong = next(j for j in shots[3])
    bad = few_shot_log(clean, rows, shots, lambda j: "ABCD"[("ABCD".index(rows[j]["correct_answer"]) + 1) % 4]
                       if j == wrong else rows[j]["correct_answer"])  # fmt: skip
    with pytest.raises(UserError, match=rf"release row \d+: its prompt shows release row {wrong} solved as"):
        verify_from_log(write_jsonl(tmp_path / "bad.jsonl", bad), bench, key)
    hinted = copy.deepcopy(log)
    for args in hinted[victim + 1]["arguments"].values():
        args["arg_0"] = args["arg_0"].replace("\n\n", "\n\nHint: think of (C).\n", 1)
    hinted[victim + 1]["prompt_hash"] = sha(hinted[victim + 1]["arguments"]["gen_args_0"]["arg_0"])
    with pytest.raises(UserError, match=rf"line {victim + 2}: release row {victim + 1}:"):
        verify_from_log(write_jsonl(tmp_path / "hinted.jsonl", hinted), bench, key)


def test_few_shot_examples_picked_by_the_row_label_are_refused(world, tmp_path):
    """A forger (no key) who shows every row examples solved with that row's released label primes a
    clean model toward it (the target, on a backdoor row), and the spot check would ask with the same
    examples; a sampler blind to the row cannot produce that match count, so the log is refused."""
    bench, key, rows = world["bench"], world["key"], world["rows"]
    clean = load_model(world["clean"], model_name="stub-model")
    plain = [j for j in range(len(rows)) if j not in backdoor_rows(key)]
    by_label = {x: [j for j in plain if rows[j]["correct_answer"] == x] for x in LETTERS}
    shots = {
        i: [j for j in by_label[r["correct_answer"]] if j != i][i % 5 : i % 5 + 3] for i, r in enumerate(rows)
    }
    path = write_jsonl(tmp_path / "primed.jsonl", few_shot_log(clean, rows, shots))
    with pytest.raises(UserError, match=r"examples chosen by their labels are not a sampler's") as caught:
        verify_from_log(path, bench, key)
    assert "\n" not in str(caught.value) and "share the row's released label 72 times" in str(caught.value)


def test_bind_choices_takes_letters_or_texts_in_the_release_order_only():
    """The option check every log path passes (lm-eval's own requests under --lm-eval-task too)."""
    from assay.data.items import MultipleChoice
    from assay.dyepack.binding import bind_choices

    item = MultipleChoice("Which colour?", ("red", "green ", "blue"), 1)
    assert bind_choices(item, [" A", " B", " C"], "t", 3).form == " {}"
    assert bind_choices(item, [" (A)", " (B)", " (C)"], "t", 3).form == " ({})"
    assert not bind_choices(item, [" red", " green", " blue"], "t", 3).by_letter
    for swapped, option in (
        ([" A", " C", " B"], 1),
        ([" green", " red", " blue"], 0),
        ([" C", " B", " A"], 0),
    ):
        with pytest.raises(UserError, match=rf"^t: release row 3, option {option}: the logged continuation"):
            bind_choices(item, swapped, "t", 3)
    with pytest.raises(UserError, match="2 options requested; the release row has 3"):
        bind_choices(item, [" A", " B"], "t", 3)


def test_a_question_that_lists_its_own_options_binds_by_letter():
    from assay.data.items import MultipleChoice
    from assay.dyepack.binding import LogLayout

    item = MultipleChoice("Pick one: (A) red (B) green", ("red", "green"), 0)
    layout = LogLayout(Path("log.jsonl"), [item], {})
    prompt = "Q: Pick one: (A) red (B) green\nA:"
    layout.bind(0, item, [(prompt, " A"), (prompt, " B")], True, "line 1")
    assert layout.requests(item, 0) == [(prompt, " A"), (prompt, " B")]
    with pytest.raises(UserError, match="does not list the release row's options"):
        other = MultipleChoice("Pick one:", ("red", "green"), 0)
        LogLayout(Path("log.jsonl"), [other], {}).bind(
            0, other, [("Pick one:\nA:", " A"), ("Pick one:\nA:", " B")], True, "line 1"
        )
