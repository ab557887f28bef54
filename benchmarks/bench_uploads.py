"""Server memory while it takes detector uploads: RSS growth of a real ``assay serve`` per upload, one and
two at once, for archives that unpack to much more than they weigh and for ones that do not compress.

    python benchmarks/bench_uploads.py --unpacked-mib 400 --incompressible-mib 150

Set-up in a temporary ``ASSAY_HOME``: a SQLite store with an open round over a fake 4-model split
(``tests/fake_board.py``), two teams with one team member each, and an API token per member. The server is
``python -m assay serve`` (uvicorn, one worker) in its own process. Each upload is the ``detectors/constant``
folder plus ``learned_parameters/blob.bin``:

- "zeros": a .tar.gz whose blob is ``--unpacked-mib`` MiB of one repeated byte (a few hundred KiB sent);
- "random": a .tar whose blob is ``--incompressible-mib`` MiB of random bytes (as much sent as unpacked).

A sampler thread reads the server's ``VmRSS`` from ``/proc/PID/status`` every 5 ms while the uploads run
(``VmHWM``, the kernel's own peak, is reset before each scenario through ``/proc/PID/clear_refs`` and read
after). Growth is the peak minus the RSS just before the scenario. Each team's blob differs (a byte of its
own), so two at once are two artifacts and neither is a duplicate of the other. Goal (issue 27): growth at
most 64 MiB per upload, whatever its size. Prints a markdown table; the upload wall times are for context.
"""

from __future__ import annotations

import argparse
import io
import os
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT / "tests"))  # fake_board's split folder
CONSTANT = PROJECT / "detectors" / "constant"
MIB = 2**20
PASSWORD = "bench password 2026"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def set_up(home: Path) -> list[str]:
    """An open round ``r1`` and two teams; the API token of each team's member."""
    from assay.leaderboard import rounds
    from assay.store.engine import open_store
    from assay.web import accounts
    from fake_board import fake_splits

    sessions = open_store(f"sqlite:///{home / 'assay.db'}")
    tokens = []
    with sessions.begin() as session:
        splits = fake_splits(home / "splits")
        rounds.create_round(session, "r1", splits, submission_window_s=0, quota_bytes=2**40)
        rounds.set_status(session, "r1", "open")
        for name in ("alpha", "beta"):
            team = rounds.add_team(session, name)
            user = accounts.create_user(session, f"{name}-member", PASSWORD, ["team_member"], team=team)
            tokens.append(accounts.create_api_token(session, user, "bench"))
    return tokens


def blob_chunks(kind: str, size: int, mark: int) -> io.RawIOBase:
    """A file object of ``size`` bytes: one repeated byte (``mark``) or random bytes, made as read."""

    class Blob(io.RawIOBase):
        left = size

        def readable(self) -> bool:
            return True

        def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
            n = min(len(buffer), self.left)
            buffer[:n] = bytes([mark]) * n if kind == "zeros" else os.urandom(n)
            self.left -= n
            return n

    return Blob()


def make_archive(folder: Path, kind: str, mib: int, mark: int) -> Path:
    """The constant detector plus a ``mib`` MiB blob, as .tar.gz ("zeros") or plain .tar ("random")."""
    path = folder / f"detector-{kind}-{mark}.{'tar.gz' if kind == 'zeros' else 'tar'}"
    with tarfile.open(path, "w:gz" if kind == "zeros" else "w") as archive:
        archive.add(CONSTANT, arcname="detector", filter=lambda m: None if "__pycache__" in m.name else m)
        info = tarfile.TarInfo("detector/learned_parameters/blob.bin")
        info.size = mib * MIB
        archive.addfile(info, io.BufferedReader(blob_chunks(kind, info.size, mark), 2**20))
    return path


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


class Sampler(threading.Thread):
    """The highest ``VmRSS`` of ``pid`` seen every 5 ms until stopped."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self.done = pid, 0, threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.peak = max(self.peak, status_kib(self.pid, "VmRSS"))
            time.sleep(0.005)


def upload(base: str, token: str, archive: Path) -> tuple[int, str, float]:
    start = time.perf_counter()
    with archive.open("rb") as handle:
        response = httpx.post(
            f"{base}/api/v1/leaderboard/rounds/r1/submissions",
            data={"split": "train"},
            files={"archive": (archive.name, handle, "application/octet-stream")},
            headers={"Authorization": f"Bearer {token}"},
            timeout=600,
        )
    return response.status_code, response.text[:200], time.perf_counter() - start


def scenario(pid: int, base: str, tokens: list[str], archives: list[Path]) -> dict[str, float]:
    """Upload ``archives`` at once (one per team); RSS before, peak growth (sampled and VmHWM), seconds."""
    time.sleep(0.5)
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    before = status_kib(pid, "VmRSS")
    sampler = Sampler(pid)
    sampler.start()
    start = time.perf_counter()
    with ThreadPoolExecutor(len(archives)) as pool:
        results = list(pool.map(upload, [base] * len(archives), tokens, archives))
    seconds = time.perf_counter() - start
    sampler.done.set()
    sampler.join()
    for code, text, _ in results:
        if code != 201:
            raise SystemExit(f"upload failed: {code} {text}")
    hwm = status_kib(pid, "VmHWM")
    return {
        "before": before / 1024,
        "sampled": (sampler.peak - before) / 1024,
        "hwm": (hwm - before) / 1024,
        "seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--unpacked-mib", type=int, default=400)
    parser.add_argument("--incompressible-mib", type=int, default=150)
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory() as scratch:
        home = Path(scratch)
        tokens = set_up(home)
        port = free_port()
        env = {**os.environ, "ASSAY_HOME": str(home)}
        log = (home / "server.log").open("w")
        server = subprocess.Popen(
            [sys.executable, "-m", "assay", "serve", "--port", str(port)], env=env, stdout=log, stderr=log
        )
        base = f"http://127.0.0.1:{port}"
        try:
            for _ in range(300):
                try:
                    if httpx.get(f"{base}/api/v1/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.2)
            rows = []
            for kind, mib in (("zeros", args.unpacked_mib), ("random", args.incompressible_mib)):
                made = [make_archive(home, kind, mib, mark) for mark in (1, 2, 3)]
                sent = made[0].stat().st_size / MIB
                one = scenario(server.pid, base, tokens[:1], made[:1])
                two = scenario(server.pid, base, tokens, made[1:])
                rows.append((kind, mib, sent, one, two))
                for path in made:
                    path.unlink()
        finally:
            server.terminate()
            server.wait(30)
    print(f"load average after {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(
        "| blob | unpacked MiB | sent MiB | RSS before MiB | growth, 1 upload (sampled / VmHWM) MiB "
        "| growth, 2 at once MiB | per upload, 2 at once MiB | s (1 / 2) | goal <= 64 MiB per upload |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for kind, mib, sent, one, two in rows:
        worst = max(one["hwm"], two["hwm"] / 2)
        print(
            f"| {kind} | {mib} | {sent:.1f} | {one['before']:.0f} | {one['sampled']:.0f} / {one['hwm']:.0f} "
            f"| {two['sampled']:.0f} / {two['hwm']:.0f} | {two['hwm'] / 2:.0f} "
            f"| {one['seconds']:.1f} / {two['seconds']:.1f} | {'met' if worst <= 64 else 'not met'} |"
        )


if __name__ == "__main__":
    main()
