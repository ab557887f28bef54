"""No import circle inside ``assay.runner``: its modules' imports, read with ``ast``, form no cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import assay.runner

PACKAGE = Path(assay.runner.__file__).parent


def runner_imports(path: Path) -> set[str]:
    """The ``assay.runner`` modules ``path`` imports, at any depth of its code (lazy imports count too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found |= {name.split(".")[2] for name in names if name.startswith("assay.runner.")}
    return {name for name in found if (PACKAGE / f"{name}.py").exists()}


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (module -> modules it imports) as a path, or None."""
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = "open"
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                return [*path[path.index(target) :], target] if target in path else [node, target]
            if target not in state and (found := visit(target, [*path, target])):
                return found
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_import_circle_inside_assay_runner() -> None:
    modules = {path.stem: path for path in PACKAGE.glob("*.py") if path.stem != "__init__"}
    graph = {name: runner_imports(path) - {name} for name, path in modules.items()}
    assert graph["dispatch"] >= {"container", "sandbox"}  # the walk sees real imports
    assert cycle(graph) is None, " -> ".join(cycle(graph) or [])
