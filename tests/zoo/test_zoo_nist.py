"""NIST's round layout: import (split given or not, bad input), `assay zoo split` on NIST columns, the example
reader on jpg + json, export read by a NIST-style reader without assay, and a leaderboard job on an import."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from assay.errors import UserError
from assay.leaderboard import rounds, submissions
from assay.leaderboard.scoring import read_truth
from assay.leaderboard.worker import work
from assay.runner import LocalExecutor
from assay.store import Job, open_store
from assay.trojai import load_model, read_examples
from assay.zoo.nist import export_round, import_round
from assay.zoo.split import read_metadata, split_round

PROJECT = Path(__file__).resolve().parents[2]
ZOO = [sys.executable, "-m", "assay", "zoo"]
SIZE = 12  # pixels: NIST's images are larger; the layout is what is under test
CLASSES = 4
# 12 models: poisoned, architecture and split per model (NIST's METADATA.csv spells poisoned True/False).
POISONED = [True, False] * 6
ARCHITECTURES = ["resnet18", "resnet18", "vit_b_16", "vit_b_16"] * 3
SPLIT = ["train"] * 6 + ["test"] * 3 + ["holdout"] * 3
SPLIT[5], SPLIT[6] = "test", "train"  # every split holds poisoned and clean models


def model_name(i: int) -> str:
    return f"id-{i:08d}"


def _example_image(rng: np.random.Generator) -> Image.Image:
    return Image.fromarray(rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8), "RGB")


def write_examples(folder: Path, rng: np.random.Generator, count: int, suffix: str = ".jpg") -> None:
    """NIST's example layout: N.jpg (RGB) beside N.json holding the bare class number."""
    folder.mkdir()
    for i in range(count):
        number = int(rng.integers(1, 3000))  # NIST's example numbers are arbitrary
        while (folder / f"{number}.json").exists():
            number += 1
        _example_image(rng).save(folder / f"{number}{suffix}", quality=95)
        (folder / f"{number}.json").write_text(json.dumps(i % CLASSES))


def write_nist_model(folder: Path, i: int, rng: np.random.Generator) -> None:
    """One model folder as NIST publishes it: a tiny whole-module model.pt (torch's own layers only)."""
    folder.mkdir(parents=True)
    torch.manual_seed(i)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * SIZE * SIZE, CLASSES))
    torch.save(model, folder / "model.pt")
    state = {"master_seed": 1000 + i, "model_architecture": ARCHITECTURES[i], "poisoned": POISONED[i]}
    config = {"py/object": "round_config.RoundConfig", "py/state": state}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    reduced = {"model_architecture": ARCHITECTURES[i], "source_dataset": "cityscapes"}
    (folder / "reduced-config.json").write_text(json.dumps(reduced, indent=2))
    (folder / "ground_truth.csv").write_text(str(int(POISONED[i])))  # NIST: "1", no newline
    write_examples(folder / "clean-example-data", rng, 2 * CLASSES)
    if POISONED[i]:
        write_examples(folder / "poisoned-example-data", rng, 2)


