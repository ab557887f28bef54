"""The ``assay`` command: a Typer root onto which each pillar mounts its own sub-app.

Faces parse and render; they compute nothing. A ``UserError`` becomes one red line and exit code 2.
"""

from __future__ import annotations

import os
import sys

# torch reads this when first imported: with the default (active) OpenMP wait, a CPU shared with any
# other process slows generation about 6x (docs/benchmarks.md).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import importlib
import re

import typer
import typer._click as click  # typer 0.29 vendors click; its exceptions and classes live here
from typer._coercion import RuntimeParam, build_runtime_param
from typer.core import TyperCommand, TyperGroup, _TyperParameter

from assay import __version__, extras, pyfloor
from assay.errors import UserError

# Each pillar's sub-app and the line `assay --help` shows for it. The sub-app is imported only when its
# command runs (or its own help is asked for), so `assay --help`, `assay user ...` or `assay dyepack fpr`
# never pay for torch, transformers or statsmodels. A test checks each line against the sub-app's own help.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("assay.web.cli:serve_app", "Run the web application (pages and the JSON API under /api/v1)."),
    "dyepack": (
        "assay.dyepack.cli:app",
        "DyePack: flag test-set contamination with backdoors and an exact false-positive rate.",
    ),
    "zoo": ("assay.zoo.cli:app", "Model zoo: generate rounds of clean and trojaned models (TrojAI layout)."),
    "leaderboard": (
        "assay.leaderboard.cli:app",
        "Leaderboard: rounds of trojan detection, sandboxed detector runs, NIST-exact scores.",
    ),
    "star": (
        "assay.star.cli:app",
        "STAR red teaming: parametric instructions that cover a risk surface evenly.",
    ),
    "user": (
        "assay.web.cli:app",
        "Web accounts: add, list, disable or enable users, set passwords, issue API tokens.",
    ),
    "admin": (
        "assay.admin_cli:app",
        "Operate an instance: back up and restore the database with its files, migrate, check readiness.",
    ),
}


COMPLETION_OPTIONS = ("install_completion", "show_completion")  # the root's business, and it has none


class _UnsetFirst:
    """typer's coercion of one parameter, built only when a value comes.

    typer (0.29) coerces every parameter through a pydantic ``TypeAdapter`` (pydantic's import and the
    adapter cost 0.1-0.2 s), even one left unset, whose value is None and comes back as None (or ``()``
    for a parameter taking several values) without the adapter being asked. So a group's unset ``--db``
    made ``assay leaderboard show --help`` import pydantic. This answers an unset value itself, exactly
    as typer's ``RuntimeParam.coerce`` would, and hands anything else to the coercion typer builds.
    """

    def __init__(self) -> None:
        self._built: RuntimeParam | None = None

    def coerce(self, value: object, param: _TyperParameter, ctx: click.Context) -> object:
        if value is None:
            return () if param.multiple or param.nargs == -1 else None
        done, plain = _plain_value(value, param)
        if done:
            return plain
        if self._built is None:
            self._built = build_runtime_param(param.type_descriptor)
        return self._built.coerce(value, param=param, ctx=ctx)


PLAIN_NUMBER = {
    int: re.compile(r"[+-]?[0-9]+"),
    float: re.compile(r"[+-]?[0-9]+(\.[0-9]*)?([eE][+-]?[0-9]+)?"),
}


def _plain_value(value: object, param: _TyperParameter) -> tuple[bool, object]:
    """(True, the value typer's adapter would give) for the everyday case, decided without pydantic: a
    ``str`` parameter, or an ``int``/``float`` one given as plain digits or left at its default, within its
    bounds, with no parser or file. (False, None) otherwise, for the adapter to decide (and word any error).
    Saves pydantic's import (0.1-0.2 s) on commands such as ``assay dyepack fpr -b 8 -a 6 --k 4`` and
    ``assay user list``."""
    descriptor = param.type_descriptor
    info, kind = descriptor.parameter_info, descriptor.annotation
    if descriptor.file_annotation is not None or info.parser is not None or info.clamp:
        return False, None
    if kind is str and isinstance(value, str) and info.min is None and info.max is None:
        return True, value
    if kind not in PLAIN_NUMBER:
        return False, None
    if isinstance(value, str) and PLAIN_NUMBER[kind].fullmatch(value):  # type: ignore[index]
        number = kind(value)  # type: ignore[operator]
    elif type(value) is kind:  # a default, already of its type (bool is not an int here)
        number = value
    else:
        return False, None
    within = (info.min is None or number >= info.min) and (info.max is None or number <= info.max)
    return (True, number) if within else (False, None)


