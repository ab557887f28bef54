"""A stand-in for ``pytorch/pytorch``, the image trojai-example's ``detector.def`` starts FROM, made here.

No registry is reachable from this machine, so the base image NIST performers pull cannot be pulled. What
stands in for it is this host's Python laid out as ``python:3.11-slim`` lays it out
(``tests/platform_image.py`` ``base_image``: the interpreter, its standard library, ``/bin/sh`` and the
shared libraries ``ldd`` names),
plus the packages trojai-example's ``%post`` installs, taken from this machine's wheels: torch 2.14.1 (a CUDA
build, which runs on a CPU) and the torchvision built for it (0.29.1), scikit-learn, scikit-image,
jsonpickle, jsonschema, jsonargparse, tqdm. pip reads the machine's configured wheel folders and indexes;
nothing is fetched when the image runs. The image is tagged by the hash of what went in, so a second run
reuses it.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from platform_image import base_image, podman

PACKAGES = (
    "torch==2.14.1",
    "torchvision==0.29.1",
    "scikit-learn",
    "scikit-image",
    "jsonpickle",
    "jsonschema",
    "jsonargparse",
    "tqdm",
)
SITE = "usr/local/lib/python3.11/site-packages"
TAG = "localhost/trojai-pytorch-standin"


def install_packages(target: Path) -> Path:
    """The packages into ``target`` with this Python's pip (cp311 wheels, as the image's Python is 3.11)."""
    if not (target / "torchvision").is_dir():
        argv = [sys.executable, "-m", "pip", "install", "--quiet", "--no-compile", "--target", str(target)]
        subprocess.run([*argv, *PACKAGES], check=True)
    return target


def _versions(site: Path) -> str:
    """What went in, as ``name==version`` lines from the ``.dist-info`` folders (names the image's tag)."""
    return "\n".join(sorted(p.name.removesuffix(".dist-info") for p in site.glob("*.dist-info")))


def standin_image(work: Path) -> str:
    """Build (or find) the stand-in base image; returns its tag."""
    site = install_packages(work / "site-packages")  # a name ``base_image`` skips when it adds libraries
    digest = hashlib.sha256(_versions(site).encode()).hexdigest()[:12]
    tag = f"{TAG}:{digest}"
    if subprocess.run(["podman", "image", "exists", tag], check=False).returncode == 0:
        return tag
    with tempfile.TemporaryDirectory(dir=work) as scratch:
        folder = Path(scratch)
        extensions = sorted(site.rglob("*.so*"))
        base_image(folder, extensions)  # writes folder/base.tar: Python, stdlib, /bin/sh, the libraries
        with tarfile.open(folder / "base.tar", "a") as archive:
            archive.add(str(site), arcname=SITE, filter=_plain)
        changes = ["ENV PATH=/usr/local/bin:/usr/bin:/bin", 'CMD ["python3"]']
        podman(
            "import",
            "--quiet",
            *(f"--change={c}" for c in changes),
            str(folder / "base.tar"),
            tag,
            timeout=3600,
        )
    return tag


def _plain(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """Root-owned, no byte-compiled caches (the image compiles nothing at build time, as pip --no-compile)."""
    if "__pycache__" in member.name:
        return None
    member.uid = member.gid = 0
    member.uname = member.gname = "root"
    return member


if __name__ == "__main__":
    print(standin_image(Path(sys.argv[1] if len(sys.argv) > 1 else "build/trojai-reference")))
