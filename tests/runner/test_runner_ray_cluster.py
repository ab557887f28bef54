"""Ray across nodes with no shared file system: a zoo generation, a leaderboard job and a container-image
job on a head and two worker nodes (``ray start``, each in its own mount and pid namespace where the test's
files do not exist, ``tests/ray_cluster.py``); in the first two, one worker node is killed while it trains a
model or runs a detector (a fresh node takes the first one's place). Everything a node reads comes by
content hash through Ray's object store into the node's own cache (an image archive into the node's own
podman storage); results and models come back as values. All end equal to a one-node run: the same
weights, the same detector answers and metrics, each model counted once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from sqlalchemy import select

from assay.leaderboard import rounds, submissions
from assay.leaderboard.worker import work
from assay.runner import LocalExecutor
from assay.runner.transfer import digest, pack
from assay.store import Job, open_store
from assay.zoo.config import RoundConfig
from assay.zoo.round import build_model, draw_factors
from assay.zoo.split import split_round
from container_image import build_image, podman_ready
from container_image import expected_value as image_value
from ray_cluster import local_cluster, ray_available

pytestmark = pytest.mark.slow
PROJECT = Path(__file__).resolve().parents[2]
ZOO = {
    "models": 4,
    "seed": 11,
    "architectures": ["mlp"],
    "widths": [8],
    "epochs": 8,
    "trigger_kinds": ["solid_patch", "random_patch"],
    "source_specific_share": 0.0,
    "poison_fraction": [0.3, 0.3],
    "clean_accuracy_floor": 0.75,
    "asr_floor": 0.7,
}
MARKER = "detector/entrypoint.py"  # in a detector's command line: how the test sees one running on a node


def hashing_detector(folder: Path, sleep_s: float) -> Path:
    """A TrojAI detector answering a number fixed by the model file's bytes, after ``sleep_s`` seconds."""
    shutil.copytree(PROJECT / "detectors" / "constant", folder)  # its metaparameters and schema
    (folder / "entrypoint.py").write_text(
        "import argparse, hashlib, time\n"
        "p = argparse.ArgumentParser()\n"
        "p.add_argument('mode', nargs='?')\n"
        "for name in ('model_filepath', 'result_filepath', 'scratch_dirpath', 'examples_dirpath',\n"
        "             'round_training_dataset_dirpath', 'metaparameters_filepath', 'schema_filepath',\n"
        "             'learned_parameters_dirpath', 'source_dataset_dirpath'):\n"
        "    p.add_argument('--' + name)\n"
        "args = p.parse_args()\n"
        f"time.sleep({sleep_s!r})\n"
        "data = open(args.model_filepath, 'rb').read()\n"
        "open(args.result_filepath, 'w').write(repr(int(hashlib.sha256(data).hexdigest()[:4], 16) / 65535))\n"
    )
    return folder


def expected_value(model_pt: Path) -> float:
    return int(digest(model_pt.read_bytes())[:4], 16) / 65535


def _submit(sessions, tmp_path: Path, team: str, sleep_s: float, artifact: Path | None = None) -> int:
    """Submit the hashing detector (or ``artifact``) for ``team`` on the train split; its queued job's id."""
    artifact = artifact or hashing_detector(tmp_path / team, sleep_s)
    with sessions.begin() as session:
        made = submissions.submit(session, tmp_path / "artifacts", team, "r1", "train", artifact)
        assert made.status == "queued", made.validation_errors
        submission_id = made.id
    with sessions() as session:
        return session.scalars(select(Job.id).where(Job.submission_id == submission_id)).one()


def _results(sessions, job_id: int) -> tuple[str, dict[str, float], dict[tuple, float | None], int, list]:
    """Status, value per model, metrics, number of result rows and the isolation lines of the job's log."""
    with sessions() as session:
        job = session.get(Job, job_id)
        values = {r.model_name: r.value for r in job.results}
        metrics = {(m.name, m.group_column, m.group_value): m.value for m in job.metrics}
        isolation = [line for line in job.log.splitlines() if line.startswith("isolation:")]
        return job.status, values, metrics, len(job.results), isolation


def run_killing(args: list[str], env: dict[str, str], victim, marker: str, logs: Path) -> str:
    """``python -m assay ARGS`` (stdout to ``LOGS.out``, stderr to ``LOGS.err``); once a process with
    ``marker`` in its command line runs on the ``victim`` node, that node is killed. The command must
    still succeed; its stderr is returned."""
    out, err = logs.with_suffix(".out"), logs.with_suffix(".err")
    with out.open("wb") as stdout, err.open("wb") as stderr:  # files: Ray's log lines never block it
        driver = subprocess.Popen(
            [sys.executable, "-m", "assay", *args], env=env, stdout=stdout, stderr=stderr
        )
    try:
        deadline = time.monotonic() + 120
        while not victim.running(marker) and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if not victim.running(marker):
            pytest.fail(f"{args[:2]}: nothing ran on node {victim.name}:\n{err.read_text()[-3000:]}")
        victim.kill()
        driver.wait(timeout=240)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    log = err.read_text(errors="replace")
    assert driver.returncode == 0, log[-3000:]
    return log


