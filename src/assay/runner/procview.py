"""The sandbox's ``/proc`` without host-wide counters: no channel between two runs on one machine.

A fresh ``/proc`` shows only the sandbox's own processes, but its global files are the kernel's: free memory
(``meminfo``, ``vmstat``, ``zoneinfo``, ``buddyinfo``), load and CPU time (``loadavg``, ``stat``,
``uptime``'s idle time, ``pressure/``, ``schedstat``), interrupts, disk and file-system statistics, open-file
and inode counts. Each moves when another run allocates, spins or writes, so one detector could signal
another through them (a test-split run passing its answers to a practice run). As LXCFS and Docker do, the
sandbox gets fixed files over the few that programs parse (``meminfo`` whose total, free and available
memory are the run's own limit, an idle ``loadavg``, a ``stat`` with every counter at zero and this
machine's CPUs, so ``os.cpu_count()`` still answers, an ``uptime`` of zero, no swap, ``cpuinfo`` with its
clock speed fixed) and empty ones over the rest. The files are written once per process and memory limit
into a private folder and bound read-only over ``/proc``: by bubblewrap (``proc_binds``) and by podman for
container images (``podman_flags``).

Left open, because bubblewrap cannot mask them: the ``sysinfo`` system call (free memory and load, for a
program that calls it directly), per-CPU packet counts in ``/proc/net/softnet_stat`` (``/proc/net`` is a
per-process link), and timing itself (a busy neighbour slows a run down).
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path

from assay.runner.workspace import OWNER_FILE, owner_is_dead, owner_line

PREFIX = "assay-proc-"

# Host-wide files that move with other runs and that nothing a detector needs parses: shown empty.
BLANK_FILES = (
    "allocinfo",
    "buddyinfo",
    "cgroups",
    "diskstats",
    "interrupts",
    "kcore",
    "key-users",
    "keys",
    "kmsg",
    "kpagecgroup",
    "kpagecount",
    "kpageflags",
    "latency_stats",
    "locks",
    "mdstat",
    "pagetypeinfo",
    "sched_debug",
    "schedstat",
    "slabinfo",
    "softirqs",
    "sysrq-trigger",
    "timer_list",
    "timer_stats",
    "vmallocinfo",
    "vmstat",
    "zoneinfo",
    "sys/fs/aio-nr",
    "sys/fs/dentry-negative",
    "sys/fs/dentry-state",
    "sys/fs/file-nr",
    "sys/fs/inode-nr",
    "sys/fs/inode-state",
    "sys/kernel/pty/nr",
    "sys/kernel/random/entropy_avail",
)
# Folders of host-wide statistics (pressure stall, file-system statistics, per-IRQ counts, ZFS): shown empty.
# Not ``driver/``: CUDA reads ``/proc/driver/nvidia`` (its parameters and capabilities), fixed per boot.
BLANK_DIRS = ("fs", "irq", "pressure", "spl", "sys/fs/quota")
FAKED = ("meminfo", "loadavg", "stat", "uptime", "swaps", "cpuinfo")
_EMPTY_FILE, _EMPTY_DIR = ".empty", ".empty-dir"


def _read(name: str) -> str:
    try:
        return Path("/proc", name).read_text()
    except OSError:
        return ""


def meminfo(memory_bytes: int | None) -> str:
    """The host's meminfo fields, all zero but total, free and available memory: the run's limit (at most
    this machine's memory) and the huge page size."""
    lines = [line.split(":", 1) for line in _read("meminfo").splitlines() if ":" in line]
    fields = {key: value.split() for key, value in lines}
    total = int(fields.get("MemTotal", ["0"])[0])
    shown = total if memory_bytes is None else min(total, memory_bytes // 1024)
    out = []
    for key, value in fields.items():
        number = shown if key in ("MemTotal", "MemFree", "MemAvailable") else 0
        number = int(value[0]) if key == "Hugepagesize" else number
        unit = " kB" if value[1:] == ["kB"] else ""
        out.append(f"{key + ':':<16}{number:>8}{unit}")
    return "\n".join(out) + "\n"


def proc_stat() -> str:
    """Every counter at zero, one ``cpuN`` line per CPU of this machine (glibc counts them for
    ``os.cpu_count()`` where ``/sys`` is missing, as in the sandbox), and the boot time, fixed per boot."""
    host = _read("stat").splitlines()
    cpus = [line.split()[0] for line in host if re.match(r"cpu\d+ ", line)]
    btime = next((line for line in host if line.startswith("btime ")), "btime 0")
    zero = " 0" * 10
    lines = [f"cpu {zero}", *(f"{cpu}{zero}" for cpu in cpus), "intr 0", "ctxt 0", btime]
    lines += ["processes 0", "procs_running 1", "procs_blocked 0", "softirq" + " 0" * 11]
    return "\n".join(lines) + "\n"


def cpuinfo() -> str:
    """The host's CPU description with every ``cpu MHz`` fixed to the first one read (the clock of a core
    rises with its load)."""
    text = _read("cpuinfo")
    found = re.search(r"^cpu MHz\s*:\s*(\S+)", text, flags=re.M)
    if found is None:
        return text
    return re.sub(r"^(cpu MHz\s*:\s*)\S+", lambda m: m.group(1) + found.group(1), text, flags=re.M)


def contents(memory_bytes: int | None) -> dict[str, str]:
    """The faked files by name."""
    return {
        "meminfo": meminfo(memory_bytes),
        "loadavg": "0.00 0.00 0.00 1/1 1\n",
        "stat": proc_stat(),
        "uptime": "0.00 0.00\n",
        "swaps": "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n",
        "cpuinfo": cpuinfo(),
    }


_HOMES: list[Path] = []


def _home() -> Path:
    """This process's private folder of views, removed at exit; a fresh one (never the old name, which
    someone else may hold by now) should a temp-dir cleaner have removed it. Folders of processes that
    died without exiting (SIGKILL) are swept first, as the workspace sweeps its task folders."""
    if not _HOMES or not _own_folder(_HOMES[-1]):
        sweep_stale(Path(tempfile.gettempdir()))
        home = Path(tempfile.mkdtemp(prefix=PREFIX))
        (home / OWNER_FILE).write_text(owner_line())
        _HOMES.append(home)
        atexit.register(shutil.rmtree, home, True)
    return _HOMES[-1]


def sweep_stale(base: Path) -> list[Path]:
    """Remove view folders under ``base`` left by dead processes of this host and user."""
    removed = []
    for folder in base.glob(f"{PREFIX}*"):
        try:
            owner = (folder / OWNER_FILE).read_text()
        except OSError:
            continue
        if _own_folder(folder) and owner_is_dead(owner):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _own_folder(path: Path) -> bool:
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()


def view_folder(memory_bytes: int | None) -> Path:
    """The folder of fixed files for ``memory_bytes``, written once (again, should a temp-dir cleaner have
    removed it)."""
    folder = _home() / str(memory_bytes or "host")
    if (folder / _EMPTY_DIR).is_dir():
        return folder
    staging = Path(tempfile.mkdtemp(dir=_home()))
    for name, text in contents(memory_bytes).items():
        (staging / name).write_text(text)
    (staging / _EMPTY_FILE).write_text("")
    (staging / _EMPTY_DIR).mkdir()
    os.chmod(staging, 0o755)
    try:
        staging.rename(folder)
    except OSError:  # another thread wrote it first, or an old one is in the way
        shutil.rmtree(staging, ignore_errors=True)
        if not (folder / _EMPTY_DIR).is_dir():
            raise
    return folder


def fixed_files(memory_bytes: int | None) -> list[tuple[Path, str]]:
    """(host file, ``/proc`` path) of each fixed file this kernel has a ``/proc`` file for."""
    folder = view_folder(memory_bytes)
    return [(folder / name, f"/proc/{name}") for name in FAKED if os.path.isfile(f"/proc/{name}")]


def blanked() -> list[str]:
    """The ``/proc`` files and folders to show empty, of those this kernel has (no mount point can be made
    in ``/proc``)."""
    files = [f"/proc/{name}" for name in BLANK_FILES if os.path.lexists(f"/proc/{name}")]
    return files + [f"/proc/{name}" for name in BLANK_DIRS if os.path.isdir(f"/proc/{name}")]


def proc_binds(memory_bytes: int | None) -> list[str]:
    """bubblewrap arguments that lay the fixed files and empty ones over ``/proc`` (after ``--proc``)."""
    folder = view_folder(memory_bytes)
    pairs = [(str(source), target) for source, target in fixed_files(memory_bytes)]
    pairs += [
        (str(folder / (_EMPTY_DIR if os.path.isdir(path) else _EMPTY_FILE)), path) for path in blanked()
    ]
    return [arg for source, target in pairs for arg in ("--ro-bind", source, target)]


def podman_flags(memory_bytes: int | None) -> list[str]:
    """The same view for ``podman run``: the fixed files bound (runc allows these, the ones LXCFS fakes),
    the rest masked (podman shows a masked file empty and a masked folder as an empty read-only tmpfs)."""
    flags = [
        arg
        for source, target in fixed_files(memory_bytes)
        for arg in ("--mount", f"type=bind,src={source},dst={target},ro=true")
    ]
    return [*flags, "--security-opt", "mask=" + ":".join(blanked())]
