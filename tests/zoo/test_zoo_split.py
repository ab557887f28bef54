"""assay zoo split: stratified, reproducible, disjoint splits and a sequestered view that leaks nothing."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from assay.errors import UserError
from assay.zoo.split import STRATA_COLUMNS, assign_splits, split_round

ZOO = [sys.executable, "-m", "assay", "zoo"]
SPLIT_NAMES = ("train", "test", "holdout")


def _names(folder: Path) -> set[str]:
    return {p.name for p in (folder / "models").iterdir()}


def _metadata(folder: Path) -> list[dict[str, str]]:
    with (folder / "METADATA.csv").open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_splits_are_disjoint_complete_and_recorded(small_round: Path) -> None:
    splits = small_round / "splits"
    everything = _names(small_round)
    members = {name: _names(splits / name) for name in SPLIT_NAMES}
    assert set().union(*members.values()) == everything
    assert sum(len(m) for m in members.values()) == len(everything) == 20
    assert {name: len(m) for name, m in members.items()} == {"train": 10, "test": 5, "holdout": 5}
    record = json.loads((splits / "split.json").read_text())
    assert record["seed"] == 3 and record["strata_columns"] == list(STRATA_COLUMNS)
    assert {m for m, s in record["assignment"].items() if s == "test"} == members["test"]
    for name, models in members.items():
        rows = _metadata(splits / name)
        assert {r["model_name"] for r in rows} == models
        assert sum(r["poisoned"] == "True" for r in rows) == record["poisoned"][name]
        # 10 poisoned of 20: each split gets half poisoned, to within one model
        assert abs(record["poisoned"][name] - len(models) / 2) <= 1


def test_sequestered_view_holds_only_what_a_detector_may_see(small_round: Path) -> None:
    splits = small_round / "splits"
    for name in ("test", "holdout"):
        view = splits / f"{name}-sequestered"
        assert _names(view) == _names(splits / name)
        assert sorted(p.name for p in view.iterdir()) == ["models"]  # no METADATA, no ground truth
        for model in (view / "models").iterdir():
            assert sorted(p.name for p in model.iterdir()) == [
                "clean-example-data",
                "model.pt",
                "model.safetensors",
                "reduced-config.json",
            ]
            original = small_round / "models" / model.name
            assert (model / "model.pt").read_bytes() == (original / "model.pt").read_bytes()
            reduced = json.loads((model / "reduced-config.json").read_text())
            assert set(reduced) == {"architecture", "width", "input_shape", "num_classes"}
        leaked = [
            p
            for p in view.rglob("*")
            if p.name in {"ground_truth.csv", "config.json", "trigger.png", "METADATA.csv"}
            or p.name == "poisoned-example-data"
        ]
        assert leaked == []
    assert not (splits / "train-sequestered").exists()


def test_train_split_is_a_full_round(small_round: Path) -> None:
    train = small_round / "splits" / "train"
    for model in (train / "models").iterdir():
        truth = (model / "ground_truth.csv").read_text()
        assert truth == (small_round / "models" / model.name / "ground_truth.csv").read_text()
        assert (model / "config.json").is_file()


def test_same_seed_same_split_other_seed_differs(small_round: Path, tmp_path: Path) -> None:
    fractions = {"train": 0.5, "test": 0.25, "holdout": 0.25}
    again = split_round(small_round, fractions, seed=3, out_dir=tmp_path / "again")
    record = json.loads((small_round / "splits" / "split.json").read_text())
    assert again.assignment == record["assignment"]
    other = split_round(small_round, fractions, seed=4, out_dir=tmp_path / "other")
    assert other.assignment != again.assignment
    assert other.counts == again.counts


def _rows(groups: list[tuple[bool, str, str]]) -> list[dict[str, str]]:
    return [
        {
            "model_name": f"id-{i:08d}",
            "poisoned": str(p),
            "dataset": "digits",
            "architecture": a,
            "trigger_kind": k,
        }
        for i, (p, a, k) in enumerate(groups)
    ]


@settings(max_examples=60, deadline=None)
@given(
    groups=st.lists(
        st.tuples(st.booleans(), st.sampled_from(["mlp", "cnn"]), st.sampled_from(["", "blend", "warp"])),
        min_size=1,
        max_size=80,
    ),
    seed=st.integers(0, 2**32 - 1),
    test=st.sampled_from([0.2, 0.3, 0.25]),
)
def test_assignment_is_stratified(groups: list[tuple[bool, str, str]], seed: int, test: float) -> None:
    fractions = {"train": 1 - 2 * test, "test": test, "holdout": test}
    rows = _rows(groups)
    assignment = assign_splits(rows, fractions, seed)
    assert set(assignment) == {r["model_name"] for r in rows}
    totals = Counter(assignment.values())
    for name, share in fractions.items():
        assert abs(totals[name] - share * len(rows)) < 1  # the round as a whole, to within one model
    for poisoned in (True, False):
        group = [r["model_name"] for r in rows if r["poisoned"] == str(poisoned)]
        counts = Counter(assignment[m] for m in group)
        for name, share in fractions.items():
            assert abs(counts[name] - share * len(group)) < 2  # a contiguous run: within +-1 of each end


def test_bad_fractions_and_existing_output(small_round: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="add up to 1"):
        split_round(small_round, {"train": 0.5, "test": 0.3, "holdout": 0.3}, out_dir=tmp_path / "x")
    with pytest.raises(UserError, match=r"--test must be a share"):
        split_round(small_round, {"train": 0.5, "test": -0.1, "holdout": 0.6}, out_dir=tmp_path / "x")
    with pytest.raises(UserError, match="already exists"):
        split_round(small_round, {"train": 0.5, "test": 0.25, "holdout": 0.25})
    with pytest.raises(UserError, match=r"METADATA\.csv"):
        split_round(tmp_path, {"train": 0.5, "test": 0.25, "holdout": 0.25})
    assert not (tmp_path / "x").exists()


def test_cli_split_json_and_exit_code(small_round: Path, tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = tmp_path / "cli"
    args = [*ZOO, "split", str(small_round), "--train", "0.5", "--test", "0.25", "--holdout", "0.25"]
    done = subprocess.run(
        [*args, "--seed", "3", "--out", str(out), "--json"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["counts"] == {"train": 10, "test": 5, "holdout": 5}
    bad = subprocess.run(
        [*args[:-1], "0.9", "--out", str(tmp_path / "bad")], capture_output=True, text=True, env=env
    )
    assert bad.returncode == 2
    assert "add up to 1" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "bad").exists()
