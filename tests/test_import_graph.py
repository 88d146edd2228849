"""The import graph of engram_api, engram_workers and engram_gateway has no cycle.

Read from the source with ``ast``: an edge is an import that runs when a module loads (at module level, also
inside a module-level ``try`` / ``if`` / ``with``). Imports inside functions and under ``if TYPE_CHECKING:``
run later or never and are allowed to point back. ``from package import name`` is an edge to the submodule
``package.name`` when there is one, else to the package; the implicit import of a submodule's parent
packages is not an edge (Python loads a package before its submodules, whichever imports which).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engram_api", "engram_workers", "engram_gateway")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _load_time_imports(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _load_time_imports(node.body)
            yield from _load_time_imports(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _load_time_imports(block)
        elif isinstance(node, ast.With):
            yield from _load_time_imports(node.body)


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: from the module's package, one level up per extra dot
        package = module.split(".") if is_package else module.split(".")[:-1]
        base = ".".join([*package[: len(package) - node.level + 1], *([node.module] if node.module else [])])
    return [f"{base}.{alias.name}" for alias in node.names] + [base]


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        edges = graph.setdefault(module, set())
        for node in _load_time_imports(ast.parse(path.read_text(), str(path)).body):
            names = _targets(node, module, path.name == "__init__.py")
            if isinstance(node, ast.ImportFrom):
                # ``from pkg import x``: the submodule pkg.x if it exists, else a name defined in pkg itself.
                *submodules, base = names
                names = [s if s in modules else base for s in submodules]
            edges.update(n for n in names if n in modules and n != module)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle (its modules, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)) is not None:
                return cycle
        state[module] = 2
        path.pop()
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)) is not None:
            return cycle
    return None


def test_the_packages_import_without_a_cycle() -> None:
    graph = import_graph()
    assert len(graph) > 100  # every module was read
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize(
    ("graph", "cycle"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
        ({"a": {"a2"}, "a2": set(), "b": {"c"}, "c": {"b"}}, ["b", "c", "b"]),
    ],
)
def test_find_cycle_finds_one_when_there_is_one(graph: dict[str, set[str]], cycle: list[str] | None) -> None:
    assert find_cycle(graph) == cycle


def test_the_graph_reads_module_level_imports_and_skips_lazy_ones() -> None:
    graph = import_graph()
    # Module level: the rule table imports the rule families it lists.
    assert "engram_workers.extraction.rules.family" in graph["engram_workers.extraction.rules.table"]
    # ``from engram_api import keys`` is an edge to the submodule; ``from engram_api import MemoryClient``
    # to the package.
    assert "engram_api.keys" in graph["engram_api.versions"]
    assert "engram_api" in graph["engram_gateway.service"]
    # Inside a function (dispatch.send imports the app on first use) or under TYPE_CHECKING: no edge.
    assert "engram_workers.app" not in graph["engram_workers.dispatch"]
    assert "engram_api.storage.snapshot.graph" not in graph["engram_api.storage.graph.contract"]
