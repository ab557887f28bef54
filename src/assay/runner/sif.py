"""Read a Singularity / Apptainer image (SIF) without apptainer: the file NIST's TrojAI performers hand in.

Why our own reader: no SIF engine can be installed on our workers, yet a ``.sif`` is what TrojAI teams
build. The format is small and published by the apptainer project (``github.com/apptainer/sif``,
``pkg/sif``); this module reads it with ``struct`` and nothing else. All integers are little-endian and
the records are packed (no padding):

- the global header, 128 bytes: a 32-byte launch script (``#!/usr/bin/env run-singularity``), the magic
  ``SIF_MAGIC\\0`` (10 bytes), the version ``01\\0`` (3), the primary architecture (3: ``02\\0`` is amd64),
  a 16-byte UUID, then eight int64s: created, modified, free descriptors, total descriptors, the offset and
  size of the descriptor table, the offset and size of the data.
- the descriptor table, ``total`` records of 585 bytes each: data type (int32), used (bool), id, group
  and link (uint32; a group id or a link to a group carries ``0xf0000000``), offset, size, size with
  padding, created, modified, uid and gid (int64), a 128-byte name and 384 bytes of type-specific data.
- a partition's type-specific data: file system type (int32: 1 SquashFS, 2 ext3, 3 archive, 4 raw,
  5 encrypted SquashFS, 6 gocryptfs SquashFS), partition type (int32: 1 system, 2 primary system, 3 data,
  4 overlay) and its architecture (3 bytes, as in the header).
- a signature's: the hash type (int32: 1 SHA-256 ... 5 BLAKE2b) and 256 bytes of signing entity, whose
  first 20 bytes are the OpenPGP key fingerprint (all zero when there is none, as with DSSE signatures).

``singularity run`` runs the primary system partition; so do we (``container.py``, after
``assay.runner.squashfs`` unpacked it). Signatures are shown (format, hash, key fingerprint), never
verified: no keyring of the teams' keys exists here, and an image is judged by what it does in the
sandbox, not by who signed it. Anything the reader cannot use is one ``UserError`` line naming the file.

``write_sif`` writes the same layout (the definition file and one primary SquashFS partition) for
``assay leaderboard image build`` (``assay.runner.imagebuild``); the tests check it with a writer of their
own (``tests/runner/sif_image.py``), so reader and writer are not only checked against each other.
"""

from __future__ import annotations

import os
import platform
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from assay.errors import UserError
from assay.runner.squashfs import read_files, survey

MAGIC = b"SIF_MAGIC\0"
VERSION = b"01\0"
HEADER = struct.Struct("<32s10s3s3s16s8q")  # 128 bytes
DESCRIPTOR = struct.Struct("<i?IIIqqqqqqq128s384s")  # 585 bytes
_PARTITION = struct.Struct("<ii3s")
_SIGNATURE = struct.Struct("<i256s")
_SQUASHFS = struct.Struct("<IIIIIHHHHHHqq")  # the start of a SquashFS 4 superblock, to bytes_used
_SQUASHFS_MAGIC = 0x73717368  # "hsqs"
GROUP_FLAG = 0xF0000000
MAX_DESCRIPTORS = 65536  # apptainer writes 48; a table larger than this is no image's
_FINGERPRINT_BYTES = 20

