"""Light commands stay light: the root CLI and the everyday commands import no heavy library.

Each command runs in a fresh interpreter (the only honest way to see what it imports) and reports the modules
it loaded; torch, transformers, statsmodels and umap take seconds and hundreds of MB to import, and none of
these commands needs them. Timings are in ``benchmarks/bench_cli_startup.py``, not here.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from assay.cli import SUBCOMMANDS, load_subcommand

pytestmark = pytest.mark.slow  # a fresh interpreter per command (a second or two each)

HEAVY = ("torch", "transformers", "statsmodels", "umap", "sklearn", "peft", "fastapi", "uvicorn")
PROBE = f"""
import json, runpy, sys
sys.argv = ["assay", *json.loads(sys.argv[1])]
try:
    runpy.run_module("assay", run_name="__main__")
except SystemExit:
    pass
sys.stdout.flush()
print("\\nLOADED " + json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})))
"""


def loaded_by(*args: str) -> list[str]:
    """The heavy modules a run of ``assay ARGS`` imported."""
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args)], capture_output=True, text=True, timeout=120
    )
    line = probe.stdout.rsplit("LOADED ", 1)
    assert len(line) == 2, probe.stderr
    return json.loads(line[1])


def test_importing_the_cli_pulls_no_heavy_library() -> None:
    assert loaded_by() == []
    code = f"import sys, assay.cli; print([m for m in {HEAVY!r} if m in sys.modules])"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "args",
    [
        ("--help",),
        ("dyepack", "--help"),
        ("dyepack", "fpr", "--backdoors", "6", "--activated", "5", "--k", "4"),
        ("user", "--help"),
        ("user", "list"),
        ("serve", "--help"),
        ("zoo", "--help"),
        ("leaderboard", "show", "--help"),
        ("leaderboard", "round", "list"),
        ("star", "status", "--help"),
    ],
    ids=lambda args: " ".join(args),
)
def test_everyday_commands_import_no_heavy_library(args: tuple[str, ...]) -> None:
    assert loaded_by(*args) == []


def test_the_root_help_lines_are_the_sub_apps_own() -> None:
    for name, (_, line) in SUBCOMMANDS.items():
        command = load_subcommand(name)
        assert command.help is not None and command.help.splitlines()[0].strip() == line, name
