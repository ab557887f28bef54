"""The sandbox's second wall (issue 44): sysinfo(2) is refused inside, so no run reads the host's memory,
process count or load through it.

``/proc``'s host-wide files are fixed inside (``test_runner_channels``), but sysinfo answers from the
kernel: a practice detector calling it through ctypes read free and shared memory, the process count and
the load of the whole machine, and decoded 16 of 16 hash slots from a concurrent test job of its team.
Here a detector calls it both through glibc and as a raw system call; before the filter both returned 0
with the host's numbers, now both fail with EPERM and leave the buffer as it was. The filter program itself
is checked with a small classic-BPF interpreter on every ABI it names (i386's ``int 0x80`` included).
"""

from __future__ import annotations

import errno
import json
import struct
import sys
from pathlib import Path

import pytest

from assay.runner import Limits, Task, isolation_available, run_task, seccomp

LEVEL = isolation_available()
needs_bwrap = pytest.mark.skipif(LEVEL != "bwrap", reason=f"needs bwrap; best isolation here is {LEVEL}")

PROBE = """
import ctypes, ctypes.util, json, os, platform, sys
libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
seen = {}
for how in ("glibc", "raw"):
    buffer = ctypes.create_string_buffer(256)  # struct sysinfo, with room to spare, all zero
    if how == "glibc":
        answer = libc.sysinfo(buffer)
    else:
        number = {"x86_64": 99, "aarch64": 179}[platform.machine()]
        answer = libc.syscall(number, buffer)
    seen[how] = {"answer": answer, "errno": ctypes.get_errno(), "nonzero": any(buffer.raw)}
open(sys.argv[1] + "/result.txt", "w").write(json.dumps(seen))
"""


def run_filter(program: bytes, arch: int, nr: int) -> int:
    """What the classic BPF ``program`` returns for a system call ``nr`` entered through ABI ``arch``
    (only the instructions the filter uses: load word, and, jump if equal, return)."""
    data = struct.pack("=iI", nr, arch) + bytes(56)  # struct seccomp_data: nr, arch, ip, args
    insns = [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == seccomp.LOAD:
            acc = struct.unpack_from("=I", data, k)[0]
        elif code == seccomp.AND:
            acc &= k
        elif code == seccomp.JUMP_IF_EQUAL:
            pc += jt if acc == k else jf
        elif code == seccomp.RETURN:
            return k
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")
        pc += 1


REFUSED = seccomp.SECCOMP_RET_ERRNO | errno.EPERM


@pytest.mark.parametrize(
    ("machine", "arch", "nr", "refused"),
    [
        ("x86_64", seccomp.AUDIT_ARCH_X86_64, 99, True),  # sysinfo
        ("x86_64", seccomp.AUDIT_ARCH_X86_64, 99 | seccomp.X32_SYSCALL_BIT, True),  # the x32 ABI's
        ("x86_64", seccomp.AUDIT_ARCH_I386, 116, True),  # int 0x80 from a 64-bit process
        ("x86_64", seccomp.AUDIT_ARCH_X86_64, 0, False),  # read
        ("x86_64", seccomp.AUDIT_ARCH_X86_64, 116, False),  # setgroups: 116 only means sysinfo on i386
        ("x86_64", seccomp.AUDIT_ARCH_I386, 99, False),
        ("aarch64", seccomp.AUDIT_ARCH_AARCH64, 179, True),
        ("aarch64", seccomp.AUDIT_ARCH_ARM, 116, True),
        ("aarch64", seccomp.AUDIT_ARCH_AARCH64, 99, False),
    ],
)
def test_the_filter_refuses_sysinfo_on_every_abi_and_nothing_else(
    machine: str, arch: int, nr: int, refused: bool
) -> None:
    program = seccomp.refuse_sysinfo(machine)
    assert program is not None
    assert run_filter(program, arch, nr) == (REFUSED if refused else seccomp.SECCOMP_RET_ALLOW)


def test_an_unknown_machine_gets_no_filter() -> None:
    assert seccomp.refuse_sysinfo("riscv64") is None


@needs_bwrap
def test_sysinfo_is_refused_inside_the_sandbox(tmp_path: Path) -> None:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    task = Task(
        "probe",
        [sys.executable, "{input}/probe.py", "{output}"],
        stage={"probe.py": script},
        limits=Limits(wall_seconds=60, memory_bytes=2 * 2**30),
        require_isolation=True,
    )
    result = run_task(task)
    assert result.ok, result.stderr
    seen = json.loads(result.outputs["result.txt"])
    print(f"\nsysinfo inside the sandbox: {seen}")
    for how in ("glibc", "raw"):  # before: answer 0, the host's numbers in the buffer
        assert seen[how] == {"answer": -1, "errno": errno.EPERM, "nonzero": False}, how
    assert "sysinfo refused (seccomp)" in result.isolation
