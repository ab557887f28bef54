"""Container submissions: the test image's build time, and milliseconds per model for the same detector run
as a folder (``run_task`` in the best sandbox here, bwrap) and as an OCI image (podman with runc).

The detector is the one of ``tests/container_image.py`` (reads ``model.safetensors``, writes a probability);
the folder form is the same two files staged as a folder detector. The image is built from this host's
Python (``--fresh`` removes the cached tag first, so the figure includes ``podman import``), saved as a
docker-archive, and loaded into the runner's private storage by the first container task (reported
apart). The modes then take turns model by model.

    python benchmarks/bench_container.py --models 20 --fresh
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def _models(root: Path, count: int) -> list[Path]:
    """Model folders as the harness stages them, each with a small .safetensors of its own."""
    folders = []
    for index in range(count):
        folder = root / f"id-{index:08d}"
        (folder / "clean-example-data").mkdir(parents=True)
        values = [((index * 7919 + i) % 1000) / 1000 - 0.5 for i in range(4096)]
        header = json.dumps(
            {"w": {"dtype": "F32", "shape": [len(values)], "data_offsets": [0, 4 * len(values)]}}
        )
        (folder / "model.safetensors").write_bytes(
            struct.pack("<Q", len(header)) + header.encode() + struct.pack(f"<{len(values)}f", *values)
        )
        (folder / "model.pt").write_bytes(b"\0" * 64)
        folders.append(folder)
    return folders


def _folder_detector(root: Path) -> Path:
    """The image's detector as a folder: entrypoint.py, its module beside it, metaparameters, learned."""
    from container_image import ENTRYPOINT, METAPARAMETERS, SCHEMA, WEIGHTSTAT

    folder = root / "detector"
    (folder / "learned_parameters").mkdir(parents=True)
    (folder / "entrypoint.py").write_text(ENTRYPOINT)
    (folder / "weightstat.py").write_text(WEIGHTSTAT)
    (folder / "metaparameters.json").write_text(json.dumps(METAPARAMETERS))
    (folder / "metaparameters_schema.json").write_text(json.dumps(SCHEMA))
    (folder / "learned_parameters" / "scale.json").write_text(json.dumps({"scale": 40.0}))
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", type=int, default=20)
    parser.add_argument("--fresh", action="store_true", help="rebuild the image even if its tag exists")
    args = parser.parse_args()

    from assay.runner import Limits, Task, isolation_available, run_task
    from assay.runner.container import podman_missing
    from container_image import build_image, rootfs

    if reason := podman_missing():
        print(f"skipped: podman: {reason}")
        return
    with tempfile.TemporaryDirectory(prefix="bench-container-") as scratch:
        root = Path(scratch)
        if args.fresh:
            import hashlib

            layer = rootfs(root / "probe-rootfs.tar")
            tag = "localhost/assay-test-detector:" + hashlib.sha256(layer.read_bytes()).hexdigest()[:12]
            subprocess.run(["podman", "rmi", "--force", tag], capture_output=True, check=False)
        built = build_image(root / "image")
        detector, models = _folder_detector(root), _models(root / "models", args.models)
        trojai = [
            *("--model_filepath", "{input}/model.pt", "--result_filepath", "{output}/result.txt"),
            *("--scratch_dirpath", "{scratch}", "--examples_dirpath", "{input}/clean-example-data"),
            *("--round_training_dataset_dirpath", "{scratch}"),
            *("--metaparameters_filepath", "{input}/detector/metaparameters.json"),
            *("--schema_filepath", "{input}/detector/metaparameters_schema.json"),
            *("--learned_parameters_dirpath", "{input}/detector/learned_parameters"),
        ]

        def task(model: Path, image: str | None) -> Task:
            stage = {"detector": detector, **{p.name: p for p in model.iterdir()}}
            argv = [sys.executable, "{input}/detector/entrypoint.py", *trojai]
            return Task(model.name, argv, stage=stage, limits=Limits(wall_seconds=120), image=image)

        start = time.perf_counter()
        first = run_task(task(models[0], str(built.docker_archive)))
        load_ms = 1000 * (time.perf_counter() - start)
        assert first.ok, first.stderr
        modes = {f"folder ({isolation_available()})": None, "image (podman, runc)": str(built.docker_archive)}
        times: dict[str, list[float]] = {name: [] for name in modes}
        answers: dict[str, list[bytes | None]] = {name: [] for name in modes}
        for model in models:
            for name, image in modes.items():
                begin = time.perf_counter()
                result = run_task(task(model, image))
                times[name].append(1000 * (time.perf_counter() - begin))
                answers[name].append(result.outputs["result.txt"])
        assert len(set(map(tuple, answers.values()))) == 1, "the two forms disagree"
        archive_mib = built.docker_archive.stat().st_size / 2**20

    print(
        f"image: {archive_mib:.1f} MiB docker-archive, built in "
        f"{built.build_seconds:.2f} s ({'fresh' if args.fresh else 'tag reused if present'}); "
        f"first container task (loads the archive) {load_ms:.0f} ms; {os.cpu_count()} CPUs"
    )
    print(f"{args.models} models per mode, modes interleaved, identical answers")
    base = statistics.median(next(iter(times.values())))
    print(f"{'mode':<22} {'median ms':>10} {'p90 ms':>8} {'overhead ms':>12} {'ratio':>7}")
    for name, values in times.items():
        median, p90 = statistics.median(values), statistics.quantiles(values, n=10)[-1]
        print(f"{name:<22} {median:>10.1f} {p90:>8.1f} {median - base:>12.1f} {median / base:>6.2f}x")


if __name__ == "__main__":
    main()
