"""bf16 only where the CPU runs it faster: flags decide on x86, a timed matmul elsewhere; a warning else."""

from __future__ import annotations

from assay.models import precision


def cpuinfo(tmp_path, flags: str):
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nmodel name\t: test\nflags\t\t: {flags}\n\nprocessor\t: 1\n")
    return path


def test_flags_are_read_and_decide_on_x86(tmp_path, monkeypatch, capsys):
    assert precision.cpu_flags(cpuinfo(tmp_path, "fpu sse avx2 fma")) == {"fpu", "sse", "avx2", "fma"}
    assert precision.cpu_flags(tmp_path / "missing") is None
    for flags, fast in [("avx2 fma", False), ("avx2 avx512f avx512_bf16", True), ("avx2 amx_bf16", True)]:
        monkeypatch.setattr(precision, "CPUINFO", cpuinfo(tmp_path, flags))
        monkeypatch.setattr(precision.cpu_flags, "__defaults__", (precision.CPUINFO,))
        precision.bf16_fast.cache_clear()
        assert precision.bf16_fast()[0] is fast
        assert precision.use_bf16(True) is fast and precision.use_bf16(False) is False
        warned = capsys.readouterr().err
        assert ("warning: --bf16 ignored, training in float32" in warned) is not fast
    precision.bf16_fast.cache_clear()


def test_without_flags_one_timed_matmul_decides(tmp_path, monkeypatch):
    assert precision.matmul_speedup(size=64, repeats=1) > 0
    monkeypatch.setattr(precision.cpu_flags, "__defaults__", (tmp_path / "missing",))
    for speedup, fast in [(0.2, False), (1.6, True)]:
        monkeypatch.setattr(precision, "matmul_speedup", lambda s=speedup: s)
        precision.bf16_fast.cache_clear()
        fast_here, why = precision.bf16_fast()
        assert fast_here is fast and "timed matmul" in why
    precision.bf16_fast.cache_clear()
