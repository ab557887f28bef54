"""Models per minute on a Ray cluster of 1, 2 and 3 nodes that share no file system.

One local cluster (``tests/ray_cluster.py``: every node ``ray start`` in its own mount and pid namespace,
its own temp dir and cache, the benchmark's files hidden from it) grows from the head alone to a head and
two workers, one CPU each. At each size, after a warm-up task per CPU (the Python worker imports torch and
loads the data once per process), it times the same two jobs:

- zoo: ``generate_round`` of the same round (default config, same seed) into a fresh folder, each model
  trained as a task on a node and sent back as a hashed blob (``cluster=RayExecutor``);
- detector: the ``constant`` baseline detector in its bwrap sandbox on every model of that round
  (``RayExecutor.map``: model files, detector and examples packed once per hash, landed in the node's cache).

A ``local`` row runs both on this machine without Ray (one training process, one sandbox at a time), before
the cluster starts. Ratios are against the 1-node row of the same run. Nodes on one machine share its cores:
on a 2-core machine, 3 one-CPU nodes cannot go faster than 2 cores allow, so the 3-node row measures
overhead, not scaling.

    python benchmarks/bench_ray_nodes.py --models 8
"""

from __future__ import annotations

import argparse
import os
import platform
import secrets
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT / "tests"))


def machine_facts() -> str:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"nproc {os.cpu_count()}, {model}, load average {load}"


def _warm() -> str:
    """One per CPU before timing: the worker process imports the zoo and loads digits once."""
    from assay.zoo.datasets import load_dataset

    load_dataset("digits", seed=0)
    time.sleep(1.0)  # long enough that the warm-up tasks spread over every CPU
    return os.environ.get("ASSAY_NODE_CACHE", "")


def _detector_tasks(round_dir: Path):
    from assay.leaderboard.harness import detector_task
    from assay.runner import Limits

    limits = Limits(wall_seconds=300, memory_bytes=2 * 2**30)
    artifact = PROJECT / "detectors" / "constant"
    return [detector_task(artifact, model, limits) for model in sorted((round_dir / "models").iterdir())]


def _time_both(config, scratch: Path, label: str, cluster=None, executor=None) -> tuple[float, float]:
    """Seconds for the zoo job and for the detector job (both over ``config.models`` models)."""
    from assay.zoo.round import generate_round

    out = scratch / f"round-{label}"
    start = time.perf_counter()
    summary = generate_round(config, out, cluster=cluster)
    zoo = time.perf_counter() - start
    assert summary.built == config.models, summary
    tasks = _detector_tasks(out)
    start = time.perf_counter()
    results = executor.map(tasks)
    detect = time.perf_counter() - start
    bad = [r for r in results if not r.ok]
    assert not bad, bad[0].stderr[-2000:]
    return zoo, detect


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 3])
    args = parser.parse_args()

    token = secrets.token_hex(32)  # before ray is imported: it reads the auth settings once
    os.environ.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token})
    import ray
    import torch

    from assay.runner import LocalExecutor, RayExecutor
    from assay.zoo.config import RoundConfig
    from ray_cluster import local_cluster, ray_available

    reason = ray_available()
    if reason:
        sys.exit(f"no local Ray cluster here: {reason}")
    torch.set_num_threads(1)  # as each node's worker process
    config = RoundConfig(models=args.models, seed=args.seed)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; before: {machine_facts()}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as folder:
        scratch = Path(folder)
        _warm()  # the local row gets the same warm-up as each node
        rows.append(("local", *_time_both(config, scratch, "local", executor=LocalExecutor(1))))
        with local_cluster(max(args.nodes) - 1, [scratch], head_cpus=1, start=False, token=token) as cluster:
            executor = RayExecutor(cluster.address, init_kwargs={"log_to_driver": False})
            for nodes in args.nodes:
                cluster.start_workers(nodes - len(cluster.nodes))
                executor.call_map(_warm, [()] * nodes)
                if ray.cluster_resources().get("CPU") != nodes:
                    sys.exit(f"expected {nodes} CPUs in the cluster, found {ray.cluster_resources()}")
                rows.append(
                    (f"{nodes} node(s)", *_time_both(config, scratch, str(nodes), executor, executor))
                )
            ray.shutdown()
    print(f"after: {machine_facts()}")
    print(f"{args.models} models (default zoo config, seed {args.seed}); one CPU per node, one machine")
    base = next((row for row in rows if row[0].startswith("1 ")), rows[0])
    head = ("run", "zoo s", "zoo models/min", "ratio", "detect s", "runs/min", "ratio")
    print("{:>10} {:>7} {:>15} {:>6} {:>9} {:>9} {:>6}".format(*head))
    for label, zoo, detect in rows:
        zoo_rate, detect_rate = 60 * args.models / zoo, 60 * args.models / detect
        print(
            f"{label:>10} {zoo:>7.1f} {zoo_rate:>15.1f} {base[1] / zoo:>5.2f}x"
            f" {detect:>9.1f} {detect_rate:>9.1f} {base[2] / detect:>5.2f}x"
        )
    if (os.cpu_count() or 1) < max(args.nodes):
        cores = os.cpu_count()
        print(f"note: {max(args.nodes)} one-CPU nodes share {cores} cores here: no scaling past the cores")


if __name__ == "__main__":
    main()