DATA_PARTITION = 0x4004
DATA_SIGNATURE = 0x4005
DATA_TYPES = {
    0x4001: "definition file",
    0x4002: "environment",
    0x4003: "labels",
    DATA_PARTITION: "partition",
    DATA_SIGNATURE: "signature",
    0x4006: "generic JSON",
    0x4007: "generic data",
    0x4008: "cryptographic message",
    0x4009: "SBOM",
    0x400A: "OCI root index",
    0x400B: "OCI blob",
}
FS_SQUASHFS = 1
FS_TYPES = {
    1: "SquashFS",
    2: "ext3",
    3: "archive",
    4: "raw",
    5: "encrypted SquashFS",
    6: "gocryptfs SquashFS",
}
FS_ENCRYPTED = frozenset({5, 6})
PART_PRIMARY = 2
PART_TYPES = {1: "system", PART_PRIMARY: "primary system", 3: "data", 4: "overlay"}
ARCHITECTURES = {
    b"01": "386",
    b"02": "amd64",
    b"03": "arm",
    b"04": "arm64",
    b"05": "ppc64",
    b"06": "ppc64le",
    b"07": "mips",
    b"08": "mipsle",
    b"09": "mips64",
    b"10": "mips64le",
    b"11": "s390x",
    b"12": "riscv64",
    b"13": "loong64",
}
_MACHINES = {  # platform.machine() -> the Go name SIF uses
    "x86_64": "amd64",
    "amd64": "amd64",
    "i386": "386",
    "i686": "386",
    "aarch64": "arm64",
    "arm64": "arm64",
    "armv7l": "arm",
    "ppc64le": "ppc64le",
    "ppc64": "ppc64",
    "s390x": "s390x",
    "riscv64": "riscv64",
    "loongarch64": "loong64",
}
HASHES = {1: "SHA-256", 2: "SHA-384", 3: "SHA-512", 4: "BLAKE2s-256", 5: "BLAKE2b-256"}


@dataclass(frozen=True)
class Descriptor:
    """One used entry of the descriptor table: a data object, where it lies and what it is."""

    data_type: int
    id: int
    group: int | None  # None: in no group
    link: int | None  # the object (or group, with ``link_is_group``) it refers to; None: no link
    link_is_group: bool
    offset: int
    size: int
    name: str
    extra: bytes

    @property
    def kind(self) -> str:
        return DATA_TYPES.get(self.data_type, f"unknown data type {self.data_type:#x}")


@dataclass(frozen=True)
class Partition:
    """A partition data object: its bytes in the file, file system, role and architecture (None: unknown)."""

    id: int
    offset: int
    size: int
    fs_type: int
    part_type: int
    arch: str | None
    raw_arch: bytes

    @property
    def fs_name(self) -> str:
        return FS_TYPES.get(self.fs_type, f"unknown file system {self.fs_type}")


@dataclass(frozen=True)
class Signature:
    """A signature object as organisers are shown it: format, hash, key and what it signs. Not verified."""

    id: int
    format: str
    hash: str
    fingerprint: str | None  # 40 upper-case hex digits of the OpenPGP key; None when not recorded
    signs: str

    def describe(self) -> str:
        key = f"key fingerprint {self.fingerprint}" if self.fingerprint else "no key fingerprint recorded"
        return f"{self.format} signature ({self.hash}, {key}) of {self.signs}"


@dataclass(frozen=True)
class SifImage:
    """What the header and descriptor table of a SIF file say."""

    path: Path
    file_bytes: int
    launch: str
    arch: str | None
    uuid: str
    created: int
    descriptors: tuple[Descriptor, ...] = field(default_factory=tuple)

    @property
    def partitions(self) -> list[Partition]:
        return [_partition(d) for d in self.descriptors if d.data_type == DATA_PARTITION]

    def signatures(self) -> list[Signature]:
        """Every signature object (format, hash, fingerprint), read but not verified."""
        return [_signature(self.path, d) for d in self.descriptors if d.data_type == DATA_SIGNATURE]


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", errors="replace")


def _uuid(raw: bytes) -> str:
    text = raw.hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def _arch(raw: bytes) -> str | None:
    return ARCHITECTURES.get(raw.split(b"\0", 1)[0])


def _partition(descriptor: Descriptor) -> Partition:
    fs_type, part_type, arch = _PARTITION.unpack_from(descriptor.extra)
    return Partition(descriptor.id, descriptor.offset, descriptor.size, fs_type, part_type, _arch(arch), arch)


