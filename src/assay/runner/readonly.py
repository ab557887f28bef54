"""Below bubblewrap: show a detector this machine's files read-only, with only its own folders writable.

Run as ``python -I -S readonly.py MODE SHM_BYTES FOLDER... -- ARGV...`` (standard library only, like
``collect.py``); it prepares the process and then becomes the detector (``exec``), so nothing of it stays.

- ``namespace`` (the ``unshare`` level, inside ``unshare --user --map-root-user --mount ...``): each FOLDER
  is bound onto itself, every mount of the namespace is made read-only (``mount_setattr``, recursive),
  then the FOLDERs and a private ``/dev/shm`` of SHM_BYTES are made writable again; every capability is
  dropped, bounding set included, so the detector (root of its user namespace only) cannot remount.
- ``user`` (the ``none`` level run by root): each FOLDER is given to a throwaway uid, under which the
  detector runs with only ``CAP_DAC_READ_SEARCH`` (it may read every file, as root could, but write only
  where that uid may: its folders and world-writable ones such as ``/tmp``) and no new privileges
  (a set-uid program gives it nothing).

Any step that fails ends the run with one line on stderr and exit status ``FAILED`` before the detector
starts: a run is never left writable by accident.
"""

import ctypes
import os
import secrets
import signal
import sys

FAILED = 126  # the read-only view could not be made: the detector never ran
NOT_STARTED = 127  # as a shell says of a missing program
_LIBC = ctypes.CDLL(None, use_errno=True)
_MS_BIND, _MS_REC, _MS_PRIVATE, _MS_NOSUID, _MS_NODEV = 0x1000, 0x4000, 0x40000, 0x2, 0x4
_SYS_MOUNT_SETATTR, _AT_FDCWD, _AT_RECURSIVE, _MOUNT_ATTR_RDONLY = 442, -100, 0x8000, 0x1
_PR_SET_PDEATHSIG, _PR_CAPBSET_DROP, _PR_SET_KEEPCAPS, _PR_SET_NO_NEW_PRIVS = 1, 24, 8, 38
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_RAISE = 47, 2
_CAP_DAC_READ_SEARCH = 2
_CAPS_V3 = 0x20080522
# A throwaway uid drawn for each run (the idea of systemd's DynamicUser), far above what passwd files, systemd
# and /etc/subuid hand out and below 2**31 (some tools take a uid as signed): concurrent runs cannot signal or
# trace each other, and no real user's files are theirs.
_UIDS = range(2_000_000_000, 2_140_000_000)


class _MountAttr(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("attr_set", "attr_clr", "propagation", "userns_fd")]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint32) for name in ("effective", "permitted", "inheritable")]


def _check(result: int, what: str) -> None:
    if result != 0:
        raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")


def _bytes(text: str | None) -> bytes | None:
    return None if text is None else os.fsencode(text)


def _mount(source: str | None, target: str, kind: str | None, flags: int, data: str | None = None) -> None:
    result = _LIBC.mount(_bytes(source), _bytes(target), _bytes(kind), ctypes.c_ulong(flags), _bytes(data))
    _check(result, f"mount {target}")


def _read_only(path: str, read_only: bool) -> None:
    """Set or clear read-only on ``path``'s mount and every mount below it."""
    attr = _MountAttr(_MOUNT_ATTR_RDONLY if read_only else 0, 0 if read_only else _MOUNT_ATTR_RDONLY, 0, 0)
    size = ctypes.c_size_t(ctypes.sizeof(attr))
    flags = ctypes.c_uint(_AT_RECURSIVE)
    result = _LIBC.syscall(_SYS_MOUNT_SETATTR, _AT_FDCWD, os.fsencode(path), flags, ctypes.byref(attr), size)
    _check(result, f"mount_setattr {path}")


def _set_caps(keep: int) -> None:
    """Effective, permitted and inheritable capabilities: ``keep`` (a mask of the low 32) and no other."""
    data = (_CapData * 2)(_CapData(keep, keep, keep), _CapData(0, 0, 0))
    _check(_LIBC.capset(ctypes.byref(_CapHeader(_CAPS_V3, 0)), data), "capset")


def _drop_bounding(keep: set[int]) -> None:
    """Remove every capability but ``keep`` from the bounding set: no exec can give them back."""
    with open("/proc/sys/kernel/cap_last_cap") as handle:
        last = int(handle.read())
    for cap in range(last + 1):
        if cap not in keep:
            _check(_LIBC.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap}")


def in_namespace(folders: list[str], shm_bytes: int) -> None:
    """The ``unshare`` level: the host read-only, ``folders`` and a private ``/dev/shm`` writable."""
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    for folder in folders:
        _mount(folder, folder, None, _MS_BIND | _MS_REC)
    shm = os.path.isdir("/dev/shm") and not any(f.startswith("/dev/shm/") for f in folders)
    if shm:
        _mount("tmpfs", "/dev/shm", "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={shm_bytes},mode=1777")
    _read_only("/", True)
    for folder in [*folders, *(["/dev/shm"] if shm else [])]:
        _read_only(folder, False)
    os.chdir(os.getcwd())  # onto the writable bind where the working folder is one of ours
    _drop_bounding(set())
    _check(_LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no new privileges")
    _set_caps(0)


def as_throwaway_user(folders: list[str]) -> None:
    """The ``none`` level run by root: a fresh uid that owns ``folders`` and may read, not write, the rest."""
    parent, uid = os.getppid(), secrets.choice(_UIDS)
    for folder in folders:
        os.chown(folder, uid, uid)
    _drop_bounding({_CAP_DAC_READ_SEARCH})
    _check(_LIBC.prctl(_PR_SET_KEEPCAPS, 1, 0, 0, 0), "keep capabilities")
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    _set_caps(1 << _CAP_DAC_READ_SEARCH)
    ambient = _LIBC.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_RAISE, _CAP_DAC_READ_SEARCH, 0, 0)
    _check(ambient, "keep reading every file")
    _check(_LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no new privileges")
    # a change of user clears the parent-death signal the harness set: set it again, then make sure the
    # harness did not die in between
    _check(_LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "parent-death signal")
    if os.getppid() != parent:
        raise OSError("the harness is gone")


def main(argv: list[str]) -> int:
    split = argv.index("--")
    mode, shm_bytes, folders, command = argv[0], int(argv[1]), argv[2:split], argv[split + 1 :]
    try:
        if mode == "namespace":
            in_namespace(folders, shm_bytes)
        elif mode == "user":
            as_throwaway_user(folders)
        else:
            raise OSError(f"unknown mode {mode!r}")
    except OSError as err:
        print(
            f"readonly.py: cannot give the detector a read-only view of this machine: {err}", file=sys.stderr
        )
        return FAILED
    try:
        os.execvp(command[0], command)
    except OSError as err:
        print(f"cannot start the detector: {err}", file=sys.stderr)
    return NOT_STARTED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
