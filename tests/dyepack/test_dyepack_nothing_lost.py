"""Issue 37, item 1 and the one-line errors: no DyePack command loses a key, a release or an input.

Every test drives the command line (``assay dyepack ...``) on a small synthetic release, so what is
checked is what a publisher runs: a refusal is a ``UserError`` (one line naming the file, exit code 2 from
``assay.cli.main``), and it comes before any work (the release folder is not created, the model is never
asked).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.board_kit import mc_rows
from typer.testing import CliRunner

from assay.cli import app
from assay.data import read_benchmark
from assay.dyepack.fromlog import verify_from_log
from assay.dyepack.key import check_commitment, load_key
from assay.errors import UserError


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def cli(*args: str | Path):
    return CliRunner().invoke(app, ["dyepack", *map(str, args)])


def refused(result, *names: str | Path) -> str:
    """The one-line refusal of ``result``: a ``UserError``, which ``assay.cli.main`` prints as one line
    with exit code 2 (anything else keeps its traceback); every name in it; returns the line."""
    assert isinstance(result.exception, UserError), (result.exit_code, result.output, result.exception)
    line = str(result.exception)
    assert "\n" not in line, line
    for name in names:
        assert str(name) in line, (name, line)
    return line


@pytest.fixture
def bench(tmp_path) -> Path:
    """60 four-option questions with an ``id`` column, as HF ``cais/mmlu`` rows."""
    rows = [{"id": f"q{i}", **row} for i, row in enumerate(mc_rows(60, seed=5))]
    return write_jsonl(tmp_path / "items.jsonl", rows)


def prepare(bench: Path, out: Path, *extra: str | Path):
    return cli("prepare", bench, "--backdoors", "6", "--fraction", "0.2", "--no-audit", "--out", out, *extra)


@pytest.fixture
def release(tmp_path, bench) -> tuple[Path, Path]:
    """A prepared release folder and its key (outside it)."""
    out, key = tmp_path / "rel", tmp_path / "secret" / "key.json"
    result = prepare(bench, out, "--key", key)
    assert result.exit_code == 0, result.output
    return out, key


@pytest.fixture
def asking_model(tmp_path) -> tuple[str, Path]:
    """A ``python:`` model that answers "(A)" and marks in a file that it was asked."""
    marker = tmp_path / "asked"
    module = tmp_path / "asking.py"
    module.write_text(
        f"MARKER = {str(marker)!r}\n"
        "def answer(prompts):\n"
        "    open(MARKER, 'a').write('asked\\n')\n"
        "    return ['The answer is (A).' for _ in prompts]\n"
    )
    return f"python:{module}:answer", marker


def test_prepare_refuses_an_existing_key_before_any_work(tmp_path, bench):
    key = tmp_path / "key.json"
    key.write_text("the secret key of a published release\n")
    line = refused(prepare(bench, tmp_path / "rel", "--key", key), key)
    assert "--force" in line
    assert key.read_text() == "the secret key of a published release\n"
    assert not (tmp_path / "rel").exists()


def test_prepare_refuses_to_replace_an_existing_release(tmp_path, bench, release):
    out, key = release
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    refused(prepare(bench, out, "--key", tmp_path / "other.key.json"), out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not (tmp_path / "other.key.json").exists()
    assert check_commitment(load_key(key), out / "commitment.txt")[0]


def test_force_keeps_a_timestamped_copy_of_what_it_replaces(tmp_path, bench, release):
    out, key = release
    old_key, old_commitment = key.read_bytes(), (out / "commitment.txt").read_bytes()
    result = prepare(bench, out, "--key", key, "--force")
    assert result.exit_code == 0, result.output
    [key_copy] = key.parent.glob("key.json.*.bak")
    [commitment_copy] = out.glob("commitment.txt.*.bak")
    assert key_copy.read_bytes() == old_key and commitment_copy.read_bytes() == old_commitment
    assert key.read_bytes() != old_key and check_commitment(load_key(key), out / "commitment.txt")[0]
    assert check_commitment(load_key(key_copy), commitment_copy)[0]  # the old pair still proves itself
    assert str(key_copy) in result.output.replace("\n", "")


def test_prepare_keeps_the_default_key_outside_the_release_folder(tmp_path, bench):
    out = tmp_path / "rel"
    result = prepare(bench, out)
    assert result.exit_code == 0, result.output
    assert not list(out.glob("*key*")), sorted(p.name for p in out.iterdir())
    key = tmp_path / "rel.key.json"
    assert check_commitment(load_key(key), out / "commitment.txt")[0]
    assert str(key) in result.output.replace("\n", "")


def test_prepare_into_an_empty_folder_proceeds_and_warns_of_a_key_inside_it(tmp_path, bench):
    out = tmp_path / "rel"
    out.mkdir()
    result = prepare(bench, out, "--key", out / "key.json")
    assert result.exit_code == 0, result.output
    assert "the key is inside the release folder" in result.output.replace("\n", " ")


def test_verify_refuses_to_overwrite_its_own_input_log(tmp_path, release):
    out, key = release
    verdict = tmp_path / "verdict"
    verdict.mkdir()
    log = write_jsonl(verdict / "audit.jsonl", [{"id": f"q{i}", "response": "(A)"} for i in range(60)])
    before = log.read_bytes()
    args = ("--from-log", log, "--release", out / "items.jsonl", "--key", key, "--out", verdict)
    for extra in ((), ("--force",)):
        assert "overwrite the input" in refused(cli("verify", *args, *extra), log)
        assert log.read_bytes() == before


def test_verify_refuses_an_earlier_verdict_before_any_query(tmp_path, release, asking_model):
    out, key = release
    spec, marker = asking_model
    verdict = tmp_path / "verdict"
    verdict.mkdir()
    (verdict / "summary.json").write_text("{}\n")
    args = (spec, "--release", out / "items.jsonl", "--key", key, "--out", verdict, "--no-cache")
    refused(cli("verify", *args), verdict / "summary.json")
    assert not marker.exists() and (verdict / "summary.json").read_text() == "{}\n"
    assert cli("verify", *args, "--force").exit_code == 0 and marker.exists()
    assert [p.read_text() for p in verdict.glob("summary.json.*.bak")] == ["{}\n"]


def test_an_out_that_is_a_file_is_one_line_before_any_work(tmp_path, bench, release, asking_model):
    out, key = release
    spec, marker = asking_model
    taken = tmp_path / "taken"
    taken.write_text("not a folder\n")
    refused(prepare(bench, taken, "--key", tmp_path / "k.json"), taken)
    assert not (tmp_path / "k.json").exists()
    args = (spec, "--release", out / "items.jsonl", "--key", key, "--out", taken, "--no-cache")
    refused(cli("verify", *args), taken)
    assert not marker.exists() and taken.read_text() == "not a folder\n"


def test_contaminate_refuses_an_existing_model_folder_before_training(tmp_path, release):
    out, _ = release
    model = tmp_path / "trained"
    model.mkdir()
    (model / "config.json").write_text("{}\n")
    refused(cli("contaminate", tmp_path / "base", "--release", out / "items.jsonl", "--out", model), model)
    assert (model / "config.json").read_text() == "{}\n"


def test_a_key_with_a_stray_byte_is_one_line_in_every_command(tmp_path, release):
    out, key = release
    bad = tmp_path / "bad-key.json"
    bad.write_bytes(key.read_bytes().replace(b'"salt"', b'"\xffsalt"'))
    release_file = out / "items.jsonl"
    for args in (
        ("verify", "python:x:y", "--release", release_file, "--key", bad, "--out", tmp_path / "v"),
        ("audit", release_file, "--key", bad),
        ("check-commitment", "--key", bad, "--commitment", out / "commitment.txt"),
    ):
        assert "0xFF" in refused(cli(*args), bad)
    commitment = tmp_path / "commitment.txt"
    commitment.write_bytes((out / "commitment.txt").read_bytes() + b"\xff\n")
    assert "0xFF" in refused(cli("check-commitment", "--key", key, "--commitment", commitment), commitment)


def test_prepare_refuses_a_repeated_id_naming_file_line_field_and_value(tmp_path, bench):
    rows = [json.loads(line) for line in bench.read_text().splitlines()]
    rows[4]["id"] = rows[1]["id"]
    write_jsonl(bench, rows)
    line = refused(prepare(bench, tmp_path / "rel", "--key", tmp_path / "k.json"), bench)
    assert "line 5" in line and "'id'" in line and repr(rows[1]["id"]) in line and "line 2" in line
    assert not (tmp_path / "rel").exists() and not (tmp_path / "k.json").exists()


def test_an_answer_sheet_that_repeats_an_id_is_refused(tmp_path, release):
    out, key = release
    bench, secret = read_benchmark(out / "items.jsonl"), load_key(key)
    clean = next(i for i in range(60) if all(i not in b.rows for b in secret.backdoors))
    rows = [{"id": f"q{i}", "response": "(A)"} for i in range(60)] + [{"id": f"q{clean}", "response": "(B)"}]
    sheet = write_jsonl(tmp_path / "sheet.jsonl", rows)
    expected = rf"sheet.jsonl:line 61: release row {clean} appears again \(first at line {clean + 1}\)"
    with pytest.raises(UserError, match=expected):
        verify_from_log(sheet, bench, secret)


def test_a_release_with_a_repeated_id_is_refused_not_misattributed(tmp_path, release):
    """A release made before ids were checked: two rows named alike, one of them a backdoor sample."""
    out, key = release
    secret = load_key(key)
    row = secret.backdoors[0].rows[0]
    other = (row + 1) % 60
    rows = [json.loads(line) for line in (out / "items.jsonl").read_text().splitlines()]
    rows[other]["id"] = rows[row]["id"]  # the items, and so the release fingerprint, are unchanged
    write_jsonl(out / "items.jsonl", rows)
    sheet = write_jsonl(tmp_path / "sheet.jsonl", [{"id": r["id"], "response": "(A)"} for r in rows[:1]])
    with pytest.raises(UserError, match=r"items.jsonl:line \d+: field 'id'.*repeats the id"):
        verify_from_log(sheet, read_benchmark(out / "items.jsonl"), secret)


# Issue 46, item 3: nothing lost at the edges, whatever the paths, the flags or the disk.


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every file's bytes and every folder (None) under ``folder``: what a refusal must leave alone."""
    return {
        str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes() for p in sorted(folder.rglob("*"))
    }


