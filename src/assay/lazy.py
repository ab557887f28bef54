"""``lazy_module``: a module that is imported when first used, for faces that must start fast.

A command-line sub-app names the pillar modules its commands call; with this, ``assay leaderboard --help``
costs Typer and rich, and only the command that runs pays for numpy, SQLAlchemy or pandas.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any


class _DeferredModule(ModuleType):
    """Stands for a module not imported yet; the first attribute read, write or delete imports it.

    Not the standard library's ``LazyLoader``: that needs the module's spec now, and finding the spec of
    ``assay.runner.executors`` imports the package ``assay.runner`` (its ``__init__`` and what that
    imports, 0.05 s), and of ``assay.models.base`` all of ``assay.models`` (0.3 s). Nothing is put in
    ``sys.modules``; the real import happens through the import system, so the package gets its attribute
    and every other importer gets the same module object.
    """

    def __getattr__(self, name: str) -> Any:
        return getattr(importlib.import_module(self.__name__), name)

    def __setattr__(self, name: str, value: Any) -> None:  # monkeypatching reaches the real module
        setattr(importlib.import_module(self.__name__), name, value)

    def __delattr__(self, name: str) -> None:
        delattr(importlib.import_module(self.__name__), name)


def lazy_module(name: str) -> ModuleType:
    """``name`` as a module object whose code runs at its first attribute access.

    A module already imported is returned as it is. A misspelt name fails at that first access.
    """
    if name in sys.modules:
        return sys.modules[name]
    return _DeferredModule(name)


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