def _signature(path: Path, descriptor: Descriptor) -> Signature:
    hash_type, entity = _SIGNATURE.unpack_from(descriptor.extra)
    fingerprint = entity[:_FINGERPRINT_BYTES]
    with path.open("rb") as handle:
        handle.seek(descriptor.offset)
        head = handle.read(min(descriptor.size, 64)).lstrip()
    if head.startswith(b"-----BEGIN PGP SIGNED MESSAGE"):
        kind = "OpenPGP clear-signed"
    elif head.startswith(b"{"):
        kind = "DSSE envelope"
    else:
        kind = "unrecognised"
    target = "no object" if descriptor.link is None else f"object {descriptor.link}"
    if descriptor.link is not None and descriptor.link_is_group:
        target = f"object group {descriptor.link}"
    return Signature(
        descriptor.id,
        kind,
        HASHES.get(hash_type, f"unknown hash {hash_type}"),
        fingerprint.hex().upper() if any(fingerprint) else None,
        target,
    )


def _descriptor(raw: bytes) -> tuple[bool, Descriptor]:
    (data_type, used, ident, group, link, offset, size, _, _, _, _, _, name, extra) = DESCRIPTOR.unpack(raw)
    return used, Descriptor(
        data_type=data_type,
        id=ident,
        group=(group & ~GROUP_FLAG) if group & GROUP_FLAG and group != GROUP_FLAG else None,
        link=(link & ~GROUP_FLAG) or None,
        link_is_group=bool(link & GROUP_FLAG == GROUP_FLAG),
        offset=offset,
        size=size,
        name=_text(name),
        extra=extra,
    )


def _table(path: Path, head: bytes, size: int) -> tuple[int, int]:
    """Check the header's magic, version and descriptor table; the table's offset and entry count."""
    if len(head) < HEADER.size:
        raise UserError(f"{path}: not a SIF image ({len(head)} bytes; a SIF header is {HEADER.size})")
    _, magic, version, _, _, _, _, _, total, table, table_bytes, _, _ = HEADER.unpack(head)
    if magic != MAGIC:
        raise UserError(f"{path}: not a SIF image (bad magic {magic[:9]!r}; a SIF starts 'SIF_MAGIC')")
    if version != VERSION:
        raise UserError(f"{path}: SIF version {_text(version)!r} is not supported (only 01)")
    damaged = f"{path}: a damaged SIF image"
    if not 0 <= total <= MAX_DESCRIPTORS or table < HEADER.size or table_bytes < total * DESCRIPTOR.size:
        raise UserError(f"{damaged} (a descriptor table of {total} entries in {table_bytes} bytes)")
    if table + total * DESCRIPTOR.size > size:
        raise UserError(f"{damaged} (its descriptor table runs past the end of the file)")
    return table, total


def read_sif(path: Path) -> SifImage:
    """The header and used descriptors of the SIF file at ``path``; a one-line ``UserError`` when it is
    not one (bad magic, another version) or its table or objects lie outside the file."""
    path = Path(path)
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, 2)
            handle.seek(0)
            head = handle.read(HEADER.size)
            table, total = _table(path, head, size)
            handle.seek(table)
            rows = handle.read(total * DESCRIPTOR.size)
    except OSError as exc:
        raise UserError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    descriptors = []
    for start in range(0, len(rows), DESCRIPTOR.size):
        used, descriptor = _descriptor(rows[start : start + DESCRIPTOR.size])
        if not used:
            continue
        if descriptor.offset < 0 or descriptor.size < 0 or descriptor.offset + descriptor.size > size:
            where = f"its {descriptor.kind} object {descriptor.id}"
            raise UserError(f"{path}: a damaged SIF image ({where} lies outside the file)")
        descriptors.append(descriptor)
    launch, _, _, arch, uuid, created = HEADER.unpack(head)[:6]
    return SifImage(path, size, _text(launch), _arch(arch), _uuid(uuid), created, tuple(descriptors))


