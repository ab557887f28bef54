"""The ``assay`` command: a Typer root onto which each pillar mounts its own sub-app.

Faces parse and render; they compute nothing. A ``UserError`` becomes one red line and exit code 2.
"""

from __future__ import annotations

import os
import sys

# torch reads this when first imported: with the default (active) OpenMP wait, a CPU shared with any
# other process slows generation about 6x (docs/benchmarks.md).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import typer
from rich.console import Console

from assay import __version__
from assay.dyepack.cli import app as dyepack_app
from assay.errors import UserError
from assay.leaderboard.cli import app as leaderboard_app
from assay.star.cli import app as star_app
from assay.web.cli import app as user_app
from assay.web.cli import serve
from assay.zoo.cli import app as zoo_app

app = typer.Typer(
    name="assay",
    help="Rigorous adversarial evaluation of AI models.\n\n"
    "Example: assay dyepack fpr --backdoors 6 --activated 5 --k 4",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(dyepack_app, name="dyepack")
app.add_typer(zoo_app, name="zoo")
app.add_typer(leaderboard_app, name="leaderboard")
app.add_typer(star_app, name="star")
app.add_typer(user_app, name="user")
app.command("serve")(serve)


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
    try:
        # Without standalone mode click returns an Exit's code instead of exiting with it.
        code = app(standalone_mode=False)
    except UserError as err:
        Console(stderr=True).print(f"[bold red]error:[/] {err}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except typer.Exit as exit_:
        sys.exit(exit_.exit_code)
    except typer.Abort:
        sys.exit(130)
    except Exception as err:  # click usage errors
        import click

        if isinstance(err, click.ClickException):
            err.show()
            sys.exit(2)
        raise
    sys.exit(code if isinstance(code, int) else 0)
