"""CPU time of ``make demo``'s DyePack part (``examples/dyepack-demo.sh``), with the CPU's flags printed.

The goal (issue 26) is under 5 minutes on 2 quiet AVX2 cores without bf16 support. The machine this runs
on is often shared, so the figure that counts is CPU time (user + sys of the script and every process it
starts, from ``getrusage(RUSAGE_CHILDREN)``), not wall time; both are printed, with the load average.

    python benchmarks/bench_dyepack_demo.py --out /tmp/dyepack-demo

The demo must still end with the contaminated model flagged and the clean one not; the script checks the
two ``summary.json`` files and says so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/dyepack-demo"))
    args = parser.parse_args()
    print(machine(), flush=True)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter()
    subprocess.run(["bash", str(ROOT / "examples" / "dyepack-demo.sh"), str(args.out)], check=True, env=env)
    wall = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    results = {
        name: json.loads((args.out / "dyepack" / name / "summary.json").read_text())
        for name in ("verify-clean", "verify-contaminated")
    }
    ok = results["verify-contaminated"]["flagged"] and not results["verify-clean"]["flagged"]
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")
    print("| run | CPU (user+sys) | user | sys | wall | contaminated | clean | goal: < 5 CPU min |")
    print("|---|---:|---:|---:|---:|---|---|---|")
    verdict = lambda s: f"{s['activated']}/{s['backdoors']}, FPR {s['fpr']['fpr']:.3g}"  # noqa: E731
    print(
        f"| dyepack-demo.sh | {(user + system) / 60:.2f} min | {user / 60:.2f} min | {system / 60:.2f} min | "
        f"{wall / 60:.2f} min | {verdict(results['verify-contaminated'])} | "
        f"{verdict(results['verify-clean'])} | {'met' if user + system < 300 else 'NOT met'} |"
    )
    print("OK: contaminated flagged, clean not" if ok else "NOT OK: the demo's verdicts are wrong")


if __name__ == "__main__":
    main()
