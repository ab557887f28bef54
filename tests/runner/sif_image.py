"""SIF images written in the tests, with no apptainer: a header, a descriptor table and data objects.

The writer spells the layout out on its own (``pkg/sif`` of github.com/apptainer/sif: a 128-byte header,
585-byte descriptors, partitions aligned to 4096 bytes), so the reader under test is checked against the
format, not against itself. ``build_sif`` makes a runnable image: the OCI test image's root file system
(``tests/container_image.py``: this host's Python and the libraries it links, the weight-spread detector
with its own ``weightstat`` module on ``/opt/lib``), plus ``/bin/sh``, ``/.singularity.d/runscript`` and
environment scripts as ``apptainer build`` writes them, squashed by ``mksquashfs``.

Import it from another folder's tests with ``sys.path`` pointing here (``tests/runner`` has no package).
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from container_image import _libraries, rootfs

HEADER = struct.Struct("<32s10s3s3s16s8q")
DESCRIPTOR = struct.Struct("<i?IIIqqqqqqq128s384s")
GROUP = 0xF0000000
PARTITION, SIGNATURE, GENERIC_JSON = 0x4004, 0x4005, 0x4006
SQUASHFS, EXT3, RAW, ENCRYPTED_SQUASHFS, GOCRYPTFS = 1, 2, 4, 5, 6
SYSTEM, PRIMARY_SYSTEM, DATA = 1, 2, 3
AMD64 = b"02"
FINGERPRINT = bytes.fromhex("0123456789ABCDEF0123456789ABCDEF01234567")
RUNSCRIPT = '#!/bin/sh\nexec python3 /entrypoint.py "$@"\n'
ENV_SCRIPTS = {  # sourced in name order: 10 then 90; HOME is the harness's to set, not the image's
    "01-base.sh": "#!/bin/sh\n# apptainer writes this one empty\n",
    "10-first.sh": "export ASSAY_SIF_ORDER=10\nexport HOME=/nonexistent\n",
    "90-environment.sh": 'export PYTHONPATH=/opt/lib\nexport ASSAY_SIF_ORDER="$ASSAY_SIF_ORDER,90"\n',
}


@dataclass(frozen=True)
class SifObject:
    """One data object: its type, bytes and descriptor fields (``group`` None: in no group)."""

    data_type: int
    data: bytes
    group: int | None = 1
    link: int = 0
    link_group: bool = False
    extra: bytes = b""
    name: bytes = b""
    align: int = 1


def partition_extra(fs: int = SQUASHFS, part: int = PRIMARY_SYSTEM, arch: bytes = AMD64) -> bytes:
    """A partition's type-specific bytes: file system, partition type, architecture."""
    return struct.pack("<ii3s", fs, part, arch + b"\0")


def signature_extra(fingerprint: bytes = FINGERPRINT, hash_type: int = 1) -> bytes:
    """A signature's type-specific bytes: hash type and the signing entity (the key fingerprint first)."""
    return struct.pack("<i256s", hash_type, fingerprint)


def pgp_signature(text: str = "{}") -> bytes:
    """Bytes shaped like an OpenPGP clear-signed message (not a real signature: nothing verifies it)."""
    head = "-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA256\n\n"
    return f"{head}{text}\n-----BEGIN PGP SIGNATURE-----\n".encode()


def sif_bytes(
    objects: list[SifObject],
    *,
    arch: bytes = AMD64,
    descriptors: int = 48,
    magic: bytes = b"SIF_MAGIC\0",
    version: bytes = b"01\0",
) -> bytes:
    """A whole SIF file: header, descriptor table at 4096, data objects after it (partitions aligned)."""
    table = 4096
    data_start = table + descriptors * DESCRIPTOR.size
    body = bytearray()
    rows = []
    for number, item in enumerate(objects, start=1):
        offset = data_start + len(body)
        padding = (-offset) % item.align
        body += bytes(padding) + item.data
        offset += padding
        group = GROUP | (item.group or 0)
        link = (GROUP if item.link_group else 0) | item.link
        rows.append(
            DESCRIPTOR.pack(
                item.data_type,
                True,
                number,
                group,
                link,
                offset,
                len(item.data),
                len(item.data) + padding,
                0,
                0,
                0,
                0,
                item.name,
                item.extra,
            )
        )
    rows += [bytes(DESCRIPTOR.size)] * (descriptors - len(objects))
    header = HEADER.pack(
        b"#!/usr/bin/env run-singularity\n", magic, version, arch + b"\0", bytes(range(16)),
        0, 0, descriptors - len(objects), descriptors, table, descriptors * DESCRIPTOR.size,
        data_start, len(body),
    )  # fmt: skip
    return header + bytes(table - len(header)) + b"".join(rows) + bytes(body)


def write_sif(path: Path, objects: list[SifObject], **fields) -> Path:
    path.write_bytes(sif_bytes(objects, **fields))
    return path


def squash(root: Path, target: Path) -> bytes:
    """``mksquashfs`` of ``root``, reproducibly (fixed times, root-owned, no extended attributes)."""
    target.unlink(missing_ok=True)
    subprocess.run(
        [
            "mksquashfs", str(root), str(target), "-noappend", "-quiet", "-no-progress", "-no-xattrs",
            "-all-root", "-mkfs-time", "0", "-all-time", "0",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return target.read_bytes()


def image_root(folder: Path) -> Path:
    """The runnable image's root: the OCI test image's files, a shell and the ``.singularity.d`` folder."""
    root = folder / "root"
    if root.exists():
        shutil.rmtree(root)
    with tarfile.open(rootfs(folder / "rootfs.tar")) as archive:
        archive.extractall(root, filter="fully_trusted")  # our own tar, with absolute links the image keeps
    shell = Path("/bin/sh").resolve()
    for library in _libraries([shell]):
        place = root / str(library).lstrip("/")
        if not place.exists() and not place.is_symlink():
            place.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(library.resolve(), place)
    (root / "bin").mkdir(exist_ok=True)
    shutil.copy2(shell, root / "bin" / "sh")
    meta = root / ".singularity.d"
    (meta / "env").mkdir(parents=True)
    (meta / "runscript").write_text(RUNSCRIPT)
    (meta / "runscript").chmod(0o755)
    for name, text in ENV_SCRIPTS.items():
        (meta / "env" / name).write_text(text)
        (meta / "env" / name).chmod(0o755)
    os.symlink("/etc/hostname", root / "opt" / "host-link")  # absolute: resolved inside the image
    return root


def build_sif(folder: Path, signed: bool = True) -> Path:
    """The runnable ``detector.sif`` under ``folder`` (a few seconds: the root is copied and squashed)."""
    folder.mkdir(parents=True, exist_ok=True)
    partition = squash(image_root(folder), folder / "root.squashfs")
    objects = [SifObject(PARTITION, partition, extra=partition_extra(), align=4096)]
    if signed:
        objects.append(
            SifObject(
                SIGNATURE, pgp_signature(), group=None, link=1, link_group=True, extra=signature_extra()
            )
        )
    return write_sif(folder / "detector.sif", objects)