@pytest.fixture
def task(tmp_path, bench) -> Path:
    """An lm-eval task folder: its YAML and the data file it names (the rows of ``bench``)."""
    folder = tmp_path / "lmtask"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "test.jsonl").write_bytes(bench.read_bytes())
    (folder / "mini.yaml").write_text(
        "task: mini\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: data/test.jsonl\n"
        'test_split: test\noutput_type: multiple_choice\ndoc_to_text: "{{question.strip()}}\\nAnswer:"\n'
        "doc_to_choice: choices\ndoc_to_target: answer\n"
    )
    return folder


def test_prepare_never_writes_inside_an_input_folder_whatever_the_flags_or_links(tmp_path, task):
    """The issue's `prepare --key src/lmtask/test.jsonl --force` replaced the task's data file with the
    key: every output is resolved (links followed) and refused inside an input folder, even with --force."""
    before = snapshot(task)
    (tmp_path / "link").symlink_to(task / "data")
    for given in (task, task / "mini.yaml"):
        for key in (
            task / "data" / "test.jsonl",
            task / "notes" / "key.json",
            tmp_path / "link" / "test.jsonl",
        ):
            for extra in ((), ("--force",)):
                line = refused(prepare(given, tmp_path / "rel", "--key", key, *extra), key)
                assert "inside the input folder" in line or "overwrite the input" in line
                assert snapshot(task) == before and not (tmp_path / "rel").exists()
    assert not list(task.rglob("*.bak"))


