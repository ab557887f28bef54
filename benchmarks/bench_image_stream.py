"""Real-size container submissions: a NIST-style detector image that imports torch, padded past 1 GiB, run
through ``assay.runner`` while the worker's own memory is watched.

The image is built here, with no registry and no network: its root file system is Debian's
``/usr/bin/python3`` with its whole standard library and the shared libraries ``ldd`` names; torch
installed (``pip install --no-deps --target``, byte code included) from the machine's torch wheel
(``--wheel``, default ``/opt/wheels/torch-2.13.0+cpu-...whl``; cp311, as Debian's Python 3.11 is);
torch's pure-Python requirements copied from this virtual environment (filelock, typing_extensions,
sympy, mpmath, networkx, jinja2, markupsafe, fsspec); a NIST-style ``/entrypoint.py`` (TrojAI ``infer``
arguments; ``import torch``, ``torch.load`` of the model, a logistic of the weights' spread);
``/metaparameters.json``; and a zero-filled ``/opt/pad.bin`` of ``--pad-mib``. ``podman import`` makes
it an image and ``podman save`` the docker-archive a team would submit.

Then, in a fresh child process (so its peak resident set starts clean), the worker's two steps: reading
the archive as the leaderboard does when it accepts it (``read_archive`` with its layers and
``/metaparameters.json``), and running one model with it (``run_task``: ``podman load`` into the runner's
private storage, then ``podman run``). Reported: the archive's size, each step's seconds, the detector's
answer, and the child's peak RSS growth over its start (``VmHWM``; podman's own processes are not the
worker's). Goal (issue 25): growth <= 64 MiB whatever the image size.

    python benchmarks/bench_image_stream.py --pad-mib 400 --folder /tmp/assay-bench-image

Not part of ``make test``: it writes the image three times (storage, archive, the runner's storage), about
3.5 GiB at the defaults, and takes minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

WHEEL = Path("/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")
REQUIREMENTS = ("filelock", "typing_extensions.py", "sympy", "mpmath", "networkx", "jinja2", "markupsafe")
REQUIREMENTS += ("fsspec",)
SITE = "opt/site"
ENTRYPOINT = '''"""A NIST-style trojan detector: the TrojAI infer arguments, torch, one probability."""
import argparse, json, math
import torch

parser = argparse.ArgumentParser()
parser.add_argument("mode", nargs="?", default="infer")
for name in ("model", "result", "metaparameters", "schema"):
    parser.add_argument(f"--{name}_filepath")
for name in ("scratch", "examples", "round_training_dataset", "learned_parameters"):
    parser.add_argument(f"--{name}_dirpath")
args, _ = parser.parse_known_args()
centre = json.load(open(args.metaparameters_filepath or "/metaparameters.json"))["centre"]
state = torch.load(args.model_filepath, map_location="cpu", weights_only=True)
weights = torch.cat([tensor.flatten().float() for tensor in state.values()])
value = 1 / (1 + math.exp(-40 * (float(weights.std()) - centre)))
open(args.result_filepath, "w").write(repr(value))
print("torch", torch.__version__, "probability", value)
'''


class _Zeros:
    """A file-like object of ``size`` zero bytes, read in chunks (the pad never sits in memory)."""

    def __init__(self, size: int) -> None:
        self.left = size

    def read(self, size: int = -1) -> bytes:
        size = self.left if size < 0 else min(size, self.left)
        self.left -= size
        return bytes(size)


def _add_tree(archive: tarfile.TarFile, folder: Path, seen: set[str], arcname: str | None = None) -> None:
    """Add a host folder (at its own path, or at ``arcname``) with its byte-code caches, less test suites
    and what is already in (podman refuses duplicate paths)."""
    from container_image import _add_file

    if arcname is None:
        _add_file(archive, folder.parent, seen)

    def once(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        name = "/" + info.name
        if name in seen or {"test", "tests", "idlelib"} & set(info.name.split("/")):
            return None
        seen.add(name)
        return info

    archive.add(str(folder), arcname=arcname or str(folder).lstrip("/"), filter=once)


def _site_packages() -> Path:
    import filelock

    return Path(filelock.__file__).parents[1]


def install(wheel: Path, folder: Path) -> Path:
    """The torch wheel installed (with its byte code, compiled by pip) into ``folder``, no dependencies."""
    target = folder / "torch-site"
    if not (target / "torch" / "__init__.py").exists():
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target)]
        subprocess.run([*pip, str(wheel)], check=True)
    return target


def rootfs(target: Path, installed: Path, pad_bytes: int) -> Path:
    """The image's root file system as one tar, streamed: nothing large is held in memory."""
    from container_image import _add_bytes, _add_file, _libraries

    python = Path("/usr/bin/python3").resolve()
    stdlib = Path(f"/usr/lib/python3.{sys.version_info.minor}")
    site = _site_packages()
    binaries = [python, *stdlib.glob("lib-dynload/*.so"), *(site / "torch" / "lib").glob("*.so*")]
    seen: set[str] = set()
    with tarfile.open(target, "w") as archive:
        for path in sorted({python, *(p for p in _libraries(binaries) if site not in p.parents)}):
            _add_file(archive, path, seen)
        _add_tree(archive, stdlib, seen)
        info = tarfile.TarInfo("usr/bin/python3")
        info.type, info.linkname, info.mtime = tarfile.SYMTYPE, str(python), 0
        archive.addfile(info)
        for name in REQUIREMENTS:
            _add_tree(archive, site / name, seen, f"{SITE}/{name}")
        _add_tree(archive, installed, seen, SITE)
        _add_bytes(archive, "entrypoint.py", ENTRYPOINT.encode())
        _add_bytes(archive, "metaparameters.json", json.dumps({"centre": 0.2}).encode())
        info = tarfile.TarInfo("opt/pad.bin")
        info.size, info.mtime = pad_bytes, 0
        archive.addfile(info, _Zeros(pad_bytes))
    return target


