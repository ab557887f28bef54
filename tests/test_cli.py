"""The command line as a user meets it: help with examples, one-line errors with exit code 2, JSON output."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from scipy import stats as scipy_stats

pytestmark = pytest.mark.slow  # every test runs `python -m assay` in a subprocess (seconds each)


def assay(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "assay", *args], capture_output=True, text=True, cwd=cwd)


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["dyepack"],
        ["dyepack", "prepare"],
        ["dyepack", "verify"],
        ["dyepack", "check-commitment"],
        ["dyepack", "contaminate"],
        ["dyepack", "fpr"],
    ],
)
def test_every_command_has_help_with_an_example(command):
    result = assay(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert "Example:" in result.stdout


def test_fpr_json_matches_scipy_and_the_paper():
    out = json.loads(
        assay("dyepack", "fpr", "--backdoors", "8", "--activated", "1", "--k", "10", "--json").stdout
    )
    assert round(out["fpr"], 3) == 0.570  # DyePack paper: 1 of 8 activated with K = 10 is 57.0%
    out = json.loads(
        assay("dyepack", "fpr", "--backdoors", "8", "--activated", "6", "--k", "4", "--json").stdout
    )
    assert out["fpr"] == pytest.approx(scipy_stats.binom.sf(5, 8, 0.25), rel=1e-12)
    assert out["chernoff_bound"] >= out["fpr"]


def test_fpr_mixed_k_is_the_poisson_binomial_tail():
    out = json.loads(assay("dyepack", "fpr", "--activated", "1", "--k-list", "2,4,5", "--json").stdout)
    assert out["fpr"] == pytest.approx(1 - (1 / 2) * (3 / 4) * (4 / 5), rel=1e-12)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["dyepack", "fpr", "--backdoors", "4", "--activated", "5", "--k", "4"],
            "--activated must be between 0 and 4",
        ),
        (
            ["dyepack", "fpr", "--activated", "1", "--k-list", "4,x"],
            "--k-list must be comma-separated integers",
        ),
        (["dyepack", "fpr", "--activated", "1"], "give --backdoors B with --k K"),
        (["dyepack", "prepare", "missing.jsonl", "--backdoors", "4", "--out", "o"], "missing.jsonl"),
        (["dyepack", "verify", "nosuch:thing", "--release", "r.jsonl", "--key", "k.json"], "k.json"),
    ],
)
def test_user_errors_are_one_line_with_exit_code_2(tmp_path, args, message):
    result = assay(*args, cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_bad_row_names_file_line_field_and_value(tmp_path):
    good = {
        "question": "2+2?",
        "answer_a": "3",
        "answer_b": "4",
        "answer_c": "5",
        "answer_d": "6",
        "correct_answer": "B",
    }
    bad = {**good, "correct_answer": "E"}
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [good] * 20 + [bad]))
    result = assay("dyepack", "prepare", "b.jsonl", "--backdoors", "2", "--out", "out", cwd=tmp_path)
    assert result.returncode == 2
    line = result.stderr.strip()
    assert "b.jsonl" in line and "21" in line and "correct_answer" in line and "'E'" in line
    assert not (tmp_path / "out").exists()


def test_prepare_verify_check_round_trip_on_the_command_line(tmp_path, mmlu_sample):
    out = json.loads(
        assay(
            "dyepack",
            "prepare",
            str(mmlu_sample),
            "-b",
            "4",
            "--allow-weak",
            "--out",
            str(tmp_path / "rel"),
            "--json",
        ).stdout
    )
    assert out["backdoors"] == 4 and out["randomness"] == "os-entropy"
    check = assay(
        "dyepack",
        "check-commitment",
        "--key",
        out["key"],
        "--commitment",
        out["commitment"],
        "--release",
        out["release"],
    )
    assert check.returncode == 0 and "OK" in check.stdout
    module = tmp_path / "m.py"
    module.write_text("def f(prompts):\n    return ['Answer: A' for _ in prompts]\n")
    verify = assay(
        "dyepack",
        "verify",
        f"python:{module}:f",
        "--release",
        out["release"],
        "--key",
        out["key"],
        "--out",
        str(tmp_path / "v"),
        "--json",
    )
    assert verify.returncode == 0, verify.stderr
    report = json.loads(verify.stdout)
    assert report["samples"] == 12 and report["backdoors"] == 4
    assert (tmp_path / "v" / "audit.jsonl").read_text().count("\n") == 12
    wrong = assay(
        "dyepack", "verify", f"python:{module}:f", "--release", str(mmlu_sample), "--key", out["key"]
    )
    assert wrong.returncode == 2 and "key and release do not match" in wrong.stderr


def test_a_corrupt_key_and_a_forged_commitment(tmp_path, mmlu_sample):
    out = json.loads(
        assay(
            "dyepack",
            "prepare",
            str(mmlu_sample),
            "-b",
            "4",
            "--allow-weak",
            "--out",
            str(tmp_path / "rel"),
            "--json",
        ).stdout
    )
    key = json.loads(Path(out["key"]).read_text())
    key["backdoors"][0]["k"] = 1
    (tmp_path / "bad-key.json").write_text(json.dumps(key))
    result = assay(
        "dyepack",
        "check-commitment",
        "--key",
        str(tmp_path / "bad-key.json"),
        "--commitment",
        out["commitment"],
    )
    assert result.returncode == 2
    assert "bad-key.json" in result.stderr and "backdoors.0.k" in result.stderr and "1" in result.stderr

    key["backdoors"][0]["k"] = 4
    key["backdoors"][0]["target"] = (key["backdoors"][0]["target"] + 1) % 4
    (tmp_path / "forged.json").write_text(json.dumps(key))
    result = assay(
        "dyepack",
        "check-commitment",
        "--key",
        str(tmp_path / "forged.json"),
        "--commitment",
        out["commitment"],
    )
    assert result.returncode == 1 and "MISMATCH" in result.stdout


@pytest.mark.parametrize("args", [["dyepack", "fpr", "--bogus"], ["nosuch"], []])
def test_usage_errors_exit_2_with_a_message_not_a_traceback(args):
    result = assay(*args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "Usage:" in result.stdout + result.stderr
