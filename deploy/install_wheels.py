"""Install wheels offline with pip run from its own wheel: the image's build stages (see Containerfile).

python3 install_wheels.py deps WHEELS    # a virtual environment at /opt/assay: each wheel but assay's, pip's
python3 install_wheels.py app WHEELS     # assay's wheel alone into /opt/assay-app, on that environment's path
python3 install_wheels.py worker WHEELS  # what the environment lacks, into /opt/assay/lib/worker (on it too)

Why three trees: each becomes one layer of the image, so a new release of assay rebuilds and ships a few
megabytes (``app``, the last layer) over the dependency layer, and the worker's torch and Ray are one layer
the platform image never carries. ``pip download`` puts assay's own wheel beside its dependencies; ``deps``
leaves it out, so assay is installed exactly once, in the last layer. Every wheel is installed with
``--no-deps`` (the folders hold whole dependency closures, made by ``pip download``) and ``pip check`` must
then find nothing missing: a wheel missing from a folder fails the build, not the first request. The
environment gets no pip of its own. ``deps`` also adds the ``assay`` user (uid 10001), its home and the
backups folder.
"""

import os
import re
import subprocess
import sys
import venv
from pathlib import Path

PREFIX, APP = Path("/opt/assay"), Path("/opt/assay-app")
WORKER = PREFIX / "lib" / "worker"  # the worker image's extra tree; under lib, which the sandbox binds
USER, UID, HOME = "assay", 10001, "/var/lib/assay"
BACKUPS = "/var/lib/assay-backups"  # `assay admin backup`'s documented place, outside ASSAY_HOME
PIP_WHEEL = Path("/opt/pip.whl")  # kept in the build stages only; the final image copies neither
OWN = {"assay", "pip"}  # never a dependency: assay goes in once, by ``app``; pip stays out of the image


def pip(*argv: str) -> list[str]:
    return [
        str(PREFIX / "bin" / "python"),
        f"{PIP_WHEEL}/pip",
        "--disable-pip-version-check",
        "--no-cache-dir",
        *argv,
    ]


def name(path: Path) -> str:
    """The distribution of a wheel or a ``.dist-info`` folder, normalised (``Foo_Bar-1.0...``: foo-bar)."""
    return re.sub(r"[-_.]+", "-", path.name.split("-")[0]).lower()


def installed() -> set[str]:
    """The distributions the environment holds."""
    return {name(info) for info in PREFIX.glob("lib/python3*/site-packages/*.dist-info")}


def wheels(folder: Path) -> dict[str, Path]:
    """name -> wheel of every wheel in ``folder``; a distribution there twice (a folder reused after the
    pins changed) stops the build, since pip would install whichever came last."""
    found: dict[str, Path] = {}
    for wheel in sorted(folder.glob("*.whl")):
        if name(wheel) in found:
            sys.exit(f"{folder}: {found[name(wheel)].name} and {wheel.name}: empty it, download again")
        found[name(wheel)] = wheel
    return found


def install(found: list[Path], *options: str) -> None:
    if found:
        subprocess.run(pip("install", "--no-index", "--no-deps", *options, *map(str, found)), check=True)


def check() -> None:
    """``pip check`` over the environment and the trees its ``.pth`` names: nothing missing or clashing."""
    checked = subprocess.run(pip("check"), capture_output=True, text=True)
    if checked.returncode != 0:
        sys.exit(f"pip check: {checked.stdout.strip()}")


def deps(folder: Path) -> None:
    venv.create(PREFIX, with_pip=False, symlinks=True)
    found = wheels(folder)
    if "pip" not in found:
        sys.exit(f"{folder}: no pip wheel (pip download -d {folder} pip)")
    os.replace(found["pip"], PIP_WHEEL)
    install([wheel for key, wheel in found.items() if key not in OWN])
    site = next(PREFIX.glob("lib/python3*/site-packages"))
    # assay itself, from the last stage; the worker's tree where it exists (site skips a missing folder)
    (site / "assay-app.pth").write_text(f"{APP}\n{WORKER}\n")
    with open("/etc/passwd", "a") as passwd:
        passwd.write(f"{USER}:x:{UID}:{UID}:assay:{HOME}:/sbin/nologin\n")
    with open("/etc/group", "a") as group:
        group.write(f"{USER}:x:{UID}:\n")
    Path(HOME, "rounds").mkdir(parents=True, exist_ok=True)  # where round folders are copied in (docs)
    Path(BACKUPS).mkdir(parents=True, exist_ok=True)


def app(folder: Path) -> None:
    found = wheels(folder)
    if "assay" not in found:
        sys.exit(f"{folder}: no assay wheel (pip wheel --no-deps -w {folder} .)")
    install([found["assay"]], "--target", str(APP))
    check()


def worker(folder: Path) -> None:
    """What the worker's extras add to the platform: the wheels whose distribution the environment lacks."""
    skip = OWN | installed()
    install([wheel for key, wheel in wheels(folder).items() if key not in skip], "--target", str(WORKER))
    check()


if __name__ == "__main__":
    {"deps": deps, "app": app, "worker": worker}[sys.argv[1]](Path(sys.argv[2]))
