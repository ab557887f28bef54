"""Inside the sandbox: run the detector, then hand its result files to the harness through one inherited pipe.

Run as ``python -I -S collect.py FD OUTPUT_DIR NAME... -- ARGV...`` (standard library only: no site, no
``assay``). The output folder lives on the sandbox's own size-bounded tmpfs, which vanishes with the sandbox,
so the harness cannot read it afterwards; this script reads the requested files once the detector has exited
and every process it left behind is killed, and writes them as one JSON object to ``FD``. The detector never
holds ``FD`` (it is closed for the child), so it cannot write to the host; a detector that kills or ptraces
this script can at most spoil its own result, which the harness parses with a size cap.

The exit status is the detector's, with a signal ``N`` reported as ``128 + N`` like a shell.
"""

import base64
import contextlib
import json
import os
import signal
import stat
import subprocess
import sys

MAX_OUTPUT_BYTES = 16 * 2**20  # per result file; assay.runner.workspace uses the same cap at weaker levels
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def read_regular(root: str | os.PathLike[str], *parts: str) -> bytes | None:
    """The bytes of the regular file ``root/parts...``, or None when missing, not a regular file, over
    ``MAX_OUTPUT_BYTES``, or reached through a link.

    ``root`` is the harness's own (trusted) folder; every component below it is opened relative to its
    parent's descriptor without following links: a detector could otherwise leave
    ``result.txt -> /round/ground_truth.csv``, or replace its whole output folder by a link to a folder
    it prepared.
    """
    try:
        folder = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        for part in parts[:-1]:
            below = os.open(part, _DIRECTORY, dir_fd=folder)
            os.close(folder)
            folder = below
        fd = os.open(parts[-1], _FILE, dir_fd=folder)
    except OSError:
        return None
    finally:
        os.close(folder)
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_OUTPUT_BYTES:
            return None
        data = handle.read(MAX_OUTPUT_BYTES + 1)
    return None if len(data) > MAX_OUTPUT_BYTES else data


def _read(folder: str, name: str) -> str | None:
    """The file's bytes as base64 (``read_regular`` from ``/`` down), or None."""
    data = read_regular("/", *[part for part in folder.split("/") if part], name)
    return None if data is None else base64.b64encode(data).decode("ascii")


def _kill_the_rest() -> None:
    """SIGKILL every other process of the sandbox's pid namespace, so nothing rewrites the output now.

    Only inside a fresh pid namespace (bwrap is pid 1, this script pid 2): ``kill(-1)`` anywhere else would
    reach every process of the user.
    """
    if os.getpid() > 3:
        return
    with contextlib.suppress(OSError):
        os.kill(-1, signal.SIGKILL)  # in a pid namespace: everyone but pid 1 and ourselves


def main(argv: list[str]) -> int:
    split = argv.index("--")
    fd, folder, names, command = int(argv[0]), argv[1], argv[2:split], argv[split + 1 :]
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        code = subprocess.call(command, close_fds=True)
    except OSError as err:
        print(f"cannot start the detector: {err}", file=sys.stderr)
        code = 127
    _kill_the_rest()
    found = {name: _read(folder, name) for name in names}
    with os.fdopen(fd, "w") as pipe:
        json.dump(found, pipe)
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
