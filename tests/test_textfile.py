"""Text files users hand assay, read as UTF-8: a stray byte is one line naming file, line and byte."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from assay.errors import UserError
from assay.yamlfile import load_yaml_model


class Config(BaseModel):
    name: str


def test_a_yaml_config_with_a_latin1_byte_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "round.yaml"
    path.write_bytes("seed: 1\nname: caf\xe9\n".encode("latin-1"))
    with pytest.raises(UserError) as caught:
        load_yaml_model(path, Config, "zoo config")
    assert str(caught.value) == (
        f"{path}:2: not UTF-8: byte 0xE9 at byte 10 of the line, offset 17 of the file; "
        "save the zoo config as UTF-8"
    )
    path.write_bytes(b"\xef\xbb\xbfname: ok\n")  # a byte-order mark, as spreadsheets write it, is fine
    assert load_yaml_model(path, Config, "zoo config").name == "ok"


def test_the_zoo_command_says_it_in_one_line_and_exits_2(tmp_path: Path) -> None:
    config = tmp_path / "round.yaml"
    config.write_bytes(b"seed: 1\n\xff\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "assay",
            "zoo",
            "generate",
            "--config",
            str(config),
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"{config}:2: not UTF-8: byte 0xFF" in done.stderr and not (tmp_path / "o").exists()
