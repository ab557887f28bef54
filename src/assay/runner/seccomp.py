"""A second wall in the sandbox: a seccomp filter that refuses sysinfo(2).

Two runs on one machine share its kernel. ``procview`` fixes ``/proc``'s host-wide files, but the
``sysinfo`` system call answers from the kernel directly: free and shared memory, the process count and the
load, all moving with whatever else runs on the host (issue 44: a practice detector decoded 16 of 16 hash
slots from a concurrent test job of its team writing slot-sized files into its scratch). Exclusive hosts
for sealed runs are the first wall; this is the second: bubblewrap loads the filter (``--seccomp FD``,
after ``no_new_privs``) before it starts the collector, so every process of the sandbox gets ``EPERM``
from sysinfo and nothing of the host. Everything else is allowed as before.

The program is classic BPF written out here (no libseccomp binding is installed, and it is ten
instructions): for each ABI the machine can enter the kernel with (x86-64 with and without the x32 bit,
and i386 through ``int 0x80``; arm64 and 32-bit arm), "if this ABI and sysinfo's number there: refuse".
An ABI not listed is allowed through, which is safe because it is not one this machine's kernel offers.

A container image run by podman gets the same refusal through podman's own seccomp profile
(``podman_profile``: the engine's default with sysinfo taken out of its allow-list and refused with
``EPERM``), passed as ``--security-opt seccomp=FILE``.

What it costs: ``sysconf(_SC_PHYS_PAGES)`` and ``_SC_AVPHYS_PAGES`` (glibc answers them with sysinfo)
are meaningless inside; ``/proc/meminfo`` (the run's memory limit, ``procview``) is the way to ask.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import platform
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

# linux/audit.h
AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_I386 = 0x40000003
AUDIT_ARCH_AARCH64 = 0xC00000B7
AUDIT_ARCH_ARM = 0x40000028
X32_SYSCALL_BIT = 0x40000000
# (ABI, sysinfo's number in it, the mask applied to the number first) for each machine
SYSINFO: dict[str, list[tuple[int, int, int]]] = {
    "x86_64": [(AUDIT_ARCH_X86_64, 99, 0xFFFFFFFF & ~X32_SYSCALL_BIT), (AUDIT_ARCH_I386, 116, 0xFFFFFFFF)],
    "aarch64": [(AUDIT_ARCH_AARCH64, 179, 0xFFFFFFFF), (AUDIT_ARCH_ARM, 116, 0xFFFFFFFF)],
}
# struct seccomp_data: int nr; __u32 arch; ...
NR_OFFSET, ARCH_OFFSET = 0, 4
# classic BPF: BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_ALU|BPF_AND|BPF_K, BPF_RET|BPF_K
LOAD, JUMP_IF_EQUAL, AND, RETURN = 0x20, 0x15, 0x54, 0x06
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
BLOCK = 5  # instructions per ABI
SECCOMP_FD = (
    "{seccomp_fd}"  # the placeholder of bubblewrap's ``--seccomp`` argument (``process.run_limited``)
)


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    """One ``struct sock_filter``: u16 code, u8 jt, u8 jf, u32 k, in the machine's byte order."""
    return struct.pack("=HBBI", code, jt, jf, k)


def refuse_sysinfo(machine: str | None = None) -> bytes | None:
    """The filter program for ``machine`` (this one by default); None where its ABIs are not known here."""
    abis = SYSINFO.get(machine or platform.machine())
    if abis is None:
        return None
    refuse_at = BLOCK * len(abis) + 1  # after every block and the allow
    program = []
    for i, (arch, number, mask) in enumerate(abis):
        start = BLOCK * i
        program += [
            _insn(LOAD, ARCH_OFFSET),
            _insn(JUMP_IF_EQUAL, arch, jt=0, jf=3),  # another ABI: on to the next block
            _insn(LOAD, NR_OFFSET),
            _insn(AND, mask),
            _insn(JUMP_IF_EQUAL, number, jt=refuse_at - (start + 4) - 1, jf=0),
        ]
    program += [_insn(RETURN, SECCOMP_RET_ALLOW), _insn(RETURN, SECCOMP_RET_ERRNO | errno.EPERM)]
    return b"".join(program)


def filter_fd() -> int | None:
    """An open, rewound memory file holding this machine's program, for bubblewrap's ``--seccomp FD``
    (the caller passes it to the child and closes it); None where no program is known for this machine."""
    program = refuse_sysinfo()
    if program is None:
        return None
    fd = os.memfd_create("assay-seccomp")  # close-on-exec: only the child it is passed to holds it
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


@contextlib.contextmanager
def filled(argv: list[str]) -> Iterator[tuple[list[str], tuple[int, ...]]]:
    """``argv`` with its ``SECCOMP_FD`` placeholder (bubblewrap's ``--seccomp``) replaced by an open memory
    file holding the program, and the descriptors the child must inherit; closed when the block ends. A
    command line with no placeholder comes back as it is."""
    if SECCOMP_FD not in argv:
        yield argv, ()
        return
    fd = filter_fd()
    if fd is None:  # the sandbox asked for a program this machine has none of: a bug, not the detector's
        raise RuntimeError("no seccomp program for this machine")
    try:
        yield [str(fd) if arg == SECCOMP_FD else arg for arg in argv], (fd,)
    finally:
        os.close(fd)


# Where podman keeps its default profile: the administrator's copy first, then containers-common's.
PODMAN_PROFILES = (Path("/etc/containers/seccomp.json"), Path("/usr/share/containers/seccomp.json"))


def refusing_sysinfo(profile: dict) -> dict:
    """An OCI seccomp profile like ``profile`` but for sysinfo: out of every rule that allows it, and
    refused with EPERM by a rule of its own."""
    rules = []
    for rule in profile.get("syscalls", []):
        names = [name for name in rule.get("names", []) if name != "sysinfo"]
        if names or not rule.get("names"):
            rules.append({**rule, "names": names} if "names" in rule else rule)
    rules.append({"names": ["sysinfo"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM})
    return {**profile, "syscalls": rules}


def podman_profile(sources: tuple[Path, ...] = PODMAN_PROFILES) -> Path | None:
    """podman's default profile refusing sysinfo, written once per content into the temporary folder (a
    file podman reads at each run); None where this machine has no default profile to start from."""
    source = next((path for path in sources if path.is_file()), None)
    if source is None:
        return None
    text = json.dumps(refusing_sysinfo(json.loads(source.read_text())), sort_keys=True)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / f"assay-seccomp-{digest}.json"
    if not path.is_file():
        partial = path.with_name(f"{path.name}.{os.getpid()}")
        partial.write_text(text)
        partial.replace(path)  # whole or not at all: another worker may read it at the same moment
    return path
