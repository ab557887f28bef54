"""Terminal helpers shared by every command-line face."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.progress import Progress


def progress_bar() -> Progress:
    """The progress bar every long-running command shows, on stderr so stdout stays clean for --json.

    rich's progress module is imported here, when a command runs: a sub-app's ``--help`` has no use for it.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