def system_partition(image: SifImage) -> Partition:
    """The primary system partition, the one ``singularity run`` runs, once it is known to be an unencrypted
    SquashFS file system for a known architecture; else a one-line ``UserError`` saying why."""
    path = image.path
    primary = [p for p in image.partitions if p.part_type == PART_PRIMARY]
    if not primary:
        others = len(image.partitions)
        held = f"{others} other partition{'s' if others != 1 else ''}" if others else "no partition at all"
        raise UserError(f"{path}: the SIF image has no primary system partition ({held}): nothing to run")
    if len(primary) > 1:
        raise UserError(f"{path}: a damaged SIF image ({len(primary)} primary system partitions)")
    partition = primary[0]
    if partition.fs_type in FS_ENCRYPTED:
        raise UserError(
            f"{path}: the primary system partition is encrypted ({partition.fs_name}); submit an unencrypted "
            "image (the harness holds no key)"
        )
    if partition.fs_type != FS_SQUASHFS:
        raise UserError(
            f"{path}: the primary system partition is {partition.fs_name}; only SquashFS ones can be run "
            "(what `apptainer build` writes)"
        )
    if partition.arch is None:
        shown = partition.raw_arch.split(b"\0", 1)[0].decode("ascii", errors="replace")
        raise UserError(f"{path}: the primary system partition is for an unknown architecture ({shown!r})")
    with path.open("rb") as handle:
        handle.seek(partition.offset)
        head = handle.read(min(partition.size, _SQUASHFS.size))
    fields = _SQUASHFS.unpack(head) if len(head) == _SQUASHFS.size else None
    if fields is None or fields[0] != _SQUASHFS_MAGIC:
        raise UserError(f"{path}: the primary system partition holds no SquashFS file system (no superblock)")
    major, used = fields[9], fields[12]
    if major != 4 or not 0 < used <= partition.size:
        raise UserError(
            f"{path}: the primary system partition's SquashFS is damaged or unsupported "
            f"(version {major}, {used} bytes in a partition of {partition.size})"
        )
    return partition


def host_arch() -> str:
    """This machine's architecture in SIF's (Go's) names: ``amd64``, ``arm64``, ..."""
    machine = platform.machine().lower()
    return _MACHINES.get(machine, machine)


def check_arch(image: SifImage, partition: Partition) -> None:
    """Refuse, in one line, a partition built for another architecture than this machine's: its programs
    would not start."""
    if partition.arch != host_arch():
        raise UserError(
            f"{image.path}: the image is built for {partition.arch}; this machine runs {host_arch()}"
        )


def signature_notes(image: SifImage) -> list[str]:
    """One line per signature, for the job log: present, which key if recorded, and not verified."""
    return [
        f"the image carries an {s.describe()}; signatures are not verified here" for s in image.signatures()
    ]


RUNSCRIPT = "/.singularity.d/runscript"  # what ``singularity run`` runs, after sourcing env/*.sh
ENV_FOLDER = "/.singularity.d/env"


@dataclass(frozen=True)
class SifContents:
    """What the leaderboard judges a ``.sif`` submission by, read without unpacking it: the image, its
    primary partition, the bytes its files hold, the ``wanted`` files at its root (bytes; None when not a
    regular file of at most 1 MiB; absent when absent) and whether it has a runscript."""

    image: SifImage
    partition: Partition
    unpacked_bytes: int
    root_files: dict[str, bytes | None]
    runscript: bool


def read_contents(path: Path, wanted: Iterable[str] = (), max_bytes: int | None = None) -> SifContents:
    """Read a SIF image as far as accepting it goes: its header and primary partition (``system_partition``,
    built for this machine), its file system listed (``squashfs.survey``: no devices, no links out, within
    ``max_bytes``) and the ``wanted`` top-level files read. A one-line ``UserError`` says what is wrong."""
    image = read_sif(path)
    partition = system_partition(image)
    check_arch(image, partition)
    paths = {"/" + name: name for name in wanted}
    listed = survey(Path(path), partition.offset, max_bytes, [*paths, RUNSCRIPT])
    files = read_files(Path(path), partition.offset, listed, paths)
    return SifContents(
        image,
        partition,
        listed.unpacked_bytes,
        {paths[inside]: data for inside, data in files.items()},
        RUNSCRIPT in listed.found,
    )


