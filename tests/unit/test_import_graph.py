"""mpinb's modules import one another without a circle, type-only imports included.

A circle through ``if TYPE_CHECKING:`` imports costs nothing at run time but says two modules are
one: each needs the other's insides. Where one side needs only a surface of the other, that surface
is a typing protocol (``_collective.interfaces``, ``client._lifecycle.ClusterHandle``). Imports
inside functions are left out: they are how a module reaches a later layer on purpose.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "mpinb"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _module_level_imports(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    out: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
        elif isinstance(node, ast.If):  # ``if TYPE_CHECKING:`` and platform branches
            out += _module_level_imports(node.body) + _module_level_imports(node.orelse)
        elif isinstance(node, ast.Try):
            out += _module_level_imports(node.body + node.orelse + node.finalbody)
            for handler in node.handlers:
                out += _module_level_imports(handler.body)
    return out


def _graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        for node in _module_level_imports(ast.parse(path.read_text()).body):
            if isinstance(node, ast.Import):
                edges |= {alias.name for alias in node.names}
                continue
            target = node.module or ""
            if node.level:
                base = name.split(".")[: None if path.name == "__init__.py" else -1]
                target = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:  # ``from mpinb import _collective`` names a module
                sub = f"{target}.{alias.name}"
                edges.add(sub if sub in modules else target)
        graph[name] = {e for e in edges if e in modules and e != name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_of_mpinb_imports_itself_in_a_circle() -> None:
    modules = _modules()
    assert "mpinb._collective.channels" in modules and "mpinb.client.cluster" in modules
    assert _circles(_graph(modules)) == []


def test_the_circle_finder_sees_a_type_only_circle() -> None:
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from mpinb.b import B\n"
    tree = ast.parse(source)
    assert [n.module for n in _module_level_imports(tree.body)] == ["typing", "mpinb.b"]
    graph = {"mpinb.a": {"mpinb.b"}, "mpinb.b": {"mpinb.a"}, "mpinb.c": {"mpinb.a"}}
    assert _circles(graph) == [["mpinb.a", "mpinb.b"]]