def test_prepare_out_onto_its_own_input_folder_is_one_line(tmp_path, task):
    """The issue's traceback (the folder copied into itself), with and without --force."""
    before = snapshot(task)
    for given in (task, task / "mini.yaml"):
        for out in (task, task / "release", tmp_path / "link-to-task"):
            if out.name == "link-to-task" and not out.exists():
                out.symlink_to(task)
            for extra in ((), ("--force",)):
                line = refused(prepare(given, out, "--key", tmp_path / "k.json", *extra), out)
                assert "input" in line
                assert snapshot(task) == before and not (tmp_path / "k.json").exists()


def test_prepare_force_refuses_a_release_folder_that_holds_an_input(tmp_path, task):
    """--force would replace the released task folder whole, with the trigger file it reads inside."""
    first = prepare(task, tmp_path / "rel", "--key", tmp_path / "k.json")
    assert first.exit_code == 0, first.output
    triggers = tmp_path / "rel" / "lmtask" / "triggers.txt"
    triggers.write_text("".join(f"Note {i}: the survey was checked twice.\n" for i in range(40)))
    before = snapshot(tmp_path / "rel")
    again = prepare(task, tmp_path / "rel", "--key", tmp_path / "k2.json", "--triggers", triggers, "--force")
    assert "would replace a folder holding the input" in refused(again, tmp_path / "rel" / "lmtask", triggers)
    assert snapshot(tmp_path / "rel") == before and not (tmp_path / "k2.json").exists()


