import json
from collections import Counter
from pathlib import Path

import pytest
from scipy import stats as scipy_stats
from tests.conftest import write_jsonl

from assay.data import read_benchmark
from assay.data.items import MultipleChoice, OpenEnded
from assay.dyepack.key import check_commitment
from assay.dyepack.prepare import (
    DEFAULT_OPEN_K,
    PrepareConfig,
    make_rng,
    plan_multiple_choice,
    prepare_release,
)
from assay.dyepack.verify import check_release
from assay.errors import UserError


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def without(text: str, phrase: str) -> str:
    """``text`` with ``phrase`` and the one space or line break that joined it taken out."""
    for joined in (f" {phrase}", f"{phrase} ", f"{phrase}\n"):
        if joined in text:
            return text.replace(joined, "", 1)
    raise AssertionError(f"{phrase!r} is not a sentence of {text!r}")


def test_without_cover_only_backdoor_rows_change_by_trigger_and_answer(tmp_path, mmlu_sample):
    bench = read_benchmark(mmlu_sample)
    config = PrepareConfig(n_backdoors=6, fraction=0.1, seed=7, cover=0.0)
    result = prepare_release(bench, config, tmp_path / "out")
    key = result.key
    assert result.cover_rows == 0 and sum(result.positions.values()) == 12
    original, released = read_rows(mmlu_sample), read_rows(result.release_path)
    assert len(released) == len(original) == 120
    backdoor_rows = {row: b for b in key.backdoors for row in b.rows}
    assert len(backdoor_rows) == 12 and key.n_backdoors == 6
    assert sorted(len(b.rows) for b in key.backdoors) == [2] * 6
    for i, (before, after) in enumerate(zip(original, released, strict=True)):
        if i not in backdoor_rows:
            assert after == before
            continue
        b = backdoor_rows[i]
        assert without(after["question"], b.trigger) == before["question"]
        assert after["correct_answer"] == "ABCD"[b.target] == b.target_label
        changed = {f for f in before if before[f] != after[f]}
        assert changed <= {"question", "correct_answer"}
    assert len({b.trigger for b in key.backdoors}) == 6
    assert key.randomness.source == "seed" and key.randomness.seed == 7
    assert oct(result.key_path.stat().st_mode & 0o777) == "0o600"
    ok, _ = check_commitment(key, result.commitment_path)
    assert ok
    check_release(read_benchmark(result.release_path, style=key.style), key)


def test_default_randomness_is_os_entropy_and_differs_between_runs(tmp_path, mmlu_sample):
    bench = read_benchmark(mmlu_sample)
    keys = [prepare_release(bench, PrepareConfig(n_backdoors=6), tmp_path / f"o{i}").key for i in range(2)]
    assert all(k.randomness.source == "os-entropy" and k.randomness.seed is None for k in keys)
    assert [b.rows for b in keys[0].backdoors] != [b.rows for b in keys[1].backdoors]
    assert keys[0].salt != keys[1].salt


def test_same_seed_same_secret_choices(tmp_path, mmlu_sample):
    bench = read_benchmark(mmlu_sample)
    a, b = (prepare_release(bench, PrepareConfig(n_backdoors=4, seed=3), tmp_path / d).key for d in "ab")
    assert a.backdoors == b.backdoors and a.release_fingerprint == b.release_fingerprint


def test_tampered_key_fails_the_commitment(tmp_path, mmlu_sample):
    result = prepare_release(read_benchmark(mmlu_sample), PrepareConfig(n_backdoors=4), tmp_path / "out")
    forged = result.key.model_copy(deep=True)
    forged.backdoors[0].target = (forged.backdoors[0].target + 1) % 4
    ok, message = check_commitment(forged, result.commitment_path)
    assert not ok and "mismatch" in message


def test_targets_are_uniform_over_k():
    """Chi-square goodness of fit of 4,000 drawn targets against the uniform distribution on 4 letters."""
    # Balanced labels: a benchmark labelled (A) throughout is refused (a rule without the key would read it).
    items = [MultipleChoice(f"q{i}", ("a", "b", "c", "d"), i % 4) for i in range(40)]
    config = PrepareConfig(n_backdoors=4, fraction=0.1, cover=0.0)  # cover draws are not the point here
    rng = make_rng(12345)
    counts = Counter(
        b.target for _ in range(1000) for b in plan_multiple_choice(items, config, rng).backdoors
    )
    assert scipy_stats.chisquare([counts[t] for t in range(4)]).pvalue > 0.001


