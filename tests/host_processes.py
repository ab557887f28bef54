"""Looking at the host from outside the sandbox: which processes are still alive."""

from __future__ import annotations

from pathlib import Path


def processes_with(token: str) -> list[int]:
    """Host pids whose command line contains ``token``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if token.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found
