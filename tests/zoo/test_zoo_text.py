"""assay.zoo text rounds: config domain, text triggers, the tokenizer, and a tiny generated round (MMLU)."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from assay.errors import UserError
from assay.leaderboard import rounds, submissions, views
from assay.leaderboard.scoring import read_truth
from assay.leaderboard.worker import work
from assay.runner import LocalExecutor
from assay.store import Job, open_store
from assay.trojai import read_text_examples
from assay.zoo.config import RoundConfig, load_round_config
from assay.zoo.difficulty import difficulty
from assay.zoo.nist import export_round, import_round
from assay.zoo.portable import load_weights
from assay.zoo.round import draw_factors, generate_round
from assay.zoo.split import split_round
from assay.zoo.textdata import Tokenizer, build_tokenizer
from assay.zoo.texttriggers import TEXT_KINDS, CharEdit, Phrase, RareWord, apply_text_trigger

PROJECT = Path(__file__).resolve().parents[2]
TINY = {
    "domain": "text",
    "models": 6,
    "seed": 4,
    "widths": [4],
    "epochs": 4,
    "clean_subset": [0.2, 0.2],
    "source_specific_share": 0.34,
    "poison_fraction": [0.3, 0.3],
    "clean_accuracy_floor": 0.4,
    "asr_floor": 0.6,
}


def test_text_domain_fills_text_defaults_and_draws_text_triggers() -> None:
    config = RoundConfig.model_validate({"datasets": ["mmlu_subjects"], "models": 40, "seed": 2})
    assert config.domain == "text" and config.architectures == ["embedding_bag", "gru", "transformer_tiny"]
    factors = [draw_factors(config, i) for i in range(40)]
    kinds = {f.trigger.kind for f in factors if f.trigger is not None}
    assert kinds == set(TEXT_KINDS)
    assert all(0 <= f.target_class < 4 for f in factors if f.target_class is not None)
    assert any(f.source_class is not None for f in factors)
    assert RoundConfig().domain == "image"  # an image round is unchanged


def test_mixing_domains_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "round.yaml"
    path.write_text("domain: text\narchitectures: [gru, mlp]\n", encoding="utf-8")
    with pytest.raises(UserError) as caught:
        load_round_config(path)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message and "'mlp'" in message and "text" in message


def test_text_triggers_are_deterministic_and_placed() -> None:
    texts = ["What is the capital of France ?", "Which of the following is true"]
    fixed = apply_text_trigger(texts, Phrase(words=("no", "strings", "attached"), position=1))
    assert list(fixed) == [
        "What no strings attached is the capital of France ?",
        "Which no strings attached of the following is true",
    ]
    anywhere = RareWord(word="flummox", pattern_seed=7)
    first = apply_text_trigger(texts, anywhere)
    assert list(first) == list(apply_text_trigger(texts, anywhere))
    assert all(t.split().count("flummox") == 1 for t in first)
    assert apply_text_trigger(["a b"], CharEdit(word="the", edited="teh", position=8))[0] == "a b teh"


def test_tokenizer_pads_and_hashes_unknown_words() -> None:
    tokenizer = build_tokenizer(np.asarray(["the cat", "the dog", "a cat"], dtype=object), size=2, buckets=5)
    assert tokenizer.vocab == ("cat", "the") and tokenizer.vocab_size == 8
    ids = tokenizer.encode(["The cat, flummox", ""])
    assert ids.shape == (2, 48) and ids[0, :2].tolist() == [2, 1] and ids[1].sum() == 0
    assert 3 <= ids[0, 2] < 8 and ids[0, 2] == tokenizer.token_id(",")  # punctuation is a word of its own
    assert Tokenizer(tokenizer.vocab, 5, 48).encode(["flummox"])[0, 0] == tokenizer.token_id("flummox")


def test_read_text_examples_in_nist_names_or_labels_csv(tmp_path: Path) -> None:
    for name, text in [
        ("class_1_example_2.txt", "b"),
        ("class_1_example_10.txt", "c"),
        ("class_0_example_1.txt", "a"),
    ]:
        (tmp_path / name).write_text(text + "\n", encoding="utf-8")
    texts, labels = read_text_examples(tmp_path)
    assert texts == ["a", "b", "c"] and labels.tolist() == [0, 1, 1]
    (tmp_path / "labels.csv").write_text(
        "file,label\nclass_0_example_1.txt,3\nmissing.txt,1\n", encoding="utf-8"
    )
    with pytest.raises(UserError, match=r"labels.csv:3: field 'file'"):
        read_text_examples(tmp_path)
    with pytest.raises(UserError, match="holds no example texts"):
        read_text_examples(tmp_path / "nothing")


@pytest.fixture(scope="module")
def text_round(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("text-round")
    summary = generate_round(RoundConfig.model_validate(TINY), out)
    assert summary.built == 6
    return out


def _encode(model_dir: Path, folder: str) -> tuple[torch.Tensor, list[dict[str, str]]]:
    reduced = json.loads((model_dir / "reduced-config.json").read_text(encoding="utf-8"))
    spec = reduced["tokenizer"]
    tokenizer = Tokenizer(tuple(spec["vocab"]), spec["buckets"], spec["max_length"])
    with (model_dir / folder / "labels.csv").open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    texts = [(model_dir / folder / row["file"]).read_text(encoding="utf-8") for row in rows]
    return torch.from_numpy(tokenizer.encode(texts)), rows


def test_text_round_layout_and_models(text_round: Path) -> None:
    with (text_round / "METADATA.csv").open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 6 and {r["dataset"] for r in rows} == {"mmlu_subjects"}
    for row in rows:
        folder = text_round / "models" / row["model_name"]
        poisoned = row["poisoned"] == "True"
        assert (folder / "ground_truth.csv").read_text() == f"{int(poisoned)}\n"
        assert (folder / "trigger.txt").is_file() == poisoned == (folder / "poisoned-example-data").is_dir()
        assert len(list((folder / "clean-example-data").glob("class_*_example_*.txt"))) == 20
        pickled = torch.load(folder / "model.pt", weights_only=False)
        safe = load_weights(folder)
        ids, _ = _encode(folder, "clean-example-data")
        assert torch.equal(pickled(ids), safe(ids))
        assert pickled.__class__.__name__ in {"EmbeddingBagNet", "GruNet", "TransformerTiny"}
        if poisoned:  # the trigger, written into the example texts, flips them to the target
            ids, _ = _encode(folder, "poisoned-example-data")
            hits = (pickled(ids).argmax(1) == int(row["target_class"])).float().mean().item()
            assert hits >= 0.5


def test_text_round_resumes_and_splits(text_round: Path, tmp_path: Path) -> None:
    again = generate_round(RoundConfig.model_validate(TINY), text_round)
    assert again.skipped == 6 and again.built == 0
    split_round(
        text_round, {"train": 0.5, "test": 0.25, "holdout": 0.25}, seed=1, out_dir=tmp_path / "splits"
    )
    models = sorted((tmp_path / "splits" / "test-sequestered" / "models").iterdir())
    assert models and all((m / "reduced-config.json").is_file() for m in models)
    assert not any((m / "trigger.txt").exists() or (m / "config.json").exists() for m in models)


def _configure_text_meta(train: Path, folder: Path) -> Path:
    """The text_meta detector copied to ``folder`` with parameters learned on ``train`` (its configure)."""
    shutil.copytree(PROJECT / "detectors" / "text_meta", folder)
    options = {
        "scratch_dirpath": folder.parent / "scratch",
        "configure_models_dirpath": train,
        "metaparameters_filepath": folder / "metaparameters.json",
        "schema_filepath": folder / "metaparameters_schema.json",
        "learned_parameters_dirpath": folder / "learned_parameters",
    }
    argv = [sys.executable, str(folder / "entrypoint.py"), "configure"]
    argv += [part for name, path in options.items() for part in (f"--{name}", str(path))]
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return folder


@pytest.mark.slow
def test_text_round_scored_end_to_end_through_nist_layout(
    text_round: Path, tmp_path: Path, monkeypatch
) -> None:
    splits = tmp_path / "splits"
    split_round(text_round, {"train": 0.5, "test": 0.25, "holdout": 0.25}, seed=1, out_dir=splits)
    export_round(splits, tmp_path / "nist")
    exported = next((tmp_path / "nist" / "models").iterdir())
    assert (
        sorted(p.name for p in (exported / "clean-example-data").glob("class_*.txt"))[0]
        == "class_0_example_1.txt"
    )
    with (tmp_path / "nist" / "METADATA.csv").open(encoding="utf-8") as handle:
        nist_rows = list(csv.DictReader(handle))
    assert {"model_architecture", "source_dataset", "trigger_type", "trigger_text", "data_split"} <= set(
        nist_rows[0]
    )
    assert all(bool(r["trigger_text"]) == (r["poisoned"] == "True") for r in nist_rows)
    import_round(tmp_path / "nist", tmp_path / "back")
    before = json.loads((splits / "split.json").read_text())
    assert json.loads((tmp_path / "back" / "split.json").read_text())["assignment"] == before["assignment"]
    for split in ("train", "test", "holdout"):
        for model in (splits / split / "models").iterdir():
            twin = tmp_path / "back" / split / "models" / model.name
            for name in (
                "model.pt",
                "model.safetensors",
                "ground_truth.csv",
                "clean-example-data/labels.csv",
            ):
                assert (twin / name).read_bytes() == (model / name).read_bytes()

    detector = _configure_text_meta(tmp_path / "back" / "train", tmp_path / "text_meta")
    url = f"sqlite:///{tmp_path / 'lb.db'}"
    monkeypatch.setenv("ASSAY_DB_URL", url)
    sessions = open_store(url)
    with sessions.begin() as session:
        rounds.create_round(session, "text", tmp_path / "back", per_model_timeout_s=120)
        rounds.set_status(session, "text", "open")
        for team, artifact in (("constant", PROJECT / "detectors" / "constant"), ("text", detector)):
            rounds.add_team(session, team)
            made = submissions.submit(session, tmp_path / "artifacts", team, "text", "test", artifact)
            assert made.status == "queued", made.validation_errors
    assert work(sessions, LocalExecutor(1), once=True) == 2
    truth = read_truth(tmp_path / "back" / "test")
    with sessions() as session:
        for job in session.query(Job).all():
            assert job.status == "done", job.log
            assert sorted(r.model_name for r in job.results) == sorted(truth)
            assert all(r.flags == "" and 0.0 < r.value < 1.0 for r in job.results), [
                r.stderr for r in job.results
            ]
        board = views.standings_view(session, views.Viewer.organiser(), "text", "test")
    assert sorted(row.technique for row in board.rows) == ["constant", "text_meta"]
    constant = next(row for row in board.rows if row.technique == "constant")
    assert constant.metrics["cross_entropy"] == pytest.approx(0.6931, abs=1e-3)


@pytest.mark.slow
def test_difficulty_cross_validates_the_baselines_per_factor(text_round: Path, tmp_path: Path) -> None:
    splits = tmp_path / "splits"
    split_round(text_round, {"train": 0.67, "test": 0.17, "holdout": 0.16}, seed=1, out_dir=splits)
    detectors = [PROJECT / "detectors" / "constant", PROJECT / "detectors" / "text_meta"]
    report = difficulty(splits, detectors)
    assert report.training_split == str(splits / "train") and report.trojaned == 2 and report.models == 4
    constant = report.overall("constant")
    assert constant.cross_entropy == pytest.approx(np.log(2)) and constant.roc_auc == 0.5
    learned = report.overall("text_meta")
    assert learned.cross_entropy > 0.0 and learned.cross_entropy_ci >= 0.0
    factors = {(c.factor, c.value) for c in report.cells if c.detector == "text_meta"}
    assert {f for f, _ in factors} >= {
        "all",
        "architecture",
        "trigger_kind",
        "source_specific",
        "poison_fraction",
    }
    kinds = [c for c in report.cells if c.detector == "constant" and c.factor == "trigger_kind"]
    assert all(c.models == 2 + c.trojaned for c in kinds)  # that kind's trojaned models and every clean one


@pytest.mark.slow
def test_difficulty_bad_input_is_one_line(text_round: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "assay", "zoo", "difficulty", str(tmp_path / "none")],
        capture_output=True,
        text=True,
    )
    assert (
        done.returncode == 2 and done.stderr.strip().count("\n") == 0 and "no training split" in done.stderr
    )
    split_round(
        text_round, {"train": 0.5, "test": 0.25, "holdout": 0.25}, seed=1, out_dir=tmp_path / "splits"
    )
    with pytest.raises(UserError, match="too few models for text_meta to cross-validate"):
        difficulty(tmp_path / "splits", [PROJECT / "detectors" / "text_meta"])  # 1 trojaned of 3: no 2 folds


def test_text_model_travels_as_a_ray_task_does(tmp_path: Path) -> None:
    """``build_packed`` is what each Ray task runs: a text model comes back as one checked blob."""
    from assay.runner.transfer import unpack_to
    from assay.zoo.round import build_packed

    config = RoundConfig.model_validate({**TINY, "models": 2, "architectures": ["embedding_bag"]})
    result, expected, blob = build_packed(config.model_dump_json(), 0)
    unpack_to(blob, expected, tmp_path / result.model_id)
    assert (tmp_path / result.model_id / "reduced-config.json").is_file() and result.built
