"""The secret key of a DyePack release and the public commitment to it.

The key says which samples carry which trigger and target. It stays with the maintainer until an
accusation; the commitment, published with the benchmark, fixes the key at release time. It is a salted
SHA-256: without the 32-byte salt nobody can test guesses (the targets alone have only K^B values), and
with the key revealed anyone can check that it was not chosen after seeing a model's answers.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from assay.data.items import Kind
from assay.errors import UserError, validation_error

NONE_LABEL = "none of them"
COMMITMENT_HEADER = "assay-dyepack-commitment v1"


class Randomness(BaseModel):
    """How the secret choices were drawn: OS entropy (the default) or a seed given on purpose."""

    source: Literal["os-entropy", "seed"]
    seed: int | None = None


class Backdoor(BaseModel):
    """One dye pack: a trigger, an answer space of size K, the target part and the rows that carry it."""

    index: int = Field(ge=0)
    trigger: str
    k: int = Field(ge=2)
    target: int = Field(
        ge=0, description="index of the target part: option index, or phrase index (k-1 = none)"
    )
    target_label: str
    rows: list[int] = Field(min_length=1, description="0-based row numbers in the released file")


class DyePackKey(BaseModel):
    """Everything needed to verify a model against a release, and nothing that depends on any model."""

    format_version: Literal[1] = 1
    created: datetime
    kind: Kind
    style: str
    file_format: str
    release_file: str
    split: str | None = None
    release_fingerprint: str
    phrases: list[str] | None = Field(default=None, description="open-ended: the K-1 target phrases")
    backdoors: list[Backdoor] = Field(min_length=1)
    randomness: Randomness
    salt: str = Field(default_factory=lambda: secrets.token_hex(32), min_length=64, max_length=64)

    @property
    def n_backdoors(self) -> int:
        return len(self.backdoors)

    def commitment(self) -> str:
        """Hex SHA-256 of the salt bytes followed by the canonical JSON of the key without its salt."""
        body = self.model_dump(mode="json", exclude={"salt"})
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(bytes.fromhex(self.salt) + canonical.encode("utf-8")).hexdigest()

    def commitment_text(self) -> str:
        """The public commitment file: the hash and the release fingerprint it belongs to."""
        return (
            f"{COMMITMENT_HEADER}\n"
            "algorithm: sha256(salt || canonical-json(key without salt))\n"
            f"release-fingerprint: {self.release_fingerprint}\n"
            f"commitment: {self.commitment()}\n"
        )


def now_utc() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def load_key(path: str | Path) -> DyePackKey:
    """Read and validate a key file; a bad file is a one-line UserError naming the field."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: key file not found")
    try:
        return DyePackKey.model_validate_json(read_text(path, "key"))
    except ValidationError as err:
        raise validation_error(err, path) from None


def read_text(path: Path, what: str) -> str:
    """A key or commitment file's text; a file that is not UTF-8 or cannot be read is one line naming it
    (a stray byte would otherwise end verify, audit and check-commitment in a traceback)."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        byte = f"byte 0x{err.object[err.start]:02X} at offset {err.start}"
        raise UserError(f"{path}: not a {what} file: {byte} is not UTF-8") from None
    except OSError as err:
        raise UserError(f"{path}: cannot read the {what} file ({err.strerror})") from None


def read_commitment(path: str | Path) -> dict[str, str]:
    """Parse a commitment file into its ``name: value`` fields."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: commitment file not found")
    lines = read_text(path, "commitment").splitlines()
    if not lines or lines[0].strip() != COMMITMENT_HEADER:
        raise UserError(f"{path}:1: not an assay commitment file (expected first line {COMMITMENT_HEADER!r})")
    fields = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            fields[name.strip()] = value.strip()
    if "commitment" not in fields:
        raise UserError(f"{path}: field 'commitment' missing")
    return fields


def check_commitment(key: DyePackKey, commitment_path: str | Path) -> tuple[bool, str]:
    """Return whether the key matches the published commitment, and a one-line explanation."""
    fields = read_commitment(commitment_path)
    published = fields["commitment"].lower()
    actual = key.commitment()
    if published != actual:
        return False, f"commitment mismatch: published {published[:16]}..., key gives {actual[:16]}..."
    fingerprint = fields.get("release-fingerprint")
    if fingerprint and fingerprint != key.release_fingerprint:
        return False, "the commitment names a different release fingerprint than the key"
    return True, f"key matches the commitment {actual[:16]}... for release {key.release_fingerprint[:23]}..."
