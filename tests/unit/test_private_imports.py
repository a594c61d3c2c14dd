"""No module of qag/ or benchmarks/ uses a private name (`_x`) of another qag package (issue 25.4)."""

from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _modules(*folders: str):
    for folder in folders:
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, folder)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for filename in filenames:
                if filename.endswith(".py"):
                    path = os.path.join(dirpath, filename)
                    name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                    yield path, name[:-len(".__init__")] if name.endswith(".__init__") else name


def _package(module: str) -> str:
    """qag.sql.prepare → qag.sql; a module directly under qag (qag.cli) is a package of its own."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "qag" else parts[0]


def _is_package(module: str) -> bool:
    return os.path.isfile(os.path.join(ROOT, *module.split("."), "__init__.py"))


def _absolute(importer: str, path: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".") if path.endswith("__init__.py") else importer.split(".")[:-1]
    base = base[:len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _violations():
    found = []
    for path, module in _modules("qag", "benchmarks"):
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), path)
        own = _package(module)
        foreign: dict[str, str] = {}   # local name → a module of another qag package
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = _absolute(module, path, node)
                if not target.startswith("qag"):
                    continue
                for alias in node.names:
                    full = f"{target}.{alias.name}"
                    where = _package(full if target == "qag" else target)
                    if where == own:
                        continue
                    # A package (qag._speedups) is a unit of the graph, not a private name of another one.
                    if _private(alias.name) and not _is_package(full):
                        found.append(f"{module}: from {target} import {alias.name}")
                    foreign[alias.asname or alias.name] = full
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("qag") and _package(alias.name) != own:
                        parts = alias.name.split(".")
                        if any(_private(p) and not _is_package(".".join(parts[:i + 1])) for i, p in enumerate(parts)):
                            found.append(f"{module}: import {alias.name}")
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in foreign
                    and _private(node.attr)):
                found.append(f"{module}: {node.value.id}.{node.attr} ({foreign[node.value.id]})")
    return sorted(set(found))


def test_no_private_name_of_another_package_is_used():
    assert _violations() == [], "make the name public in its own package, or move the code that needs it there"


def test_the_check_reads_imports_as_intended():
    # The walk finds what it looks for: a private name of qag.sql imported into qag.policy would be reported.
    tree = ast.parse("from qag.sql.prepare import _strip\nfrom qag import _speedups\nfrom . import _own\n")
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    targets = [_absolute("qag.policy.tables", "qag/policy/tables.py", n) for n in imports]
    assert targets == ["qag.sql.prepare", "qag", "qag.policy"]
    assert _package("qag.sql.prepare") != _package("qag.policy.tables") == _package("qag.policy")
    assert _is_package("qag._speedups") and not _is_package("qag.sql.prepare._strip")