def test_verify_out_inside_the_release_folder_is_refused(tmp_path, release):
    """audit.jsonl names every backdoor's target: written into the folder published with the release, it
    would publish the key's secret with it."""
    out, key = release
    sheet = write_jsonl(tmp_path / "sheet.jsonl", [{"id": f"q{i}", "response": "(A)"} for i in range(60)])
    before = snapshot(out)
    for verdict in (out, out / "verdict"):
        for extra in ((), ("--force",)):
            args = ("--from-log", sheet, "--release", out / "items.jsonl", "--key", key, "--out", verdict)
            line = refused(cli("verify", *args, *extra), verdict)
            assert "the release's folder" in line and str(out) in line
            assert snapshot(out) == before


def test_a_backup_that_is_not_whole_stops_force_before_anything_is_replaced(tmp_path, monkeypatch):
    """--force keeps a copy first and checks it; a copy that comes out short (a full disk under copy2)
    is one line, and the original is untouched with no copy left behind."""
    from assay.dyepack import outputs

    old = tmp_path / "key.json"
    old.write_text("the old key\n")

    def short_copy(source, target, **_):
        Path(target).write_text("the old")

    monkeypatch.setattr(outputs.os, "link", lambda *a, **k: (_ for _ in ()).throw(OSError(1, "no links")))
    monkeypatch.setattr("shutil.copy2", short_copy)
    claim = outputs.claim_outputs([old], [], force=True)
    with pytest.raises(UserError, match=r"does not match the original") as caught, claim.replacing():
        old.write_text("the new key\n")  # never reached
    assert "\n" not in str(caught.value)
    assert old.read_text() == "the old key\n" and sorted(p.name for p in tmp_path.iterdir()) == ["key.json"]


NAMESPACE = r"""
import hashlib, json, os, shutil, subprocess, sys
disk, report, plan = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", disk]).returncode:
    sys.exit(3)
for source, name in plan["copy"]:
    (shutil.copytree if os.path.isdir(source) else shutil.copy2)(source, os.path.join(disk, name))
def listing():
    found = {}
    for root, dirs, files in os.walk(disk):
        for d in dirs:
            found[os.path.relpath(os.path.join(root, d), disk)] = "dir"
        for f in files:
            if f != "filler":
                path = os.path.join(root, f)
                found[os.path.relpath(path, disk)] = hashlib.sha256(open(path, "rb").read()).hexdigest()
    return found
if plan["full"]:
    with open(os.path.join(disk, "filler"), "wb") as filler:
        try:
            while True:
                filler.write(b"\0" * 65536)
                filler.flush()
        except OSError:
            pass
else:
    subprocess.run(["mount", "-o", "remount,ro", disk], check=True)
results = []
for args in plan["commands"]:
    args = [a.replace("DISK", disk) for a in args]
    before = listing()
    done = subprocess.run([sys.executable, "-m", "assay", "dyepack", *args], capture_output=True, text=True)
    results.append({"rc": done.returncode, "stderr": done.stderr, "before": before, "after": listing()})
json.dump(results, open(report, "w"))
"""