def _lighten(command: click.Command) -> None:
    """Make ``command`` and its subcommands start fast: plain help, and no pydantic for unset values.

    Help and usage errors are click's plain layout, not typer's rich panels: its renderer imports rich's
    markdown and traceback modules, 0.1 s of the 0.3 s a ``--help`` may take (docs/benchmarks.md). typer
    (0.29) coerces a flag's value through a pydantic ``TypeAdapter`` unless it is already a bool, and an
    unset ``--help`` is None, so each group on the way to ``assay user --help`` imported pydantic (0.1 s)
    to turn None into False; ``get_help_option`` caches the option it builds, so a default set here holds.
    Other parameters left unset skip the adapter too (``_UnsetFirst``).
    """
    if hasattr(command, "rich_markup_mode"):
        command.rich_markup_mode = None
    option = command.get_help_option(click.Context(command))
    if option is not None and option.default is None:
        option.default = False
    for param in command.params:
        if isinstance(param, _TyperParameter) and param._runtime_param is None:
            param._runtime_param = _UnsetFirst()  # type: ignore[assignment]
    for sub in getattr(command, "commands", {}).values():
        _lighten(sub)


def load_subcommand(name: str) -> click.Command:
    """Import the sub-app behind ``name`` and build its click command.

    A sub-app's own shell-completion options are dropped: completion would be installed for the root.
    """
    module, attribute = SUBCOMMANDS[name][0].split(":")
    command = typer.main.get_command(getattr(importlib.import_module(module), attribute))
    command.name = name
    command.params = [p for p in command.params if p.name not in COMPLETION_OPTIONS]
    _lighten(command)
    return command


class LazyGroup(TyperGroup):
    """The root group: sub-apps are listed from ``SUBCOMMANDS`` and imported on first use."""

    _listing = False

    def get_help_option(self, ctx: click.Context) -> click.Option | None:
        option = super().get_help_option(ctx)
        if option is not None and option.default is None:  # see _lighten
            option.default = False
        return option

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*super().list_commands(ctx), *SUBCOMMANDS]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in SUBCOMMANDS:
            return super().get_command(ctx, cmd_name)
        if self._listing:  # the root's help needs a name and a line, not the module
            return TyperCommand(cmd_name, help=SUBCOMMANDS[cmd_name][1])
        return load_subcommand(cmd_name)

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(
    name="assay",
    cls=LazyGroup,
    help="Rigorous adversarial evaluation of AI models.\n\n"
    "Example: assay dyepack fpr --backdoors 6 --activated 5 --k 4",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,  # plain help, as every sub-app's (_lighten)
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"assay {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version."
    ),
) -> None:
    """Rigorous adversarial evaluation of AI models."""


def main() -> None:
    """Entry point: run the app, turning user errors into one line and exit code 2."""
    pyfloor.check()  # an older Python fails uploads and restores later; say so before any work starts
    try:
        # Without standalone mode click returns an Exit's code instead of exiting with it.
        code = app(standalone_mode=False)
    except UserError as err:
        from rich.console import Console  # here: rich's console costs 0.03 s, and --help has no use for it

        Console(stderr=True).print(f"[bold red]error:[/] {err}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except typer.Exit as exit_:
        sys.exit(exit_.exit_code)
    except typer.Abort:
        sys.exit(130)
    except click.ClickException as err:  # usage errors: an unknown option, a missing argument, no arguments
        err.show()
        sys.exit(err.exit_code)
    except ModuleNotFoundError as err:  # a command of an extra this installation lacks (assay.extras)
        line = extras.missing(err)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)
