"""The one selector of compiled or pure code: QAG_SPEEDUPS read once, the builds checked once, every choice named.

qag/_speedups/compiled.py lists every compiled module: the `.pyx` twins (`qag._speedups._NAME`, pure twin
`qag._speedups.NAME`) and the request path compiled from its own `.py` (the source is the pure twin). `select()`
runs once, from qag/__init__.py before any of them is imported, and decides for the whole process:

* compiled: QAG_SPEEDUPS is auto or require, every build is present and current (built from the source as it is
  now) and httptools (llhttp) is installed. The import system then prefers each build, as it always does for an
  extension module beside its source; the twins and the worker's HTTP parser are the compiled ones.
* pure: otherwise (QAG_SPEEDUPS=off, no build at all, or a build missing or stale). A finder put first on
  sys.meta_path loads each request-path module from its source; the twins and the parser are the pure ones.

`check()`, at startup (the server's master, each Gateway and worker, `qag version`), refuses under require with
one line (SpeedupsError) unless everything is compiled, and returns a warning line under auto when builds exist
but some are missing or stale. A compiled twin that can't be imported here (pgpipe without a libpq it can drive)
leaves that twin pure under auto, with the reason in `fallbacks()`. `choices()` names every choice.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import sys
from types import ModuleType

from . import compiled

__all__ = ["MODULES", "SpeedupsError", "select", "mode", "kind", "check", "get", "twin", "choices",
           "fallbacks", "builds", "decide"]

MODULES = compiled.twins()   # the twin pairs: get(NAME), twin(NAME, kind)
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the folder holding qag/
_REBUILD = "rebuild with `python -m build_backend inplace` (a source tree) or `pip install .`"


class SpeedupsError(RuntimeError):
    """QAG_SPEEDUPS=require and this process can't run compiled; the message is one line."""


class _Selection:
    """What select() decided for this process."""

    def __init__(self, mode: str, kind: str, problems: dict[str, str], error: Exception | None = None):
        self.mode, self.kind, self.problems, self.error = mode, kind, problems, error
        self.twins: dict[str, ModuleType] = {}
        self.twin_kinds: dict[str, str] = {}
        self.fallbacks: dict[str, str] = {}


_selection: _Selection | None = None


def builds(root: str = _ROOT) -> dict[str, str]:
    """{module: why its build is not one to run} for every compiled module that isn't current; {} when all are."""
    out = {}
    for path in compiled.COMPILED:
        why = compiled.why_not_current(path, root)
        if why:
            out[compiled.module(path)] = why
    return out


def decide(mode: str, not_current: dict[str, str], parser_found: bool) -> tuple[str, dict[str, str]]:
    """("compiled" or "pure", {what keeps it from compiled: why}) for `mode` and the state of the builds."""
    if mode == "off":
        return "pure", {}
    problems = dict(not_current)
    if not parser_found:
        problems["httptools"] = "not installed"
    return ("pure" if problems else "compiled"), problems


class _SourceFinder(importlib.abc.MetaPathFinder):
    """Finds each request-path module's source, so that its build beside it is not loaded (a pure process)."""

    def __init__(self, names: frozenset[str]):
        self.names = names

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.names or not path:
            return None
        last = fullname.rpartition(".")[2]
        for directory in path:
            source = os.path.join(directory, last + ".py")
            if os.path.exists(source):
                return importlib.util.spec_from_file_location(fullname, source)
        return None


def select(env=None) -> None:
    """Decide for this process, once (later calls do nothing): QAG_SPEEDUPS from the settings, then the builds."""
    global _selection
    if _selection is not None:
        return
    from ..settings import SettingsError, value
    error = None
    try:
        chosen = value("QAG_SPEEDUPS", env)
    except SettingsError as exc:   # refused by settings.load() at startup; meanwhile as auto
        chosen, error = "auto", exc
    not_current = {} if chosen == "off" else builds()
    kind, problems = decide(chosen, not_current, importlib.util.find_spec("httptools") is not None)
    if kind == "pure":
        sys.meta_path.insert(0, _SourceFinder(frozenset(compiled.request_path())))
    _selection = _Selection(chosen, kind, problems, error)


def _selected() -> _Selection:
    if _selection is None:
        select()
    return _selection


def mode() -> str:
    """The mode this process runs by: auto, require or off."""
    return _selected().mode


def kind() -> str:
    """"compiled" or "pure": what select() decided for the request path, the twins and the HTTP parser."""
    return _selected().kind


