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
# What a sub-app's help must not need either: the database layer and the numeric stack.
HELP_FREE = ("sqlalchemy", "numpy", "pandas", "scipy")
PROBE = f"""
import json, runpy, sys
sys.argv = ["assay", *json.loads(sys.argv[1])]
try:
    runpy.run_module("assay", run_name="__main__")
except SystemExit:
    pass
sys.stdout.flush()
loaded = [m for m, mod in sys.modules.items() if type(mod).__name__ != "_LazyModule"]  # lazy: not run yet
print("\\nLOADED " + json.dumps(sorted(m for m in loaded if m.split(".")[0] in {HEAVY!r})))
"""


def loaded_by(*args: str, watch: tuple[str, ...] = HEAVY) -> list[str]:
    """The modules of ``watch`` that a run of ``assay ARGS`` imported (and ran)."""
    probe = subprocess.run(
        [sys.executable, "-c", PROBE.replace(repr(HEAVY), repr(watch)), json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=120,
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


@pytest.mark.parametrize("name", ["dyepack", "zoo", "leaderboard", "star", "user", "serve"])
def test_every_sub_apps_help_needs_no_database_or_numeric_stack(name: str) -> None:
    assert loaded_by(name, "--help", watch=HELP_FREE) == []
    for command in {"leaderboard": ["show", "results", "status"], "star": ["status", "agreement"]}.get(
        name, []
    ):
        assert loaded_by(name, command, "--help", watch=HELP_FREE) == [], command


def test_the_root_help_lines_are_the_sub_apps_own() -> None:
    for name, (_, line) in SUBCOMMANDS.items():
        command = load_subcommand(name)
        assert command.help is not None and command.help.splitlines()[0].strip() == line, name
