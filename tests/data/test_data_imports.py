"""``assay.data``'s modules import each other in one direction only, lazy imports in functions included."""

from __future__ import annotations

import ast
from pathlib import Path

import assay.data

PACKAGE = Path(assay.data.__file__).parent


def imported_modules(path: Path) -> set[str]:
    """Every ``assay.data.X`` module the file imports, at the top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("assay.data."):
            found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[2] for a in node.names if a.name.startswith("assay.data.")}
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A list of modules that import each other in a circle, or None (depth-first search)."""
    state: dict[str, str] = {}

    def visit(node: str, trail: list[str]) -> list[str] | None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return [*trail[trail.index(nxt) :], nxt] if nxt in trail else [node, nxt]
            if nxt not in state and (cycle := visit(nxt, [*trail, nxt])):
                return cycle
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start, [start])):
            return cycle
    return None


def test_find_cycle_finds_a_circle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_circle_in_assay_data() -> None:
    graph = {
        path.stem: imported_modules(path) - {path.stem}
        for path in PACKAGE.glob("*.py")
        if path.stem != "__init__"
    }
    assert "tables" in graph and "lmeval" in graph["tables"]  # the graph is really read
    assert find_cycle(graph) is None, f"import circle: {' -> '.join(find_cycle(graph) or [])}"
