"""Install wheels offline with pip run from its own wheel: the image's build stages (see Containerfile).

python3 install_wheels.py deps WHEELS   # a virtual environment at /opt/assay with every wheel but pip's
python3 install_wheels.py app WHEELS    # assay's wheel into /opt/assay-app, on that environment's path
python3 install_wheels.py worker WHEELS # torch & co. into /opt/assay/lib/worker, on that path too

Every wheel is installed with ``--no-deps`` (the folder holds the whole dependency closure, made by
``pip download``), and ``pip check`` must then find nothing missing unless ``PARTIAL=1`` (tests that
install a subset). The environment gets no pip of its own. ``deps`` also adds the ``assay`` user (uid
10001) and its home, ``/var/lib/assay``.
"""

import os
import subprocess
import sys
import venv
from pathlib import Path

PREFIX, APP = Path("/opt/assay"), Path("/opt/assay-app")
WORKER = PREFIX / "lib" / "worker"  # the worker image's extra tree; under lib, which the sandbox binds
USER, UID, HOME = "assay", 10001, "/var/lib/assay"
PIP_WHEEL = Path("/opt/pip.whl")  # kept in the build stages only; the final image copies neither


def pip(*argv: str) -> list[str]:
    return [
        str(PREFIX / "bin" / "python"),
        f"{PIP_WHEEL}/pip",
        "--disable-pip-version-check",
        "--no-cache-dir",
        *argv,
    ]


def install(wheels: list[Path], *options: str) -> None:
    subprocess.run(pip("install", "--no-index", "--no-deps", *options, *map(str, wheels)), check=True)


def deps(folder: Path) -> None:
    venv.create(PREFIX, with_pip=False, symlinks=True)
    found = sorted(folder.glob("*.whl"))
    pip_wheel = next((w for w in found if w.name.startswith("pip-")), None)
    if pip_wheel is None:
        sys.exit(f"{folder}: no pip wheel (pip download -d {folder} pip)")
    os.replace(pip_wheel, PIP_WHEEL)
    install([w for w in found if w != pip_wheel])
    site = next(PREFIX.glob("lib/python3*/site-packages"))
    # assay itself, from the next stage; the worker's tree where it exists (site skips a missing folder)
    (site / "assay-app.pth").write_text(f"{APP}\n{WORKER}\n")
    with open("/etc/passwd", "a") as passwd:
        passwd.write(f"{USER}:x:{UID}:{UID}:assay:{HOME}:/sbin/nologin\n")
    with open("/etc/group", "a") as group:
        group.write(f"{USER}:x:{UID}:\n")
    Path(HOME).mkdir(parents=True, exist_ok=True)


def app(folder: Path) -> None:
    install(sorted(folder.glob("assay-*.whl")), "--target", str(APP))
    checked = subprocess.run(pip("check"), capture_output=True, text=True)
    if checked.returncode != 0:
        print(checked.stdout, file=sys.stderr)
        if os.environ.get("PARTIAL") != "1":
            sys.exit("pip check: dependencies missing from build/wheels")


def worker(folder: Path) -> None:
    install(sorted(folder.glob("*.whl")), "--target", str(WORKER))


if __name__ == "__main__":
    {"deps": deps, "app": app, "worker": worker}[sys.argv[1]](Path(sys.argv[2]))
