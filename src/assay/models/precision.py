"""Whether bfloat16 is worth using on this CPU: ``bf16_fast()`` and ``use_bf16()``.

Why: bf16 autocast is about 1.7x faster than float32 where the CPU multiplies bf16 natively (AVX512-BF16,
AMX), and about 6x *slower* where it does not: on an AVX2 CPU torch converts every bf16 operand in software
(7.4 GFLOP/s per CPU-second against 45.2 for float32, issue 26). A recipe that asks for ``--bf16`` must not
silently cost a user six times the time, so it is checked once per process: the CPU's flags when
``/proc/cpuinfo`` names them, otherwise one timed matmul in each precision.
"""

from __future__ import annotations

import functools
import sys
import time
from pathlib import Path

BF16_FLAGS = ("avx512_bf16", "amx_bf16")
CPUINFO = Path("/proc/cpuinfo")


def cpu_flags(cpuinfo: Path = CPUINFO) -> set[str] | None:
    """The CPU's feature flags (``flags`` on x86, ``Features`` on Arm), or None where they cannot be read."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() in ("flags", "Features"):
            return set(value.split())
    return None


def matmul_speedup(size: int = 512, repeats: int = 3) -> float:
    """float32 time / bf16 time of a ``size``-square matmul (best of ``repeats``); above 1: bf16 is faster."""
    import torch

    a = torch.randn(size, size)
    b = torch.randn(size, size)

    def best(x, y) -> float:
        times = []
        for _ in range(repeats + 1):  # the first call warms the kernels up and is not counted
            started = time.perf_counter()
            x @ y
            times.append(time.perf_counter() - started)
        return min(times[1:])

    return best(a, b) / best(a.bfloat16(), b.bfloat16())


@functools.cache
def bf16_fast() -> tuple[bool, str]:
    """(is bf16 faster than float32 here, why we think so). x86 flags decide when readable: without
    AVX512-BF16 or AMX, bf16 matmuls are emulated. Elsewhere (Arm, macOS) one timed matmul decides."""
    flags = cpu_flags()
    if flags is not None and ("avx2" in flags or "avx512f" in flags):
        native = [f for f in BF16_FLAGS if f in flags]
        if native:
            return True, f"the CPU has {', '.join(native)}"
        return False, "the CPU has no AVX512-BF16 or AMX (bf16 matmuls run emulated, several times slower)"
    speedup = matmul_speedup()
    verdict = "faster" if speedup > 1.1 else "not faster"
    return speedup > 1.1, f"a timed matmul ran {speedup:.2f}x as fast in bf16 ({verdict} than float32)"


def use_bf16(requested: bool) -> bool:
    """``requested`` where bf16 is faster here; otherwise False, with a warning on stderr saying why."""
    if not requested:
        return False
    fast, why = bf16_fast()
    if not fast:
        print(f"warning: --bf16 ignored, training in float32: {why}", file=sys.stderr, flush=True)
    return fast
