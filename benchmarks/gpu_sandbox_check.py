"""GPU rounds on real hardware: a torch detector inside the sandbox says whether CUDA works there.

Not part of ``make test``: it needs an NVIDIA GPU, its driver, and a CUDA build of torch in this Python's
environment (the sandbox shows the detector this Python and its packages, read-only). It makes two rounds
in a temporary store, ``gpu-check`` (``--gpus 1``) and ``cpu-check`` (no GPU), submits the same folder
detector to the train split of each, runs them through the real worker (preflight, claim, bubblewrap) and
prints what the detector printed, from the job's stored results, plus the sandbox line of the job log:

    python benchmarks/gpu_sandbox_check.py

Expected on a GPU machine: in ``gpu-check``, ``torch.cuda.is_available()=True`` with the device's name,
``/dev`` holding the control nodes and ``nvidia0`` only; in ``cpu-check``, ``False`` and no NVIDIA node.
Exit status 0 when both hold, 1 when not, 2 when this machine has no usable GPU (the worker's own line).
As of this writing it has not been run: no GPU machine was lent to the session that wrote it
(docs/leaderboard.md, "GPU rounds").
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from sqlalchemy import select

from assay.leaderboard import rounds, submissions
from assay.leaderboard.preflight import gpu_problem
from assay.leaderboard.worker import CannotWork, work
from assay.runner import LocalExecutor, gpu
from assay.store import Job, open_store

DETECTORS = Path(__file__).resolve().parents[1] / "detectors"
PROBE = """import argparse, json, os
p = argparse.ArgumentParser()
p.add_argument("mode", nargs="?")
for name in ("model_filepath", "result_filepath", "scratch_dirpath", "examples_dirpath",
             "round_training_dataset_dirpath", "metaparameters_filepath", "schema_filepath",
             "learned_parameters_dirpath", "source_dataset_dirpath"):
    p.add_argument("--" + name)
args = p.parse_args()
import torch
seen = {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "available": torch.cuda.is_available()}
seen["count"] = torch.cuda.device_count() if seen["available"] else 0
seen["device"] = torch.cuda.get_device_name(0) if seen["available"] else None
if seen["available"]:
    seen["sum_on_gpu"] = float(torch.ones(1024, device="cuda").sum())
seen["dev"] = sorted(os.listdir("/dev"))
seen["env"] = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH")}
print("torch.cuda.is_available() =", seen["available"], "| device:", seen["device"])
print(json.dumps(seen))
open(args.result_filepath, "w").write("0.5")
"""


def split_folder(root: Path) -> Path:
    """The smallest ``assay zoo split`` folder: one empty model per split (the detector never reads it)."""
    (root / "split.json").parent.mkdir(parents=True)
    (root / "split.json").write_text("{}")
    for split in ("train", "test", "holdout"):
        for view in (split,) if split == "train" else (split, f"{split}-sequestered"):
            model = root / view / "models" / "id-00000000"
            model.mkdir(parents=True)
            (model / "model.pt").write_bytes(b"")
            if view == split:
                (model / "ground_truth.csv").write_text("0\n")
        (root / split / "METADATA.csv").write_text("model_name,architecture,poisoned\nid-00000000,none,0\n")
    return root


def probe_detector(folder: Path) -> Path:
    """``detectors/constant`` with its entrypoint replaced by the torch probe."""
    shutil.copytree(DETECTORS / "constant", folder)
    (folder / "entrypoint.py").write_text(PROBE)
    return folder


def run(folder: Path, memory_gb: float) -> dict[str, dict]:
    """Both rounds through the real worker; what the detector printed in each, and its job's log."""
    sessions = open_store(f"sqlite:///{folder}/lb.db")
    with sessions.begin() as session:
        for name, gpus in (("gpu-check", 1), ("cpu-check", 0)):
            rounds.create_round(
                session, name, split_folder(folder / name), gpus=gpus, memory_bytes=int(memory_gb * 2**30)
            )
            rounds.set_status(session, name, "open")
        rounds.add_team(session, "check")
        detector = probe_detector(folder / "detector")
        for name in ("gpu-check", "cpu-check"):
            submissions.submit(session, folder / "artifacts", "check", name, "train", detector)
    try:
        work(sessions, LocalExecutor(1), once=True)
    except CannotWork as why:
        print(f"the worker could not run every job: {why}")
    found = {}
    with sessions() as session:
        for job in session.scalars(select(Job).order_by(Job.id)):
            name = job.submission.split.round.name
            outputs = [(r.stdout, r.stderr) for r in job.results]
            found[name] = {"status": job.status, "log": job.log, "outputs": outputs}
    return found


def verdict(found: dict[str, dict]) -> bool:
    """Whether the GPU round's detector had CUDA with one GPU and the CPU round's had none."""

    def seen(name: str) -> dict:
        for stdout, _ in found.get(name, {}).get("outputs", []):
            for line in stdout.splitlines():
                if line.startswith("{"):
                    return json.loads(line)
        return {}

    on_gpu, on_cpu = seen("gpu-check"), seen("cpu-check")
    nvidia = lambda s: [n for n in s.get("dev", []) if n.startswith("nvidia")]  # noqa: E731
    return (
        on_gpu.get("available") is True
        and on_gpu.get("count") == 1
        and "nvidia0" in nvidia(on_gpu)
        and "nvidia1" not in nvidia(on_gpu)
        and on_cpu.get("available") is False
        and nvidia(on_cpu) == []
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--memory-gb", type=float, default=16.0, help="The rounds' memory limit per run.")
    args = parser.parse_args()
    if why := gpu_problem("gpu-check", 1, gpu.discover()):
        print(why)
        return 2
    with tempfile.TemporaryDirectory(prefix="assay-gpu-check-") as folder:
        found = run(Path(folder), args.memory_gb)
    for name, job in found.items():
        print(f"== {name}: job {job['status']}")
        print(job["log"].strip())
        for stdout, stderr in job["outputs"]:
            print(stdout.strip() or "(no stdout)")
            if stderr.strip():
                print("stderr:", stderr.strip()[-2000:])
    ok = verdict(found)
    print("GPU path:", "works" if ok else "DOES NOT WORK as expected")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
