"""The platform's and the worker's images and the pod, made by running docs/deploy.md's own ``bash`` blocks
as written, for the deploy tests (``make test-deploy``).

``docs_blocks`` reads every ``bash`` block of docs/deploy.md (a fenced block, indented or not) with the
``<!-- not run by make test-deploy: why -->`` comment that may precede it; ``run_documented`` runs the one
block holding a marker line, unchanged, with ``bash -euo pipefail`` in the project folder and the
project's ``.venv`` first on ``PATH`` (the docs say to activate it). ``RUN_MARKERS`` names every block the
tests run; ``test_every_documented_block_runs_or_says_why`` holds the docs to it.

**Its own podman store.** The docs name fixed tags (``localhost/assay:0.1.0``), a pod ``assay`` and
volumes ``assay-*``. Run as written in the operator's store, the test would overwrite their images and
meet their pod. So ``deploy_store`` points podman at a store of the test's own with ``CONTAINERS_CONF`` and
``CONTAINERS_STORAGE_CONF`` (graph root under ``~/.cache/assay-test-deploy``, run root and libpod's tmp dir
under /run, file locks, so nothing is shared with the host's store, not even its lock table). The docs'
``deploy/podman-limits.sh`` writes its ulimits into that ``CONTAINERS_CONF``, as it says it does. The
store keeps this run's images and build layers (the warm cache); at the end the test removes every pod,
container and volume it holds and every dangling image the run's builds did not use, and checks that the
host's store gained no image, volume or pod of the docs' names.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]
DOCS = PROJECT / "docs" / "deploy.md"
VENV_BIN = Path(sys.executable).parent
PLATFORM_TAG, WORKER_TAG = "localhost/assay:0.1.0", "localhost/assay-worker:0.1.0"  # the docs' tags
POSTGRES_TAG = "localhost/assay-postgres:15"
DOCS_NAMES = ("assay", "assay-worker", "assay-base", "assay-postgres")  # the docs' image names
# Building the images takes minutes on 2 cores (more than make test's whole budget allows): `make test-deploy`
# runs the image tests, with ASSAY_DEPLOY_TESTS=1.
DEPLOY_TESTS = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("ASSAY_DEPLOY_TESTS") != "1", reason="image and pod test: run `make test-deploy`"
    ),
]
TINY_ROUND = PROJECT / "examples" / "zoo-tiny-round.yaml"
SKIP_COMMENT = re.compile(r"<!-- not run by make test-deploy: (.+?) -->")
# a line of each block the tests run, in the order they run them
LIMITS = "python3 deploy/base_images.py"
PLATFORM = f"podman build -t {PLATFORM_TAG} ."
WORKER = "--target worker"
PLAY = "podman kube play deploy/assay-pod.yaml"
BESIDE = "podman rm -f assay-worker"
ROUND = "assay zoo generate --config examples/zoo-tiny-round.yaml"
BACKUP = "podman exec assay-web assay admin backup /var/lib/assay-backups/assay-$(date +%F).tar"
RESTORE = "podman exec assay-db createdb"
SECRET = "podman secret create assay-db-url"
DOWN = "podman kube down deploy/assay-pod.yaml"
RUN_MARKERS = (LIMITS, PLATFORM, WORKER, PLAY, BESIDE, ROUND, SECRET, BACKUP, RESTORE, DOWN)
STORE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "assay-test-deploy"
STORAGE_CONF = """[storage]
driver = "overlay"
graphroot = "{root}/storage"
runroot = "{run}/storage"
"""
ENGINE_CONF = """[engine]
tmp_dir = "{run}/libpod"
lock_type = "file"
"""


@dataclass(frozen=True)
class Block:
    """A ``bash`` block of docs/deploy.md: its text as typed, its section, and why it is not run (or '')."""

    text: str
    section: str
    not_run: str


@dataclass(frozen=True)
class Build:
    """What one documented block did: the commands, the wheels it downloaded, how long it took, its log."""

    commands: str
    wheels: int
    wheel_bytes: int
    seconds: float
    log: Path


@dataclass(frozen=True)
class Images:
    assay: str
    worker: str
    postgres: str


def docs_blocks(path: Path = DOCS) -> list[Block]:
    """Every ``bash`` block of the file, in order, unindented as a reader copies it."""
    blocks, section, previous, lines = [], "", "", path.read_text().splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("## "):
            section = line[3:].strip()
        fence = re.match(r"^(\s*)```bash\s*$", line)
        if fence:
            indent, body = len(fence.group(1)), []
            index += 1
            while not lines[index].strip().startswith("```"):
                body.append(lines[index][indent:])
                index += 1
            skipped = SKIP_COMMENT.search(previous)
            blocks.append(Block("\n".join(body) + "\n", section, skipped.group(1) if skipped else ""))
        if line.strip():
            previous = line
        index += 1
    return blocks


def documented(marker: str) -> str:
    """The one run ``bash`` block of docs/deploy.md that holds ``marker``, as written there."""
    found = [b.text for b in docs_blocks() if marker in b.text and not b.not_run]
    assert len(found) == 1, f"docs/deploy.md: {len(found)} run bash blocks hold {marker!r}"
    return found[0]


def podman(*argv: str, timeout: float = 600, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        ["podman", *argv], capture_output=True, text=True, timeout=timeout, check=False, env=env
    )
    if done.returncode != 0:
        raise RuntimeError(f"podman {' '.join(argv[:3])}...: {done.stderr.strip()[-3000:]}")
    return done.stdout.strip()


def _run_dir() -> Path:
    """Where the test store's run root and libpod's tmp dir go: a tmpfs, as podman wants them."""
    run = (
        Path("/run")
        if os.access("/run", os.W_OK)
        else Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir())
    )
    return run / "assay-test-deploy"


def _host_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF")}


def _host_names() -> set[str]:
    """The host store's images, volumes and pods that carry the docs' names."""
    env = _host_env()
    images = podman("images", "--format", "{{.Repository}}:{{.Tag}} {{.ID}}", env=env).splitlines()
    volumes = podman("volume", "ls", "--format", "{{.Name}}", env=env).splitlines()
    pods = podman("pod", "ls", "--format", "{{.Name}}", env=env).splitlines()
    names = [f"image {i}" for i in images if i.split(":")[0].removeprefix("localhost/") in DOCS_NAMES]
    names += [f"volume {v}" for v in volumes if v.startswith("assay-")]
    return set(names) | {f"pod {p}" for p in pods if p == "assay"}


def _empty_store() -> None:
    """Every pod, container, volume and secret of the test store, removed (a run killed half-way left
    them)."""
    podman("pod", "rm", "--all", "--force", "--time", "5")
    podman("rm", "--all", "--force", "--volumes", "--time", "5")
    podman("volume", "rm", "--all", "--force")
    podman("secret", "rm", "--all")


def _prune_unused(logs: list[Path]) -> int:
    """Remove dangling images of the store that this run's builds neither made nor used; how many."""
    used = set()
    for log in logs:
        used |= set(re.findall(r"--> (?:Using cache )?([0-9a-f]{12,64})", log.read_text()))
    dangling = podman("images", "--filter", "dangling=true", "--no-trunc", "--format", "{{.ID}}").split()
    stale = [i for i in dangling if not any(i.removeprefix("sha256:").startswith(u) for u in used)]
    for image in stale:
        subprocess.run(["podman", "rmi", "--force", image], capture_output=True, check=False)
    return len(stale)


