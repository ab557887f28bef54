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
