"""``lazy_module``: a module that is imported when first used, for faces that must start fast.

A command-line sub-app names the pillar modules its commands call; with this, ``assay leaderboard --help``
costs Typer and rich, and only the command that runs pays for numpy, SQLAlchemy or pandas. It is the
standard library's ``importlib.util.LazyLoader`` recipe; a module already imported is returned as it is.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType


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