@functools.cache
def _store_env() -> dict[str, str]:
    """The test store's configuration files, fresh each session (the docs' script appends to one)."""
    run = _run_dir()
    run.mkdir(parents=True, exist_ok=True)
    STORE.mkdir(parents=True, exist_ok=True)
    (STORE / "storage.conf").write_text(STORAGE_CONF.format(root=STORE, run=run))
    (STORE / "containers.conf").write_text(ENGINE_CONF.format(run=run))
    return {
        "CONTAINERS_CONF": str(STORE / "containers.conf"),
        "CONTAINERS_STORAGE_CONF": str(STORE / "storage.conf"),
    }


BUILD_LOGS: list[Path] = []


@pytest.fixture(scope="session")
def deploy_store() -> Iterator[dict[str, str]]:
    """podman, for this session, on the test's own store (see the module's docstring)."""
    from container_image import podman_ready

    reason = podman_ready()
    if reason is not None:
        pytest.skip(reason)
    before = _host_names()
    with pytest.MonkeyPatch.context() as patch:  # the host's podman again once the session ends
        for key, value in _store_env().items():
            patch.setenv(key, value)
        try:
            _empty_store()
            yield _store_env()
        finally:
            _empty_store()
            pruned = _prune_unused(BUILD_LOGS)
            left = podman("volume", "ls", "--format", "{{.Name}}") + podman(
                "ps", "-a", "--format", "{{.Names}}"
            )
    added = _host_names() - before
    print(f"test store {STORE}: {pruned} unused dangling images removed; left: {left or 'nothing'}")
    assert not left.strip(), f"the test store kept {left!r}"
    assert not added, f"the host's podman store gained {sorted(added)}"