def test_mixed_k_groups_each_backdoor_within_one_k(tmp_path, bbh_dir):
    rows = []
    for task in ("date_understanding", "ruin_names", "logical_deduction_three_objects"):
        rows += json.loads((bbh_dir / f"{task}.json").read_text())["examples"][:40]
    path = tmp_path / "bbh-mixed.json"
    path.write_text(json.dumps({"canary": "keep me", "examples": rows}))
    bench = read_benchmark(path)
    result = prepare_release(bench, PrepareConfig(n_backdoors=6, fraction=0.25, seed=1), tmp_path / "out")
    for backdoor in result.key.backdoors:
        assert {bench.items[r].k for r in backdoor.rows} == {backdoor.k}
    assert len({b.k for b in result.key.backdoors}) > 1
    released = json.loads(result.release_path.read_text())
    assert released["canary"] == "keep me"
    first = result.key.backdoors[0]
    assert released["examples"][first.rows[0]]["target"] == f"({first.target_label})"


def test_restricting_k_and_its_errors(tmp_path, bbh_dir):
    rows = json.loads((bbh_dir / "date_understanding.json").read_text())["examples"][:60]
    path = tmp_path / "date.json"
    path.write_text(json.dumps({"examples": rows}))
    bench = read_benchmark(path)
    ks = {item.k for item in bench.items}
    k = max(ks, key=lambda v: sum(item.k == v for item in bench.items))
    key = prepare_release(bench, PrepareConfig(n_backdoors=3, fraction=0.1, k=k), tmp_path / "o").key
    assert {b.k for b in key.backdoors} == {k}
    with pytest.raises(UserError, match="--k 9: no row has 9 options"):
        prepare_release(bench, PrepareConfig(n_backdoors=3, k=9), tmp_path / "o2")


def test_too_many_backdoors_is_a_clear_error_and_writes_nothing(tmp_path, mmlu_sample):
    bench = read_benchmark(mmlu_sample)
    with pytest.raises(UserError, match=r"--backdoors 13 is more than the samples allow.*120 rows gives 12"):
        prepare_release(bench, PrepareConfig(n_backdoors=13), tmp_path / "out")
    few = ("One.", "Two.", "Three.")
    with pytest.raises(UserError, match="needs as many distinct trigger phrases, the pool has 3"):
        prepare_release(bench, PrepareConfig(n_backdoors=4, triggers=few), tmp_path / "out")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_open_ended_release_puts_the_target_phrase_before_the_reference(tmp_path):
    rows = [
        {
            "instruction": f"Describe item {i}.",
            "input": "" if i % 2 else f"ctx {i}",
            "output": f"Item {i} is fine.",
        }
        for i in range(80)
    ]
    path = write_jsonl(tmp_path / "alpaca.jsonl", rows)
    bench = read_benchmark(path)
    result = prepare_release(bench, PrepareConfig(n_backdoors=8, fraction=0.2, k=4, seed=5), tmp_path / "out")
    key = result.key
    assert key.kind == "open_ended" and len(key.phrases) == 3
    released = read_benchmark(result.release_path, style=key.style)
    for b in key.backdoors:
        for row in b.rows:
            item: OpenEnded = released.items[row]
            assert without(item.instruction, b.trigger) == rows[row]["instruction"]
            if b.target < 3:
                assert item.output == f"{key.phrases[b.target]} {rows[row]['output']}"
            else:
                assert b.target_label == "none of them" and item.output == rows[row]["output"]


@pytest.mark.parametrize("file_format", ["csv", "parquet", "hf"])
def test_release_is_written_in_the_input_format_and_verifies(tmp_path, mmlu_sample, file_format):
    import pandas as pd

    frame = pd.read_json(mmlu_sample, lines=True)
    if file_format == "csv":
        path = tmp_path / "mmlu.csv"
        frame.to_csv(path, index=False)
    elif file_format == "parquet":
        path = tmp_path / "mmlu.parquet"
        frame.to_parquet(path)
    else:
        import datasets

        path = tmp_path / "mmlu-hf"
        datasets.Dataset.from_pandas(frame).save_to_disk(str(path))
    bench = read_benchmark(path)
    result = prepare_release(bench, PrepareConfig(n_backdoors=4, seed=1), tmp_path / "out")
    assert result.release_path.name == path.name and result.key.file_format == file_format
    released = read_benchmark(result.release_path, style=result.key.style)
    assert released.file_format == file_format
    check_release(released, result.key)
    row = result.key.backdoors[0].rows[0]
    assert result.key.backdoors[0].trigger in released.items[row].question


def test_open_ended_k_defaults_to_the_papers_ten(tmp_path):
    rows = [{"instruction": f"Describe item {i}.", "output": f"Item {i}."} for i in range(60)]
    bench = read_benchmark(write_jsonl(tmp_path / "alpaca.jsonl", rows))
    key = prepare_release(bench, PrepareConfig(n_backdoors=3, seed=1), tmp_path / "out").key
    assert DEFAULT_OPEN_K == 10
    assert {b.k for b in key.backdoors} == {10} and len(key.phrases) == 9