def _summary(problems: dict[str, str]) -> str:
    """The first few problems, in one line: stale builds before missing ones (an edit is the likelier news)."""
    ordered = sorted(problems.items(), key=lambda item: (item[1] == "not built", item[0]))
    shown = "; ".join(f"{name}: {why}" for name, why in ordered[:3])
    more = f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
    return f"{shown}{more}"


def _refusal(s: _Selection) -> str | None:
    """Why require can't be met, in one line, or None."""
    if s.kind != "compiled":
        return (f"QAG_SPEEDUPS=require but {len(s.problems)} of {len(compiled.COMPILED)} compiled modules can't run "
                f"({_summary(s.problems)}): {_REBUILD}, or set QAG_SPEEDUPS=auto")
    return None


def _load_twins(s: _Selection) -> None:
    """Import the selected twin of every pair (on first use: a compiled twin may load a driver's library)."""
    if s.twins:
        return
    refused = _refusal(s) if s.mode == "require" else None
    if refused:
        raise SpeedupsError(refused)
    chosen, kinds, fallbacks = {}, {}, {}
    for name in MODULES:
        module = None
        if s.kind == "compiled":
            try:
                module = twin(name, "compiled")
            except ImportError as exc:
                if s.mode == "require":
                    raise SpeedupsError(f"QAG_SPEEDUPS=require but the compiled module {__name__}._{name} cannot "
                                        f"be imported ({exc}); set QAG_SPEEDUPS=auto to run its pure twin") from exc
                fallbacks[name] = str(exc)
        kinds[name] = "pure" if module is None else "compiled"
        chosen[name] = module if module is not None else twin(name, "pure")
    s.twin_kinds, s.fallbacks, s.twins = kinds, fallbacks, chosen


def check() -> str | None:
    """At startup: SpeedupsError (one line) under require unless everything runs compiled; under auto a warning
    line when builds exist but this process runs pure because some are missing or stale, or a twin fell back;
    else None. The settings' own error (a bad QAG_SPEEDUPS) is raised as it is."""
    s = _selected()
    if s.error is not None:
        raise s.error
    _load_twins(s)
    if s.mode != "auto":
        return None
    lines = []
    built = [why for name, why in s.problems.items() if why != "not built" and name != "httptools"]
    if s.problems and (built or len(s.problems) < len(compiled.COMPILED)):   # no build at all: a pure installation
        lines.append(f"QAG_SPEEDUPS=auto runs pure Python: {len(s.problems)} of {len(compiled.COMPILED)} compiled "
                     f"modules can't run ({_summary(s.problems)}); {_REBUILD}")
    if s.fallbacks:
        lines.append(f"the compiled twins of {', '.join(sorted(s.fallbacks))} can't be imported here, their pure "
                     f"twins run ({_summary(s.fallbacks)})")
    return "; ".join(lines) or None


def get(name: str) -> ModuleType:
    """The selected twin of pair `name` (for example get("rowjson").encode_json)."""
    s = _selected()
    module = s.twins.get(name)   # once loaded, one lookup: the request path asks on every call
    if module is None:
        if name not in MODULES:
            raise KeyError(f"qag._speedups has no twin pair {name!r}; it has {', '.join(MODULES)}")
        _load_twins(s)
        module = s.twins[name]
    return module


def twin(name: str, kind: str) -> ModuleType:
    """The "pure" or "compiled" twin of pair `name`, whatever was selected (ImportError if not importable): for
    tests and benchmarks, which compare the two."""
    if name not in MODULES:
        raise KeyError(f"qag._speedups has no twin pair {name!r}; it has {', '.join(MODULES)}")
    if kind == "pure":
        return importlib.import_module(f"{__name__}.{name}")
    if kind == "compiled":
        return importlib.import_module(f"{__name__}._{name}")
    raise ValueError(f"a twin is 'pure' or 'compiled', not {kind!r}")


def choices() -> dict[str, str]:
    """Every choice, "compiled" or "pure": the request path, each twin pair, and the worker's HTTP parser
    (compiled: httptools' llhttp). For `qag version`, the startup line and /metrics."""
    s = _selected()
    _load_twins(s)
    return {"request_path": s.kind, **s.twin_kinds, "http_parser": s.kind}


def fallbacks() -> dict[str, str]:
    """Twin pairs that run pure in a compiled process because their compiled twin did not import, with why."""
    s = _selected()
    _load_twins(s)
    return dict(s.fallbacks)