def nist_round(root: Path, split_column: bool = True, models: Sequence[int] = range(12)) -> Path:
    """A NIST-layout round: METADATA.csv with NIST's columns (a pandas index too), models/id-*/."""
    rng = np.random.default_rng(7)
    root.mkdir(parents=True)
    columns = ["", "model_name", "converged", "master_seed", "task_type", "source_dataset"]
    columns += ["model_architecture", "poisoned", "number_classes"] + (["data_split"] if split_column else [])
    with (root / "METADATA.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        for i in models:
            row = [i, model_name(i), True, 1000 + i, "classification", "cityscapes"]
            row += [ARCHITECTURES[i], POISONED[i], CLASSES] + ([SPLIT[i]] if split_column else [])
            writer.writerow(row)
            write_nist_model(root / "models" / model_name(i), i, rng)
    (root / "METADATA_DICTIONARY.csv").write_text("Column Name,Explanation,Data Type\nmodel_name,id,string\n")
    return root


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


# --- the example reader ---------------------------------------------------------------------------------


def test_read_examples_reads_nist_jpg_and_png_with_json_labels(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    folder = tmp_path / "examples"
    folder.mkdir()
    expected = {}
    for number, suffix in ((10, ".jpg"), (2, ".png"), (33, ".jpg")):
        image = _example_image(rng)
        image.save(folder / f"{number}{suffix}", quality=95)
        (folder / f"{number}.json").write_text(json.dumps(number % CLASSES))
        with Image.open(folder / f"{number}{suffix}") as saved:
            rgb = np.asarray(saved.convert("RGB"), dtype=np.float64)
        # ITU-R 601-2 luma, computed here independently of PIL's convert("L")
        expected[number] = (rgb @ np.array([0.299, 0.587, 0.114])) / 255.0
    images, labels = read_examples(folder)
    assert images.dtype == np.float32 and images.shape == (3, SIZE, SIZE)
    assert labels.dtype == np.int64 and labels.tolist() == [2, 2, 1]  # number order: 2, 10, 33
    for image, number in zip(images, (2, 10, 33), strict=True):
        assert np.abs(image - expected[number]).max() <= 1 / 255 + 1e-6
    assert images.min() >= 0.0 and images.max() <= 1.0
    # labels.csv (our layout) wins when a folder holds both
    Image.fromarray(np.full((4, 4), 255, dtype=np.uint8)).save(folder / "ours.png")
    (folder / "labels.csv").write_text("file,label\nours.png,3\n")
    ours, label = read_examples(folder)
    assert ours.shape == (1, 4, 4) and label.tolist() == [3] and ours.max() == 1.0


@pytest.mark.parametrize(
    ("label", "message"),
    [
        (None, r"7\.json: not found; in NIST's layout each image N\.jpg has its label in N\.json"),
        ('"cat"', r"7\.json:1: field 'label' is not a class number .* \(value: 'cat'\)"),
        ("-1", r"7\.json:1: field 'label' is not a class number .* \(value: -1\)"),
        ("{oops", r"7\.json:1: the example label is not valid JSON"),
    ],
)
def test_read_examples_nist_errors_name_the_file(tmp_path: Path, label: str | None, message: str) -> None:
    folder = tmp_path / "examples"
    folder.mkdir()
    _example_image(np.random.default_rng(0)).save(folder / "7.jpg")
    if label is not None:
        (folder / "7.json").write_text(label)
    with pytest.raises(UserError, match=message) as info:
        read_examples(folder)
    assert "\n" not in str(info.value)


def test_read_examples_unreadable_or_mismatched_nist_images(tmp_path: Path) -> None:
    folder = tmp_path / "examples"
    folder.mkdir()
    (folder / "1.jpg").write_bytes(b"not a jpeg")
    (folder / "1.json").write_text("0")
    with pytest.raises(UserError, match=r"1\.jpg: not a readable image"):
        read_examples(folder)
    _example_image(np.random.default_rng(0)).save(folder / "1.jpg")
    Image.new("RGB", (5, 5)).save(folder / "2.jpg")
    (folder / "2.json").write_text("1")
    with pytest.raises(UserError, match=r"2\.jpg: the image is \(5, 5\), unlike the first image"):
        read_examples(folder)
    with pytest.raises(UserError, match=r"labels\.csv: not found; .* or NIST's N\.jpg"):
        read_examples(tmp_path)


# --- import ---------------------------------------------------------------------------------------------


def test_import_with_a_split_column_is_a_leaderboard_round(tmp_path: Path) -> None:
    source = nist_round(tmp_path / "nist")
    summary = import_round(source, tmp_path / "imported")
    out = tmp_path / "imported"
    assert summary.split and summary.assignment_from.endswith("/METADATA.csv") and summary.unlisted == []
    assert summary.counts == {"train": 6, "test": 3, "holdout": 3} and summary.poisoned == 6
    record = json.loads((out / "split.json").read_text())
    assert record["assignment"] == {model_name(i): SPLIT[i] for i in range(12)}
    assert record["seed"] is None and record["counts"] == summary.counts
    for split in ("train", "test", "holdout"):
        rows = read_metadata(out / split)
        assert [r["model_name"] for r in rows] == [model_name(i) for i in range(12) if SPLIT[i] == split]
        assert {r["poisoned"] for r in rows} == {"True", "False"}
        assert "" not in rows[0] and rows[0]["model_architecture"] in ARCHITECTURES  # NIST's columns kept
        truth = read_truth(out / split)
        assert truth == {r["model_name"]: int(r["poisoned"] == "True") for r in rows}
        assert (out / split / "METADATA_DICTIONARY.csv").is_file()
    for model in (out / "test-sequestered" / "models").iterdir():
        assert sorted(p.name for p in model.iterdir()) == [
            "clean-example-data",
            "model.pt",
            "reduced-config.json",
        ]
        original = source / "models" / model.name
        assert (model / "model.pt").read_bytes() == (original / "model.pt").read_bytes()
        images, labels = read_examples(model / "clean-example-data")
        assert images.shape == (8, SIZE, SIZE) and sorted(labels.tolist()) == sorted(list(range(4)) * 2)
    assert (out / "train" / "models" / model_name(0) / "ground_truth.csv").read_text() == "1\n"
    assert (out / "train" / "models" / model_name(0) / "poisoned-example-data").is_dir()
    sessions = open_store(f"sqlite:///{tmp_path / 'lb.db'}")
    with sessions.begin() as session:
        made = rounds.create_round(session, "nist", out)
        sizes = {s.name: len(rounds.split_models(s)) for s in made.splits}
    assert sizes == {"train": 6, "test": 3, "holdout": 3, "smoke": 4}
    assert _leftovers(tmp_path) == []


def test_import_without_assignment_then_zoo_split(tmp_path: Path) -> None:
    source = nist_round(tmp_path / "nist", split_column=False)
    summary = import_round(source, tmp_path / "round")
    assert not summary.split and summary.counts == {"round": 12}
    split = split_round(tmp_path / "round", {"train": 0.5, "test": 0.25, "holdout": 0.25}, seed=3)
    assert split.counts == {"train": 6, "test": 3, "holdout": 3}
    assert split.poisoned == {"train": 3, "test": 1, "holdout": 2} or split.poisoned == {
        "train": 3,
        "test": 2,
        "holdout": 1,
    }
    record = json.loads((tmp_path / "round" / "splits" / "split.json").read_text())
    assert record["strata_columns"] == ["poisoned", "source_dataset", "model_architecture"]
    # the raw NIST folder splits the same way: import only normalises, it decides nothing
    raw = split_round(source, {"train": 0.5, "test": 0.25, "holdout": 0.25}, seed=3, out_dir=tmp_path / "raw")
    assert raw.assignment == split.assignment


def test_ground_truth_from_either_the_column_or_the_file(tmp_path: Path) -> None:
    source = nist_round(tmp_path / "nist", split_column=False)
    (source / "models" / model_name(2) / "ground_truth.csv").unlink()  # the column still says True
    (source / "models" / model_name(3) / "ground_truth.csv").write_text("0.0\n")  # NIST's float spelling
    import_round(source, tmp_path / "a")
    assert (tmp_path / "a" / "models" / model_name(2) / "ground_truth.csv").read_text() == "1\n"
    assert (tmp_path / "a" / "models" / model_name(3) / "ground_truth.csv").read_text() == "0\n"
    # no poisoned column at all: ground_truth.csv decides, and the column is written for `assay zoo split`
    (source / "models" / model_name(2) / "ground_truth.csv").write_text("1")
    lines = (source / "METADATA.csv").read_text().splitlines()
    (source / "METADATA.csv").write_text("\n".join(",".join(line.split(",")[:7]) for line in lines) + "\n")
    import_round(source, tmp_path / "b")
    rows = read_metadata(tmp_path / "b")
    assert list(rows[0])[:3] == ["model_name", "poisoned", "converged"]
    assert [r["poisoned"] == "True" for r in rows] == POISONED


def test_zoo_split_needs_only_the_ground_truth(tmp_path: Path) -> None:
    source = nist_round(tmp_path / "nist", split_column=False)
    table = (source / "METADATA.csv").read_text().splitlines()
    fractions = {"train": 0.5, "test": 0.25, "holdout": 0.25}
    # NIST's summary column ground_truth (1.0/0.0) in place of poisoned, no other strata: split by it alone
    rows = [line.split(",") for line in table]
    keep = [rows[0].index(c) for c in ("model_name", "poisoned")]
    lines = ["model_name,ground_truth"]
    lines += [f"{r[keep[0]]},{1.0 if r[keep[1]] == 'True' else 0.0}" for r in rows[1:]]
    (source / "METADATA.csv").write_text("\n".join(lines) + "\n")
    summary = split_round(source, fractions, seed=1, out_dir=tmp_path / "a")
    assert summary.poisoned["train"] == 3 and sum(summary.poisoned.values()) == 6
    assert json.loads((tmp_path / "a" / "split.json").read_text())["strata_columns"] == ["ground_truth"]
    (source / "METADATA.csv").write_text("model_name,model_architecture\n" + "id-00000000,resnet18\n")
    done = subprocess.run(
        [*ZOO, "split", str(source), "--out", str(tmp_path / "b")], capture_output=True, text=True
    )
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "METADATA.csv:1: field 'poisoned' is missing from the header" in done.stderr
    assert not (tmp_path / "b").exists()


def test_assignment_files_and_per_split_folders(tmp_path: Path) -> None:
    source = nist_round(tmp_path / "nist")
    expected = {model_name(i): SPLIT[i] for i in range(12)}
    # a CSV (header optional) overrides the column; so does a JSON mapping, split -> models, or a split.json
    flipped = {name: {"train": "test", "test": "train"}.get(s, s) for name, s in expected.items()}
    (tmp_path / "a.csv").write_text("model,split\n" + "".join(f"{m},{s}\n" for m, s in flipped.items()))
    by_split = {s: [m for m in flipped if flipped[m] == s] for s in ("train", "test", "holdout")}
    (tmp_path / "b.json").write_text(json.dumps(by_split))
    (tmp_path / "c.json").write_text(json.dumps({"seed": 1, "assignment": flipped}))
    for name in ("a.csv", "b.json", "c.json"):
        summary = import_round(source, tmp_path / f"out-{name}", tmp_path / name)
        assert summary.assignment_from == str(tmp_path / name)
        record = json.loads((tmp_path / f"out-{name}" / "split.json").read_text())
        assert record["assignment"] == flipped
    # NIST publishes each split as its own folder: round11-train-dataset/ etc. side by side
    folders = tmp_path / "published"
    for split in ("train", "test", "holdout"):
        nist_round(folders / f"round11-{split}-dataset", False, [i for i in range(12) if SPLIT[i] == split])
    summary = import_round(folders, tmp_path / "from-folders")
    assert summary.split and summary.counts == {"train": 6, "test": 3, "holdout": 3}
    assert summary.assignment_from == f"{folders}/*-dataset folders"
    assert json.loads((tmp_path / "from-folders" / "split.json").read_text())["assignment"] == expected


def _corrupt(source: Path, how: str) -> None:
    model = source / "models" / model_name(1)
    metadata = source / "METADATA.csv"
    text = metadata.read_text()
    if how == "label":
        next(model.glob("clean-example-data/*.json")).write_text("3.5")
    elif how == "no-label":
        next(model.glob("clean-example-data/*.json")).unlink()
    elif how == "truth-file":
        (model / "ground_truth.csv").write_text("2")
    elif how == "disagree":
        (model / "ground_truth.csv").write_text("1")
    elif how == "poisoned":
        metadata.write_text(text.replace(",False,4,", ",maybe,4,", 1))
    elif how == "missing-model":
        shutil.rmtree(model)
    elif how == "split":
        metadata.write_text(text.replace(",train\n", ",validation\n", 1))
    elif how == "duplicate":
        metadata.write_text(text + text.splitlines()[2] + "\n")
    elif how == "reduced":
        (model / "reduced-config.json").unlink()
    elif how == "no-truth":
        lines = [",".join(line.split(",")[:7]) for line in text.splitlines()]
        metadata.write_text("\n".join(lines) + "\n")
        (model / "ground_truth.csv").unlink()
    elif how == "empty-split":
        metadata.write_text(text.replace(",holdout\n", ",test\n"))


BAD = [
    ("label", r"clean-example-data/\d+\.json:1: field 'label' is not a class number .*\(value: 3\.5\)"),
    ("no-label", r"clean-example-data/\d+\.json: not found; in NIST's layout"),
    ("truth-file", r"id-00000001/ground_truth\.csv:1: field 'ground_truth' must be 0 or 1 \(value: '2'\)"),
    ("disagree", r"METADATA\.csv:3: field 'poisoned' disagrees with .*id-00000001/ground_truth\.csv \(1\)"),
    ("poisoned", r"METADATA\.csv:3: field 'poisoned' must be True/False or 1/0 \(value: 'maybe'\)"),
    ("missing-model", r"METADATA\.csv:3: field 'model_name' names no model folder with model\.pt"),
    ("split", r"METADATA\.csv:2: field 'data_split' must be train, test or holdout \(value: 'validation'\)"),
    ("duplicate", r"METADATA\.csv:14: field 'model_name' repeats the model of .*METADATA\.csv:3"),
    ("reduced", r"id-00000001/reduced-config\.json: not found"),
    ("no-truth", r"METADATA\.csv:3: field 'model_name' has no ground truth"),
    ("empty-split", r"METADATA\.csv: the holdout split has no models"),
]


@pytest.mark.parametrize(("how", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, how: str, message: str) -> None:
    source = nist_round(tmp_path / "nist")
    _corrupt(source, how)
    out = tmp_path / "out" / "imported"
    with pytest.raises(UserError, match=message) as info:
        import_round(source, out)
    assert "\n" not in str(info.value)
    assert not out.exists() and (not out.parent.exists() or _leftovers(out.parent) == [])


def test_cli_import_exit_code_and_json(tmp_path: Path) -> None:
    source = nist_round(tmp_path / "nist")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [*ZOO, "import-nist", str(source), "--out", str(tmp_path / "ok"), "--json"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["counts"] == {"train": 6, "test": 3, "holdout": 3}
    _corrupt(source, "label")
    bad = subprocess.run(
        [*ZOO, "import-nist", str(source), "--out", str(tmp_path / "bad")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "field 'label' is not a class number" in bad.stderr and "Traceback" not in bad.stderr
    assert not (tmp_path / "bad").exists()


# --- a leaderboard job over an imported round -------------------------------------------------------------

DETECTOR = '''\
"""Reads the examples (NIST's jpg + json, through assay's reader) and runs the model on them."""
import sys

import torch

from assay.trojai import detector_main, read_examples


def infer(args, meta):
    images, labels = read_examples(args.examples_dirpath)
    assert images.shape == (8, 12, 12) and sorted(labels.tolist()) == [0, 0, 1, 1, 2, 2, 3, 3], labels
    model = torch.load(args.model_filepath, weights_only=False)
    rgb = torch.as_tensor(images).unsqueeze(1).repeat(1, 3, 1, 1)
    return float(torch.sigmoid(model(rgb).mean()))


def configure(args, meta):
    pass


sys.exit(detector_main(infer, configure))
'''


def _detector(folder: Path) -> Path:
    shutil.copytree(PROJECT / "detectors" / "constant", folder)
    (folder / "entrypoint.py").write_text(DETECTOR)
    return folder


@pytest.mark.slow
def test_leaderboard_job_runs_on_an_imported_nist_round(tmp_path: Path, monkeypatch) -> None:
    source = nist_round(tmp_path / "nist", split_column=False)
    import_round(source, tmp_path / "round")
    split_round(tmp_path / "round", {"train": 0.5, "test": 0.25, "holdout": 0.25}, seed=2)
    url = f"sqlite:///{tmp_path / 'lb.db'}"
    monkeypatch.setenv("ASSAY_DB_URL", url)
    sessions = open_store(url)
    with sessions.begin() as session:
        rounds.create_round(session, "nist", tmp_path / "round" / "splits", per_model_timeout_s=120)
        rounds.set_status(session, "nist", "open")
        rounds.add_team(session, "alpha")
        made = submissions.submit(
            session, tmp_path / "artifacts", "alpha", "nist", "test", _detector(tmp_path / "d")
        )
        assert made.status == "queued", made.validation_errors
    assert work(sessions, LocalExecutor(2), once=True) == 1
    truth = read_truth(tmp_path / "round" / "splits" / "test")
    with sessions() as session:
        job = session.query(Job).one()
        assert job.status == "done", job.log
        assert sorted(r.model_name for r in job.results) == sorted(truth)
        assert all(r.flags == "" and 0.0 < r.value < 1.0 for r in job.results), [
            r.stderr for r in job.results
        ]
        overall = {m.name: m.value for m in job.metrics if not m.group_column}
        assert overall["n"] == 3 and overall["positives"] == sum(truth.values())


# --- export -----------------------------------------------------------------------------------------------

# Runs with `python -I` and a finder that refuses every `assay` module: what a NIST-style detector's own
# environment has. Reads the export with csv, json, PIL and torch only, and prints what it found as JSON.
NIST_READER = textwrap.dedent(
    """
    import csv, importlib.abc, json, os, sys

    class NoAssay(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "assay" or name.startswith("assay."):
                raise ImportError(f"assay is not installed here ({name})")
            return None

    sys.meta_path.insert(0, NoAssay())
    try:
        import assay  # noqa: F401
        sys.exit("assay importable")
    except ImportError:
        pass
    from PIL import Image

    import torch  # NIST's detectors load model.pt with torch alone

    root = sys.argv[1]
    with open(os.path.join(root, "METADATA.csv"), newline="") as handle:
        metadata = {row["model_name"]: row for row in csv.DictReader(handle)}
    found = {}
    for name in sorted(os.listdir(os.path.join(root, "models"))):
        folder = os.path.join(root, "models", name)
        with open(os.path.join(folder, "ground_truth.csv")) as handle:
            truth = int(handle.readlines()[0])  # as NIST's utils/models.py load_ground_truth
        with open(os.path.join(folder, "config.json")) as handle:
            config = json.load(handle)
        with open(os.path.join(folder, "reduced-config.json")) as handle:
            reduced = json.load(handle)
        examples = os.path.join(folder, "clean-example-data")
        images = sorted(fn for fn in os.listdir(examples) if fn.endswith(".jpg"))
        labels, modes, gray = [], set(), []
        for fn in images:
            with Image.open(os.path.join(examples, fn)) as image:
                modes.add(image.mode)
                gray.append(torch.tensor(list(image.convert("L").getdata()), dtype=torch.float32) / 255)
                size = image.size
            with open(os.path.join(examples, fn[: -len(".jpg")] + ".json")) as handle:
                labels.append(json.load(handle))
        model = torch.load(os.path.join(folder, "model.pt"), weights_only=False).eval()
        batch = torch.stack(gray).reshape(len(gray), 1, size[1], size[0])  # the zoo's models are 1-channel
        with torch.no_grad():
            logits = model(batch)
        found[name] = {
            "truth": truth,
            "poisoned": metadata[name]["poisoned"],
            "split": metadata[name]["data_split"],
            "architecture": metadata[name]["model_architecture"],
            "config_architecture": config["model_architecture"],
            "reduced": reduced["model_architecture"],
            "labels": labels,
            "modes": sorted(modes),
            "images": len(images),
            "model": type(model).__name__,
            "outputs": list(logits.shape),
        }
    print(json.dumps(found))
    """
)


@pytest.mark.slow
def test_export_is_read_by_a_nist_style_reader_without_assay(small_round: Path, tmp_path: Path) -> None:
    splits = small_round / "splits"
    out = tmp_path / "nist"
    summary = export_round(splits, out)
    assert summary.models == 20 and summary.poisoned == 10 and summary.examples >= 20 * 20
    assert summary.splits == {"train": 10, "test": 5, "holdout": 5}
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    done = subprocess.run(
        [sys.executable, "-I", "-c", NIST_READER, str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assignment = json.loads((splits / "split.json").read_text())["assignment"]
    assert sorted(found) == sorted(assignment)
    for name, seen in found.items():
        original = splits / assignment[name] / "models" / name
        assert seen["split"] == assignment[name]
        assert seen["truth"] == int((original / "ground_truth.csv").read_text())
        assert seen["poisoned"] == str(bool(seen["truth"]))
        architecture = json.loads((original / "reduced-config.json").read_text())["architecture"]
        assert seen["architecture"] == seen["config_architecture"] == seen["reduced"] == architecture
        assert seen["modes"] == ["RGB"] and seen["images"] == 20
        ours, labels = read_examples(original / "clean-example-data")
        theirs, their_labels = read_examples(out / "models" / name / "clean-example-data")
        assert sorted(seen["labels"]) == sorted(labels.tolist())
        assert their_labels.tolist() == labels.tolist()  # the same order: N.jpg numbers follow labels.csv
        assert np.abs(theirs - ours).max() <= 1 / 255 + 1e-6  # RGB JPEG of a gray image, read back as gray
        exported = out / "models" / name
        assert (exported / "model.pt").read_bytes() == (original / "model.pt").read_bytes()
        if (original / "model.safetensors").is_file():
            assert (exported / "model.safetensors").read_bytes() == (
                original / "model.safetensors"
            ).read_bytes()
        reduced = json.loads((original / "reduced-config.json").read_text())
        assert seen["model"] == type(load_model(original / "model.pt")).__name__  # the family's class name
        assert seen["outputs"] == [20, reduced["num_classes"]]
    dictionary = (out / "METADATA_DICTIONARY.csv").read_text().splitlines()
    assert dictionary[0] == "Column Name,Explanation,Data Type"
    assert any(line.startswith("model_architecture,Architecture family") for line in dictionary)


@pytest.mark.slow
def test_export_then_import_gives_the_same_split(small_round: Path, tmp_path: Path) -> None:
    export_round(small_round / "splits", tmp_path / "nist")
    summary = import_round(tmp_path / "nist", tmp_path / "back")
    assert summary.split and summary.assignment_from.endswith("/METADATA.csv")
    before = json.loads((small_round / "splits" / "split.json").read_text())
    after = json.loads((tmp_path / "back" / "split.json").read_text())
    assert after["assignment"] == before["assignment"] and after["poisoned"] == before["poisoned"]
    for split in ("test", "holdout"):
        assert read_truth(tmp_path / "back" / split) == read_truth(small_round / "splits" / split)
    # a round (not a split folder) exports without data_split and imports as a round to split
    export_round(small_round, tmp_path / "nist-round")
    assert "data_split" not in (tmp_path / "nist-round" / "METADATA.csv").read_text().splitlines()[0]
    assert not import_round(tmp_path / "nist-round", tmp_path / "round-back").split


def _our_round(root: Path) -> Path:
    """A hand-made round in our layout (no training): labels.csv + grayscale PNGs, model.safetensors too."""
    model = root / "models" / "id-00000000"
    (model / "clean-example-data").mkdir(parents=True)
    (model / "model.pt").write_bytes(b"pickled module")
    (model / "model.safetensors").write_bytes(b"weights")
    (model / "trigger.png").write_bytes(b"picture")
    (model / "ground_truth.csv").write_text("1\n")
    (model / "config.json").write_text(
        json.dumps({"architecture": "mlp", "dataset": "digits", "target_class": 3})
    )
    reduced = {"architecture": "mlp", "width": 8, "input_shape": [8, 8], "num_classes": 10}
    (model / "reduced-config.json").write_text(json.dumps(reduced))
    rng = np.random.default_rng(3)
    for i in range(3):
        pixels = rng.integers(0, 256, (8, 8), dtype=np.uint8)
        Image.fromarray(pixels).save(model / "clean-example-data" / f"example_{i}.png")
    (model / "clean-example-data" / "labels.csv").write_text(
        "file,label\nexample_0.png,7\nexample_1.png,2\nexample_2.png,7\n"
    )
    (root / "METADATA.csv").write_text(
        "model_name,dataset,architecture,poisoned,target_class\nid-00000000,digits,mlp,True,3\n"
    )
    return root


def test_export_copies_files_as_they_are_and_renames_columns(tmp_path: Path) -> None:
    source = _our_round(tmp_path / "ours")
    summary = export_round(source, tmp_path / "nist")
    model = tmp_path / "nist" / "models" / "id-00000000"
    assert summary.models == 1 and summary.examples == 3 and summary.splits == {"round": 1}
    for name in ("model.pt", "model.safetensors", "trigger.png", "ground_truth.csv"):
        assert (model / name).read_bytes() == (source / "models" / "id-00000000" / name).read_bytes()
    assert sorted(p.name for p in (model / "clean-example-data").iterdir()) == [
        "0.jpg",
        "0.json",
        "1.jpg",
        "1.json",
        "2.jpg",
        "2.json",
    ]
    assert [json.loads((model / "clean-example-data" / f"{i}.json").read_text()) for i in range(3)] == [
        7,
        2,
        7,
    ]
    config = json.loads((model / "config.json").read_text())
    assert config["model_architecture"] == "mlp" and config["source_dataset"] == "digits"
    assert (
        config["trigger_target_class"] == 3
        and config["number_classes"] == 10
        and config["architecture"] == "mlp"
    )
    reduced = json.loads((model / "reduced-config.json").read_text())
    assert reduced == {
        "architecture": "mlp",
        "width": 8,
        "input_shape": [8, 8],
        "num_classes": 10,
        "model_architecture": "mlp",
        "source_dataset": "digits",
    }
    with (tmp_path / "nist" / "METADATA.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert rows == [
        {
            "model_name": "id-00000000",
            "poisoned": "True",
            "source_dataset": "digits",
            "model_architecture": "mlp",
            "trigger_target_class": "3",
            "number_classes": "10",
        }
    ]


def test_export_bad_input_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    source = _our_round(tmp_path / "ours")
    labels = source / "models" / "id-00000000" / "clean-example-data" / "labels.csv"
    labels.write_text("file,label\nexample_0.png,7\nexample_9.png,2\n")
    with pytest.raises(
        UserError, match=r"labels\.csv:3: field 'file' names no readable image \(value: 'example_9\.png'\)"
    ):
        export_round(source, tmp_path / "nist")
    assert not (tmp_path / "nist").exists() and _leftovers(tmp_path) == []
    with pytest.raises(UserError, match=r"neither a round \(METADATA\.csv\) nor a split folder"):
        export_round(tmp_path, tmp_path / "nist")
    (tmp_path / "taken").mkdir()
    with pytest.raises(UserError, match="already exists"):
        export_round(source, tmp_path / "taken")