# --- writing: what ``assay leaderboard image build`` makes of a built root ----------------------------------

DATA_DEFFILE = 0x4001
DESCRIPTORS_OFFSET = 4096  # pkg/sif's layout: header, padding, the table at 4 KiB, objects after it
DESCRIPTOR_COUNT = 48  # the table apptainer writes
OBJECT_ALIGN = 4096  # each object page-aligned, as pkg/sif aligns them
LAUNCH = b"#!/usr/bin/env run-singularity\n"
_COPY_CHUNK = 2**20


def _arch_code(arch: str) -> bytes:
    codes = {name: code for code, name in ARCHITECTURES.items()}
    if arch not in codes:
        raise UserError(f"cannot write a SIF image for architecture {arch!r}")
    return codes[arch]


def _descriptor_row(
    data_type: int, ident: int, offset: int, size: int, stored: int, name: str, extra: bytes, now: int
) -> bytes:
    group = GROUP_FLAG | 1  # apptainer's default object group
    return DESCRIPTOR.pack(
        data_type, True, ident, group, 0, offset, size, stored, now, now, 0, 0, name.encode()[:127], extra
    )


def write_sif(
    target: Path,
    squashfs: Path,
    deffile: bytes | None = None,
    arch: str | None = None,
    uuid: bytes | None = None,
) -> None:
    """Write a SIF image at ``target`` (the caller writes it atomically): the definition file as its first
    object (when given) and the SquashFS file ``squashfs`` as the primary system partition for ``arch``
    (this machine's by default), laid out as apptainer's ``pkg/sif`` lays out what ``apptainer build``
    writes. ``read_sif`` and ``system_partition`` accept what this writes; the tests check it against the
    format with a writer of their own."""
    code = _arch_code(arch or host_arch())
    now = int(time.time())
    table_end = DESCRIPTORS_OFFSET + DESCRIPTOR_COUNT * DESCRIPTOR.size
    objects: list[tuple[int, str, bytes, int]] = []  # data type, name, extra, size
    if deffile is not None:
        objects.append((DATA_DEFFILE, "deffile", b"", len(deffile)))
    part_size = squashfs.stat().st_size
    objects.append(
        (DATA_PARTITION, squashfs.name, _PARTITION.pack(FS_SQUASHFS, PART_PRIMARY, code + b"\0"), part_size)
    )
    rows, offsets, position = [], [], table_end
    for ident, (data_type, name, extra, size) in enumerate(objects, start=1):
        offset = -(-position // OBJECT_ALIGN) * OBJECT_ALIGN
        rows.append(
            _descriptor_row(data_type, ident, offset, size, offset + size - position, name, extra, now)
        )
        offsets.append(offset)
        position = offset + size
    rows += [bytes(DESCRIPTOR.size)] * (DESCRIPTOR_COUNT - len(rows))
    header = HEADER.pack(
        LAUNCH, MAGIC, VERSION, code + b"\0", uuid or os.urandom(16), now, now,
        DESCRIPTOR_COUNT - len(objects), DESCRIPTOR_COUNT, DESCRIPTORS_OFFSET,
        DESCRIPTOR_COUNT * DESCRIPTOR.size, table_end, position - table_end,
    )  # fmt: skip
    with Path(target).open("wb") as out:
        out.write(header)
        out.seek(DESCRIPTORS_OFFSET)
        out.write(b"".join(rows))
        if deffile is not None:
            out.seek(offsets[0])
            out.write(deffile)
        out.seek(offsets[-1])
        with squashfs.open("rb") as source:
            while chunk := source.read(_COPY_CHUNK):
                out.write(chunk)
        out.truncate(position)