def on_a_small_disk(tmp_path: Path, full: bool, copy: list[tuple[Path, str]], commands: list[list]) -> list:
    """Run ``assay dyepack`` commands on a 2 MiB tmpfs (in a mount namespace of its own, so nothing is
    mounted outside the test), filled to the last byte (``full``) or remounted read-only; DISK in an
    argument is its mount point. Per command: exit code, stderr and the disk's files before and after."""
    import shutil
    import subprocess
    import sys

    if shutil.which("unshare") is None:
        pytest.skip("no unshare here to mount a small tmpfs")
    disk, report = tmp_path / "disk", tmp_path / "report.json"
    disk.mkdir()
    plan = {
        "full": full,
        "copy": [(str(s), n) for s, n in copy],
        "commands": [[str(a) for a in c] for c in commands],
    }
    done = subprocess.run(
        ["unshare", "-rm", sys.executable, "-c", NAMESPACE, str(disk), str(report), json.dumps(plan)],
        capture_output=True,
        text=True,
    )
    if done.returncode == 3 or (done.returncode and "unshare" in done.stderr):
        pytest.skip(f"cannot mount a tmpfs in a mount namespace here: {done.stderr.strip()[:200]}")
    assert done.returncode == 0, done.stderr
    return json.loads(report.read_text())


def one_line_and_nothing_changed(result: dict, reason: str) -> None:
    lines = result["stderr"].strip().splitlines()
    assert result["rc"] == 2 and len(lines) == 1 and lines[0].startswith("error:"), result["stderr"]
    assert reason in " ".join(result["stderr"].split()), result["stderr"]
    assert result["after"] == result["before"]


def test_a_full_disk_leaves_the_previous_files_and_no_new_ones(tmp_path, bench, release):
    """The issue saw tracebacks, empty folders and a 0-byte key.json.bak under --force; a response cache
    on the full disk was a traceback from SQLite."""
    out, key = release
    (tmp_path / "answers.py").write_text(
        "MODEL_ID = 'A'\ndef f(prompts):\n    return ['(A)' for _ in prompts]\n"
    )
    spec = f"python:{tmp_path / 'answers.py'}:f"
    sheet = write_jsonl(tmp_path / "sheet.jsonl", [{"id": f"q{i}", "response": "(A)"} for i in range(60)])
    verdict = tmp_path / "verdict"
    verdict.mkdir()
    (verdict / "summary.json").write_text("{}\n")
    (verdict / "audit.jsonl").write_text("")
    logged = ["verify", "--from-log", sheet, "--release", out / "items.jsonl", "--key", key]
    results = on_a_small_disk(
        tmp_path,
        full=True,
        copy=[(key, "key.json"), (out, "rel"), (verdict, "verdict")],
        commands=[
            ["prepare", bench, "-b", "6", "--fraction", "0.2", "--no-audit", "--out", "DISK/new", "--key",
             "DISK/new-key/key.json"],
            ["prepare", bench, "-b", "6", "--fraction", "0.2", "--no-audit", "--out", "DISK/rel", "--key",
             "DISK/key.json", "--force"],
            [*logged, "--out", "DISK/fresh-verdict"],
            [*logged, "--out", "DISK/verdict", "--force"],
            ["verify", spec, "--release", out / "items.jsonl", "--key", key, "--cache", "DISK/cache.sqlite",
             "--out",
             tmp_path / "live-verdict"],
        ],
    )  # fmt: skip
    for result in results[:-1]:
        one_line_and_nothing_changed(result, "No space left on device")
    assert "key.json" in results[1]["before"] and "rel/commitment.txt" in results[1]["before"]
    one_line_and_nothing_changed(results[-1], "cache.sqlite: database or disk is full; free space there")
    assert not (tmp_path / "live-verdict").exists()


def test_a_read_only_folder_leaves_the_previous_files(tmp_path, bench, release):
    out, key = release
    sheet = write_jsonl(tmp_path / "sheet.jsonl", [{"id": f"q{i}", "response": "(A)"} for i in range(60)])
    results = on_a_small_disk(
        tmp_path,
        full=False,
        copy=[(key, "key.json"), (out, "rel")],
        commands=[
            ["prepare", bench, "-b", "6", "--fraction", "0.2", "--no-audit", "--out", "DISK/rel", "--key",
             "DISK/key.json", "--force"],
            ["verify", "--from-log", sheet, "--release", out / "items.jsonl", "--key", key, "--out",
             "DISK/verdict"],
        ],
    )  # fmt: skip
    for result in results:
        one_line_and_nothing_changed(result, "Read-only file system")