def _podman(*argv: str) -> str:
    done = subprocess.run(["podman", *argv], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"podman {' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout.strip()


def build(folder: Path, wheel: Path, pad_mib: int) -> tuple[Path, float]:
    """The docker-archive of the torch image and the seconds it took (the tag is removed afterwards)."""
    start = time.monotonic()
    layer = rootfs(folder / "rootfs.tar", install(wheel, folder), pad_mib * 2**20)
    tag = "localhost/assay-bench-torch:1"
    changes = ('ENTRYPOINT ["python3", "/entrypoint.py"]', f"ENV PYTHONPATH=/{SITE}")
    _podman("import", "--quiet", *(f"--change={change}" for change in changes), str(layer), tag)
    layer.unlink()
    archive = folder / "torch-detector.tar"
    archive.unlink(missing_ok=True)
    _podman("save", "--quiet", "--format", "docker-archive", "--output", str(archive), tag)
    _podman("rmi", "--force", tag)
    return archive, time.monotonic() - start


def _forget(archive: Path) -> None:
    """Remove the archive's image from the runner's private podman storage, if it is there."""
    from assay.runner.container import ImageSpec, _podman
    from assay.runner.images import read_archive

    image_id = read_archive(archive).image_id
    subprocess.run([*_podman(ImageSpec("archive", "")), "rmi", "--force", image_id], capture_output=True)


def _hwm() -> int:
    """This process's peak resident set in bytes (VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def measure(archive: Path) -> dict:
    """In this (fresh) process: peak RSS growth of reading the archive and of running one model with it."""
    import torch

    from assay.runner import Limits, Task, run_task
    from assay.runner.images import read_archive

    model = archive.parent / "model"
    model.mkdir(exist_ok=True)
    torch.manual_seed(0)
    torch.save(torch.nn.Linear(64, 8).state_dict(), model / "model.pt")
    base = _hwm()
    start = time.monotonic()
    found = read_archive(archive, ("metaparameters.json",), max_bytes=64 * 2**30)
    read_s, after_read = time.monotonic() - start, _hwm()
    argv = [sys.executable, "{input}/detector/entrypoint.py", "infer"]
    argv += ["--model_filepath", "{input}/model.pt", "--result_filepath", "{output}/result.txt"]
    argv += [
        "--scratch_dirpath",
        "{scratch}",
        "--metaparameters_filepath",
        "{input}/detector/metaparameters.json",
    ]
    limits = Limits(wall_seconds=600, memory_bytes=4 * 2**30, scratch_bytes=256 * 2**20)
    stage = {"detector": model, "model.pt": model / "model.pt"}
    task = Task("m", argv, stage=stage, limits=limits, image=str(archive))
    start = time.monotonic()
    result = run_task(task)
    return {
        "archive_bytes": archive.stat().st_size,
        "unpacked_bytes": found.unpacked_bytes,
        "metaparameters": (found.root_files.get("metaparameters.json") or b"").decode(),
        "read_seconds": read_s,
        "read_growth": after_read - base,
        "run_seconds": time.monotonic() - start,
        "run_growth": _hwm() - base,
        "exit_code": result.exit_code,
        "answer": (result.outputs["result.txt"] or b"").decode(),
        "stdout": result.stdout.strip()[-200:],
        "stderr": result.stderr.strip()[-400:],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--wheel", type=Path, default=WHEEL)
    parser.add_argument("--pad-mib", type=int, default=400, help="zero bytes added to pass 1 GiB")
    parser.add_argument("--folder", type=Path, default=Path("/tmp/assay-bench-image"))
    parser.add_argument("--archive", type=Path, help="measure this archive of an earlier run, no build")
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # the child's half
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure)))
        return
    args.folder.mkdir(parents=True, exist_ok=True)
    archive, build_s = (args.archive, 0.0) if args.archive else build(args.folder, args.wheel, args.pad_mib)
    _forget(archive)  # so that run_task loads it: the load is what is measured
    child = subprocess.run(
        [sys.executable, __file__, "--measure", str(archive)], capture_output=True, text=True, check=False
    )
    _forget(archive)  # 1 GiB and more of the runner's storage
    if child.returncode != 0:
        raise SystemExit(child.stderr)
    found = json.loads(child.stdout.splitlines()[-1])
    mib = 2**20
    print(f"torch image from {args.wheel.name}, padded by {args.pad_mib} MiB, {os.cpu_count()} CPUs")
    print(f"build (rootfs, podman import, podman save): {build_s:.1f} s")
    print(f"archive {found['archive_bytes'] / mib:.0f} MiB, unpacked {found['unpacked_bytes'] / mib:.0f} MiB")
    print(f"{'step':<36} {'seconds':>8} {'worker peak RSS growth MiB':>27}")
    for step, name in (
        ("read", "read_archive (accept the submission)"),
        ("run", "run_task (load + 1 model)"),
    ):
        print(f"{name:<36} {found[step + '_seconds']:>8.1f} {found[step + '_growth'] / mib:>27.1f}")
    print(f"exit code {found['exit_code']}, answer {found['answer']!r}, stdout {found['stdout']!r}")
    if found["exit_code"] != 0:
        print("stderr:", found["stderr"])


if __name__ == "__main__":
    main()