def test_zoo_and_leaderboard_on_three_nodes_with_one_killed(
    tmp_path: Path, tmp_path_factory, request
) -> None:
    reason = ray_available()
    if reason is not None:
        pytest.skip(f"no local Ray cluster here: {reason}")
    url = f"sqlite:///{tmp_path / 'store.db'}"
    sessions = open_store(url)
    config_file = tmp_path / "zoo.json"
    config_file.write_text(json.dumps(ZOO))  # YAML is a superset of JSON
    out = tmp_path / "round"
    hidden = [tmp_path_factory.getbasetemp()]  # the round, the artifacts, the database, ASSAY_HOME
    with local_cluster(workers=3, hidden=hidden, start=False) as cluster:
        cluster.start_workers(2)  # the third waits to take the place of the first one killed
        for node in cluster.nodes:  # this test's folder is here, and in no node's view; nor are the others
            view = Path(f"/proc/{node.processes()[0].pid}/root")

            def seen(path: Path, view: Path = view) -> bool:
                return (view / path.relative_to("/")).exists()

            assert config_file.is_file() and not seen(tmp_path) and seen(node.root / "ray"), node.name
            assert not any(seen(other.root / "ray") for other in cluster.nodes if other is not node)
        env = {**os.environ, **cluster.env, "ASSAY_DB_URL": url, "OMP_NUM_THREADS": "1"}
        ray_cli = ["--executor", "ray", "--address", cluster.address]
        zoo = ["zoo", "generate", "-c", str(config_file), "-o", str(out), "--json", *ray_cli]
        log = run_killing(zoo, env, cluster.workers[1], "build_packed", tmp_path / "zoo")
        printed = (tmp_path / "zoo.out").read_text()  # Ray prints a lost node's error on stdout, any time
        summary, _ = json.JSONDecoder().raw_decode(printed, printed.index('{\n  "out_dir"'))
        assert "Task build_packed failed. There are 3 retries remaining" in printed  # lost, run again
        assert (summary["built"], summary["skipped"]) == (4, 0), log
        assert sorted(p.name for p in (out / "models").iterdir()) == [f"id-{i:08d}" for i in range(4)]
        cluster.start_workers(1)

        split_round(out, {"train": 0.5, "test": 0.25, "holdout": 0.25}, seed=3)
        with sessions.begin() as session:
            rounds.create_round(session, "r1", out / "splits", per_model_timeout_s=120)
            rounds.set_status(session, "r1", "open")
            for team in ("alpha", "beta", "gamma"):
                rounds.add_team(session, team)
        job_on_cluster = _submit(sessions, tmp_path, "alpha", 1.0)

        started = time.monotonic()
        log = run_killing(
            ["leaderboard", "worker", "--once", *ray_cli], env, cluster.workers[2], MARKER, tmp_path / "lb"
        )
        job_seconds = time.monotonic() - started
        assert "Task _run_shipped failed. There are 3 retries remaining" in (tmp_path / "lb.out").read_text()
        caches = {node.name: set(os.listdir(node.cache)) for node in cluster.workers if node.cache.is_dir()}
        head_cache = cluster.nodes[0].cache
        assert not head_cache.exists()  # the head has no CPU for tasks: everything ran on the workers

        # A container-image submission: the archive travels as a blob, each node loads it into its own
        # podman storage and runs it under the same limits as on one machine.
        job_image = None
        if podman_ready() is None:
            image = build_image(tmp_path / "image")
            job_image = _submit(sessions, tmp_path, "gamma", 0.0, image.docker_archive)
            worker = [sys.executable, "-m", "assay", "leaderboard", "worker", "--once", *ray_cli]
            done = subprocess.run(worker, env=env, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, done.stderr[-3000:]

    # The zoo: every model came back by value, equal to one built here on one node.
    config = RoundConfig.model_validate(ZOO)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as on the nodes (and in 'assay zoo generate --workers N'): same float sums
    request.addfinalizer(lambda: torch.set_num_threads(threads))
    for index in (0, 1):
        factors = draw_factors(config, index)
        here = tmp_path / "here" / factors.model_id
        build_model(config, factors, here)
        there = out / "models" / factors.model_id
        config_there, config_here = (json.loads((d / "config.json").read_text()) for d in (there, here))
        assert config_there == config_here
        weights_there, weights_here = (load_file(d / "model.safetensors") for d in (there, here))
        assert weights_there.keys() == weights_here.keys()
        assert all(torch.equal(weights_there[k], weights_here[k]) for k in weights_there)

    # The leaderboard job: done, each model once, the same answers and metrics as a one-node run.
    train_models = sorted(p.name for p in (out / "splits" / "train" / "models").iterdir())
    status, values, metrics, count, isolation = _results(sessions, job_on_cluster)
    assert len(isolation) == 1 and isolation[0].startswith(
        "isolation: bwrap:"
    )  # the same sandbox on each node
    assert status == "done" and count == len(values) == len(train_models) == 2, log[-2000:]
    models = out / "splits" / "train" / "models"
    assert values == {name: expected_value(models / name / "model.pt") for name in train_models}
    job_here = _submit(sessions, tmp_path, "beta", 0.0)
    assert work(sessions, LocalExecutor(2), once=True) == 1
    status_here, values_here, metrics_here, _, _ = _results(sessions, job_here)
    assert status_here == "done" and values_here == values and metrics_here == metrics

    if job_image is not None:
        status, values, _, count, isolation = _results(sessions, job_image)
        assert status == "done" and count == 2 and isolation[0].startswith("isolation: podman (runc)")
        assert values == pytest.approx({name: image_value(models / name) for name in train_models}, abs=1e-12)

    # What the nodes read came through their own caches, by content hash: each model file is there.
    for name in train_models:
        model_blob = digest(pack(models / name / "model.pt"))
        assert any(model_blob in names for names in caches.values()), name
    assert job_seconds < 120
