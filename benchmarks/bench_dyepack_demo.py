"""``make demo``'s DyePack part (``examples/dyepack-demo.sh``) over fresh keys: does it flag every time?

Each draw runs the whole script in its own folder, so ``prepare`` draws a new key from OS entropy every
time, as a newcomer's ``make demo`` does. The figures that count (issue 45): the contaminated model is
flagged in every draw, the clean one at most at the rate its false-positive rate allows, and the CPU time
of a draw (user + sys of the script and every process it starts, from ``getrusage(RUSAGE_CHILDREN)``;
the machine is often shared, so wall time is printed beside it with the load average).

    python benchmarks/bench_dyepack_demo.py --draws 20 --out /tmp/dyepack-draws

The de-quantised SmolLM2 is shared across draws (``ASSAY_MODEL_CACHE``): it depends only on the GGUF
file's bytes, and a newcomer pays for it once. A draw that fails (the script exits non-zero) is counted
and its last lines are printed; the run goes on. ``--jobs N`` runs N draws at a time with one BLAS thread
each (``OMP_NUM_THREADS=1``): on a shared machine two threads per draw mostly wait on each other, and the
property measured (flagged in every draw) does not depend on the thread count.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def machine() -> str:
    """The CPU model, its count, the flags that decide bf16, and what ``use_bf16`` concludes."""
    from assay.models.precision import BF16_FLAGS, bf16_fast, cpu_flags

    flags = cpu_flags() or set()
    model = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")),
        platform.processor(),
    )  # fmt: skip
    shown = [f for f in ("avx2", "avx512f", *BF16_FLAGS) if f in flags]
    fast, why = bf16_fast()
    return (
        f"{model}, {os.cpu_count()} CPUs, flags: {' '.join(shown) or 'none of avx2/avx512'}; "
        f"bf16 {'used' if fast else 'not used'}: {why}; load average {os.getloadavg()[0]:.1f}"
    )


def one_draw(out: Path, env: dict[str, str]) -> dict:
    """Run the demo's DyePack part once into ``out``; its verdicts, epochs and CPU and wall seconds: the
    CPU time of the script and every process it starts, from ``wait4`` on that one script, so draws that
    run at the same time are counted apart."""
    out.mkdir(parents=True, exist_ok=True)
    wall = time.perf_counter()
    with open(out / "stdout.log", "w") as stdout, open(out / "stderr.log", "w") as stderr:
        process = subprocess.Popen(
            ["bash", str(ROOT / "examples" / "dyepack-demo.sh"), str(out)],
            env=env,
            stdout=stdout,
            stderr=stderr,
        )
        _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - wall
    cpu = usage.ru_utime + usage.ru_stime
    done = subprocess.CompletedProcess(
        process.args,
        os.waitstatus_to_exitcode(status),
        (out / "stdout.log").read_text(encoding="utf-8", errors="replace"),
        (out / "stderr.log").read_text(encoding="utf-8", errors="replace"),
    )
    epochs = re.findall(r"Trained (\d+) epochs", done.stdout)
    checks = re.findall(r"after (\d+) epochs: (\d+)/(\d+) trained rows", done.stderr)
    draw = {
        "ok": done.returncode == 0,
        "cpu": cpu,
        "wall": wall,
        "epochs": int(epochs[-1]) if epochs else None,
    }
    draw["checks"] = [f"{e}:{a}/{n}" for e, a, n in checks]
    for name in ("verify-clean", "verify-contaminated"):
        summary = out / "dyepack" / name / "summary.json"
        draw[name] = json.loads(summary.read_text()) if summary.is_file() else None
    if not draw["ok"]:
        draw["tail"] = (done.stdout + done.stderr).strip().splitlines()[-5:]
    return draw


def verdict(summary: dict | None) -> str:
    if summary is None:
        return "none"
    return f"{summary['activated']}/{summary['backdoors']} FPR {summary['fpr']['fpr']:.2g}" + (
        " FLAGGED" if summary["flagged"] else ""
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--draws", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("/tmp/dyepack-draws"))
    parser.add_argument("--jobs", type=int, default=1, help="draws at a time (each with one BLAS thread)")
    args = parser.parse_args()
    print(machine(), flush=True)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "ASSAY_MODEL_CACHE": str(args.out / "model-cache"),
    }
    env.pop("ASSAY_HOME", None)  # each draw gets its own home (its own response cache) under its folder
    if args.jobs > 1:
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    print(f"{args.draws} draws, {args.jobs} at a time", flush=True)
    print("| draw | contaminated | clean | epochs | checks (epochs:rows taken) | CPU s | wall s | load |")
    print("|---:|---|---|---:|---|---:|---:|---:|")
    draws = []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(one_draw, args.out / f"draw-{i:02d}", env) for i in range(1, args.draws + 1)]
        for index, future in enumerate(futures, 1):
            draw = future.result()
            draws.append(draw)
            print(
                f"| {index} | {verdict(draw['verify-contaminated'])} | {verdict(draw['verify-clean'])} | "
                f"{draw['epochs']} | {' '.join(draw['checks'])} | {draw['cpu']:.0f} | {draw['wall']:.0f} | "
                f"{os.getloadavg()[0]:.1f} |",
                flush=True,
            )
            for line in draw.get("tail", []):
                print(f"    {line}", flush=True)
    flagged = sum(bool(d["verify-contaminated"] and d["verify-contaminated"]["flagged"]) for d in draws)
    false = sum(bool(d["verify-clean"] and d["verify-clean"]["flagged"]) for d in draws)
    alphas = [d["verify-clean"]["alpha"] for d in draws if d["verify-clean"]]
    cpu = [d["cpu"] for d in draws]
    print(
        f"\ncontaminated flagged in {flagged} of {len(draws)} draws; clean flagged in {false} "
        f"of {len(draws)} "
        f"(a clean model is flagged at most at rate alpha per draw: expected at most {sum(alphas):.2g}); "
        f"demo passed in {sum(d['ok'] for d in draws)} of {len(draws)}; CPU s per draw: median "
        f"{statistics.median(cpu):.0f}, max {max(cpu):.0f}"
    )


if __name__ == "__main__":
    main()
