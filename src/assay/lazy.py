"""``lazy_module``: a module that is imported when first used, for faces that must start fast.

A command-line sub-app names the pillar modules its commands call; with this, ``assay leaderboard --help``
costs Typer and rich, and only the command that runs pays for numpy, SQLAlchemy or pandas. It is the
standard library's ``importlib.util.LazyLoader`` recipe; a module already imported is returned as it is.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any


def lazy_module(name: str) -> ModuleType:
    """``name`` as a module object whose code runs at its first attribute access."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module


def lazy_attributes(
    package: str, home: dict[str, str], load_first: Callable[[], object] | None = None
) -> Any:
    """A package's module ``__getattr__`` (PEP 562) for re-exported names loaded on first use: ``home`` maps
    each name to the submodule that defines it; ``load_first`` runs before any of them (the store loads all
    its tables, so the metadata is complete whichever name is asked for)."""

    def __getattr__(name: str) -> Any:
        if name not in home:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if load_first is not None:
            load_first()
        return getattr(importlib.import_module(f"{package}.{home[name]}"), name)

    return __getattr__
