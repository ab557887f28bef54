"""No import circles: an ast walk over every module of ``src/assay`` (imports inside functions too, since a
lazy import that closes a circle still ties the modules together), one test per package, each failing with
the circle it found. (``assay.star`` held one of four files, ``assay.runner`` and ``assay.data`` one of two
each; all three are broken now, so every package is held to it. Add a known circle to ``BEING_FIXED`` only
while someone is breaking it: it is then an expected failure, not strict.)"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
BEING_FIXED: set[str] = set()  # packages with a circle someone is breaking right now


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _target(node: ast.ImportFrom, package: str) -> str:
    """The absolute module an ``import from`` names (relative imports resolved against ``package``)."""
    if not node.level:
        return node.module or ""
    base = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph(root: Path, top: str = "assay") -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere in its body; ``from pkg import sub`` counts as
    importing ``pkg.sub`` when that is a module, else ``pkg``."""
    modules = {module_name(p, root): p for p in (root / top).rglob("*.py")}

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {known(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                target = _target(node, package)
                found |= {
                    known(f"{target}.{a.name}") if f"{target}.{a.name}" in modules else known(target)
                    for a in node.names
                }
        graph[name] = {m for m in found if m and m != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


@functools.cache
def circles_in_src() -> list[list[str]]:
    """The circles of ``src/assay``, walked once for all the package tests (about 2 s)."""
    return circles(import_graph(SRC))


def packages() -> list[str]:
    return sorted(f"assay.{p.name}" for p in (SRC / "assay").iterdir() if (p / "__init__.py").exists())


@pytest.mark.parametrize(
    "package",
    [
        pytest.param(p, marks=pytest.mark.xfail(reason="a circle being broken elsewhere", strict=False))
        if p in BEING_FIXED
        else p
        for p in packages()
    ],
)
def test_package_has_no_import_circle(package: str) -> None:
    mine = [c for c in circles_in_src() if any(m == package or m.startswith(f"{package}.") for m in c)]
    assert not mine, f"import circle(s) in {package}: " + "; ".join(" <-> ".join(c) for c in mine)


def test_star_is_checked_and_the_walk_finds_a_planted_circle(tmp_path: Path) -> None:
    """The walk sees lazy and relative imports: a planted three-module circle (one import inside a
    function, one relative) is found; the same package without the closing import has none."""
    assert "assay.star" in packages()
    pkg = tmp_path / "assay" / "pkg"
    pkg.mkdir(parents=True)
    (tmp_path / "assay" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from assay.pkg import b\n")
    (pkg / "b.py").write_text("from . import c\n")
    (pkg / "c.py").write_text("def later():\n    from assay.pkg.a import thing\n")
    assert circles(import_graph(tmp_path)) == [["assay.pkg.a", "assay.pkg.b", "assay.pkg.c"]]
    (pkg / "c.py").write_text("def later():\n    return 1\n")
    assert circles(import_graph(tmp_path)) == []
