"""A command whose extra is not installed (the platform image has no torch: docs/deploy.md) ends in one
line naming the extra, exit code 2, not a traceback from deep inside (issue 36)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from assay import extras

WITHOUT_TORCH = """
import sys
sys.modules["torch"] = None  # `import torch` fails as where it is not installed
from assay.cli import main
sys.argv = ["assay", "zoo", "generate", "--out", sys.argv[1], "--models", "2"]
main()
"""


def test_a_missing_extra_names_it() -> None:
    line = extras.missing(ModuleNotFoundError("No module named 'torch'", name="torch"))
    assert line is not None and "pip install 'assay[models]'" in line and "worker image" in line
    assert "assay[ray]" in (extras.missing(ModuleNotFoundError(name="ray._raylet")) or "")
    assert extras.missing(ModuleNotFoundError(name="no_such_module")) is None  # a real bug: traceback


@pytest.mark.slow
def test_the_cli_says_which_extra_a_command_needs(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_TORCH, str(tmp_path / "round")], capture_output=True, text=True
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert done.stderr.startswith("error: this needs torch, which is not installed here")


def test_a_local_model_without_the_model_stack_is_one_line(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A DyePack or STAR job on an ``hf:`` model in the platform image: the job record gets the line."""
    from assay.errors import UserError
    from assay.models.spec import load_model

    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` fails as where it is not installed
    monkeypatch.delitem(sys.modules, "assay.models.hf", raising=False)
    with pytest.raises(UserError, match=r"pip install 'assay\[models\]'"):
        load_model(f"hf:{tmp_path}")
