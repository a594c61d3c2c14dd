"""qag's package graph has no cycles: read from every module's import statements (ast), nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

QAG = Path(__file__).resolve().parents[2] / "qag"

def _modules() -> dict[str, Path]:
    """{dotted name: file} for every qag module, packages by their __init__.py."""
    found = {}
    for path in QAG.rglob("*.py"):
        parts = path.relative_to(QAG.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def node(module: str) -> str:
    """The graph's node of a module: its first-level package (qag.api, qag.worker, ...) or, for a module at qag's
    top level, the module itself (qag.app, qag.errors, ...); qag/__init__.py is the node "qag"."""
    return ".".join(module.split(".")[:2])


def imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The qag modules `module` imports anywhere in its body (function-level imports included)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for stmt in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(stmt, ast.Import):
            out.update(alias.name for alias in stmt.names)
        elif isinstance(stmt, ast.ImportFrom):
            base = stmt.module or ""
            if stmt.level:
                anchor = package.split(".")[:len(package.split(".")) - stmt.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in stmt.names:
                # `from qag import _speedups` imports the submodule; `from qag.x import name` the module qag.x.
                out.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {name for name in out if name in known}


def package_graph() -> dict[str, set[str]]:
    """{node: the nodes it imports}, self-edges left out."""
    modules = _modules()
    known = set(modules)
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        edges = graph.setdefault(node(module), set())
        edges.update(node(target) for target in imports(module, path, known) if node(target) != node(module))
    return graph


def cycles(graph: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """The strongly connected components of more than one node (Tarjan), each as a sorted tuple."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
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
                found.add(tuple(sorted(component)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_reader_sees_relative_and_absolute_imports():
    graph = package_graph()
    assert "qag._speedups" in graph["qag"]          # qag/__init__.py: from . import _speedups
    assert "qag.errors" in graph["qag.http"]         # qag/http/request.py: from ..errors import QagError
    assert "qag._speedups" in graph["qag.policy"]    # qag/policy/tables.py: from qag import _speedups


def test_the_package_graph_has_no_cycles():
    graph = package_graph()
    assert not cycles(graph), f"package cycles: {sorted(cycles(graph))}"


def test_the_speedups_import_nothing_above_them():
    """qag/_speedups (the twins and the selector) sits under every package that uses it."""
    assert package_graph()["qag._speedups"] <= {"qag.http11", "qag.settings"}


def test_the_cycle_finder_finds_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {("a", "b", "c")}
