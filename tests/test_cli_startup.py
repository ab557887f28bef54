"""Light commands stay light: the root CLI and the everyday commands import no heavy library.

Each command runs in a fresh interpreter (the only honest way to see what it imports) and reports the modules
it loaded; torch, transformers, statsmodels and umap take seconds and hundreds of MB to import, and none of
these commands needs them. Timings are in ``benchmarks/bench_cli_startup.py``, not here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from assay.cli import SUBCOMMANDS, load_subcommand

pytestmark = pytest.mark.slow  # a fresh interpreter per command (a second or two each)

HEAVY = ("torch", "transformers", "statsmodels", "umap", "sklearn", "peft", "fastapi", "uvicorn")
# What no help needs either: the database layer, the numeric stack, pydantic (typer coerces values with it),
# the pillars' model protocol and rich's progress bars.
HELP_FREE = ("sqlalchemy", "alembic", "numpy", "pandas", "scipy", "pydantic", "assay.models", "rich.progress")
PROBE = f"""
import json, runpy, sys
sys.argv = ["assay", *json.loads(sys.argv[1])]
try:
    runpy.run_module("assay", run_name="__main__")
except SystemExit:
    pass
sys.stdout.flush()
watch = {HEAVY!r}
print("\\nLOADED " + json.dumps(sorted(m for m in sys.modules if m in watch or m.split(".")[0] in watch)))
"""
# Every group's and command's --help in one interpreter: what any of them imports stays loaded to be seen.
EVERY_HELP = f"""
import json, sys
import typer
from assay.cli import SUBCOMMANDS, app, load_subcommand

def walk(command, path):
    yield path
    for name, sub in sorted(getattr(command, "commands", {{}}).items()):
        yield from walk(sub, [*path, name])

paths = [p for name in SUBCOMMANDS for p in walk(load_subcommand(name), [name])]
root = typer.main.get_command(app)
for path in [[], *paths]:
    try:
        root.main([*path, "--help"], prog_name="assay", standalone_mode=False)
    except SystemExit:
        pass
watch = {HELP_FREE!r}
print("\\nHELPS " + str(len(paths)))
print("LOADED " + json.dumps(sorted(m for m in sys.modules if m in watch or m.split(".")[0] in watch)))
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


def test_no_help_needs_the_database_the_numeric_stack_or_pydantic() -> None:
    probe = subprocess.run([sys.executable, "-c", EVERY_HELP], capture_output=True, text=True, timeout=120)
    assert "LOADED " in probe.stdout, probe.stderr
    helps, loaded = probe.stdout.rsplit("\nHELPS ", 1)[1].split("\nLOADED ")
    assert int(helps) >= 60  # every group and command of every sub-app was asked for its help
    assert json.loads(loaded) == []


@pytest.mark.parametrize("name", ["dyepack", "leaderboard", "star", "user"])
def test_a_sub_apps_help_as_typed_needs_none_of_it_either(name: str) -> None:
    assert loaded_by(name, "--help", watch=HELP_FREE) == []


def test_dyepack_fpr_needs_none_of_it_for_one_k_and_only_numpy_for_mixed_ks() -> None:
    """``dyepack fpr`` reads its arguments without typer's pydantic adapter and computes one K's tail with
    exact integers; mixed K (the Poisson-binomial convolution) is numpy's work."""
    assert loaded_by("dyepack", "fpr", "-b", "8", "-a", "6", "--k", "4", "--json", watch=HELP_FREE) == []
    mixed = loaded_by("dyepack", "fpr", "--k-list", "4,5,6", "-a", "3", watch=HELP_FREE)
    assert {m.split(".")[0] for m in mixed} == {"numpy"}


def test_user_list_at_head_imports_no_database_layer(tmp_path: Path) -> None:
    """The store is at head after the first open: later listings read it through the driver alone
    (``assay.store.fastread``), without SQLAlchemy, Alembic or pydantic (typer's adapter for the bounded
    ``--limit``), and, like every everyday command, no heavy library."""
    env = {**os.environ, "ASSAY_HOME": str(tmp_path)}
    subprocess.run([sys.executable, "-m", "assay", "user", "list"], env=env, check=True, capture_output=True)
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            PROBE.replace(repr(HEAVY), repr((*HEAVY, *HELP_FREE))),
            json.dumps(["user", "list", "--limit", "5"]),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert "LOADED " in probe.stdout, probe.stderr
    assert json.loads(probe.stdout.rsplit("LOADED ", 1)[1]) == []


def test_the_help_defaults_are_the_pillars_own() -> None:
    """The dyepack face keeps a copy of the layouts' help, so that its help needs no verifier."""
    from assay.dyepack import cli as dyepack_cli
    from assay.dyepack import verify

    assert dyepack_cli.LAYOUT_HELP == verify.LAYOUT_HELP


def test_the_root_help_lines_are_the_sub_apps_own() -> None:
    for name, (_, line) in SUBCOMMANDS.items():
        command = load_subcommand(name)
        assert command.help is not None and command.help.splitlines()[0].strip() == line, name
