"""Inside the sandbox: run the detector, then hand its result files to the harness through one inherited pipe.

Run as ``python -I -S collect.py FD OUTPUT_DIR NAME... -- ARGV...`` (standard library only: no site, no
``assay``) as the sandbox's pid 1 (bubblewrap's ``--as-pid-1``). The output folder lives on the sandbox's own
size-bounded tmpfs, which vanishes with the sandbox, so the harness cannot read it afterwards; this script
reads the requested files once the detector has exited and every other process of the sandbox is dead, and
writes them, with the detector's exit status, as one frame (``frame``) to ``FD``; then it exits 0.

The detector runs as the same user, so this script keeps it out in three ways. As the pid namespace's init
with no signal handler, it takes no signal from inside at all (the kernel drops them, SIGKILL and SIGSTOP
included), so it cannot be stopped, killed or interrupted by the detector. It makes itself non-dumpable
before the detector starts, so ``/proc/1/fd/FD``, ``/proc/1/mem`` and ptrace are refused: the detector
cannot write to the pipe (it never holds ``FD`` either: it is closed for the child). And the harness takes
the stream only when it is exactly one frame followed by end of file from a sandbox that exited 0
(``unframe``), so anything less (a collector killed from outside, say by the kernel for memory) is
reported as a lost collector, never scored.
"""

import base64
import contextlib
import ctypes
import json
import os
import re
import signal
import stat
import subprocess
import sys

MAX_OUTPUT_BYTES = 16 * 2**20  # per result file; assay.runner.workspace uses the same cap at weaker levels
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_MAGIC = b"assay-collect/1 "
_END = b"\nend\n"
_HEADER = re.compile(re.escape(_MAGIC) + rb"(0|[1-9][0-9]{0,9})\n")
_PR_SET_DUMPABLE = 4  # linux/prctl.h
NOT_INIT = 125  # exit status when not the sandbox's pid 1: the detector is not run at all


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


def frame(status: int, files: dict[str, str | None]) -> bytes:
    """The one message the harness accepts: a header with the body's length, the JSON body (the detector's
    exit status and each file as base64 or null) and an end line."""
    body = json.dumps({"status": status, "files": files}, sort_keys=True).encode()
    return _MAGIC + b"%d\n" % len(body) + body + _END


def unframe(raw: bytes) -> tuple[int, dict[str, str | None]] | None:
    """``(status, files)`` when ``raw`` is exactly one frame, else None (a second frame, a cut one, bytes
    before or after it, or a body of the wrong shape)."""
    header = _HEADER.match(raw)
    if header is None:
        return None
    start = header.end()
    end = start + int(header.group(1))
    if raw[end:] != _END:
        return None
    try:
        body = json.loads(raw[start:end])
    except ValueError:
        return None
    if not isinstance(body, dict) or set(body) != {"status", "files"}:
        return None
    status, files = body["status"], body["files"]
    if type(status) is not int or not isinstance(files, dict):
        return None
    if not all(isinstance(value, str | None) for value in files.values()):
        return None
    return status, files


def _guard() -> bool:
    """Take no signal from the detector and refuse it our ``/proc`` entries; False unless pid 1.

    Pid 1 of a pid namespace gets only the signals it has a handler for from inside it, so Python's
    SIGINT handler goes; being non-dumpable puts ``/proc/1/fd`` and ptrace out of a same-user reach.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    if os.getpid() != 1:
        return False
    return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0


def _wait_for(pid: int) -> int:
    """Reap children (orphans come to pid 1) until ``pid`` exits; its status, a signal N as 128 + N."""
    while True:
        done, status = os.waitpid(-1, 0)
        if done == pid:
            code = os.waitstatus_to_exitcode(status)
            return 128 - code if code < 0 else code


def _kill_the_rest() -> None:
    """SIGKILL every other process of the sandbox's pid namespace and reap them all, so nothing rewrites
    the output now (we are pid 1: ``kill(-1)`` reaches everyone but us, and everyone is our child)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(-1, signal.SIGKILL)
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _run(command: list[str]) -> int:
    """Start the detector without our descriptors and wait for it; 127 when it cannot start."""
    try:
        child = subprocess.Popen(command, close_fds=True)
    except OSError as err:
        print(f"cannot start the detector: {err}", file=sys.stderr)
        return 127
    code = _wait_for(child.pid)
    child.returncode = code  # reaped here: Popen must not wait for it again
    return code


def main(argv: list[str]) -> int:
    split = argv.index("--")
    fd, folder, names, command = int(argv[0]), argv[1], argv[2:split], argv[split + 1 :]
    if not _guard():
        print("collect.py: not the sandbox's pid 1 (or cannot make itself non-dumpable)", file=sys.stderr)
        return NOT_INIT
    status = _run(command)
    _kill_the_rest()
    found = {name: _read(folder, name) for name in names}
    with os.fdopen(fd, "wb") as pipe:
        pipe.write(frame(status, found))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