def run_documented(marker: str, log: Path) -> Build:
    """Run the documented block holding ``marker`` as written, in the project folder."""
    commands = documented(marker)
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}", "VIRTUAL_ENV": str(VENV_BIN.parent)}
    started = time.monotonic()
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", commands],
            cwd=PROJECT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=2400,
        )
    BUILD_LOGS.append(log)
    assert done.returncode == 0, (
        f"documented block failed (log {log}):\n{commands}\n{log.read_text()[-4000:]}"
    )
    folder = PROJECT / "build" / ("worker-wheels" if WORKER in commands else "wheels")
    wheels = list(folder.glob("*.whl")) if "pip download" in commands else []
    return Build(
        commands, len(wheels), sum(w.stat().st_size for w in wheels), time.monotonic() - started, log
    )


@functools.cache
def _built(folder: Path) -> tuple[Images, Build, Build]:
    run_documented(LIMITS, folder / "base-images.log")
    platform = run_documented(PLATFORM, folder / "build-platform.log")
    worker = run_documented(WORKER, folder / "build-worker.log")
    return Images(PLATFORM_TAG, WORKER_TAG, POSTGRES_TAG), platform, worker


def build(folder: Path) -> tuple[Images, Build, Build]:
    """The base images and both images by the documented blocks, once per session (in the test store)."""
    if "CONTAINERS_STORAGE_CONF" not in os.environ:
        raise AssertionError("use the deploy_store fixture first: the docs' tags go in the test's own store")
    return _built(folder)


def tiny_round(folder: Path) -> Path:
    """The docs' tiny round (examples/zoo-tiny-round.yaml: 4 digits MLPs), split as the docs split it."""
    import torch
    import yaml

    from assay.zoo.config import RoundConfig
    from assay.zoo.round import generate_round
    from assay.zoo.split import split_round

    torch.set_num_threads(1)
    config = RoundConfig.model_validate(yaml.safe_load(TINY_ROUND.read_text()))
    generate_round(config, folder / "round", workers=1)
    split_round(folder / "round", {"train": 0.5, "test": 0.25, "holdout": 0.25}, seed=3)
    return folder / "round" / "splits"


def image_bytes(tag: str) -> int:
    return int(podman("image", "inspect", "--format", "{{.Size}}", tag))


def top_layer(tag: str) -> tuple[str, int]:
    """The instruction that made the image's last non-empty layer, and that layer's size in bytes."""
    for layer in json.loads(podman("history", "--format", "json", tag)):
        if layer["size"] > 0:
            return layer["CreatedBy"], layer["size"]
    raise AssertionError(f"{tag}: no layer with content")
