"""Chooses the compiled or the pure-Python twin of each hot-path module (QAG_SPEEDUPS=auto|require|off).

Each module NAME in MODULES has a pure twin `qag._speedups.NAME` and a compiled twin
`qag._speedups._NAME` (built from `_NAME.pyx` by build_backend) with the same behaviour.
Use `get(NAME)` for the selected one, never `qag._speedups.NAME` (that is always the pure twin).
`load(mode)` selects for every module at once; until it is called, the first `get()` loads
with $QAG_SPEEDUPS (default auto). `loaded()` tells which twin each module runs, for
`qag version` and the startup log; `fallbacks()` tells why auto fell back to a pure twin.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

from . import request_path

__all__ = ["MODES", "MODULES", "load", "get", "twin", "mode", "loaded", "summary", "fallbacks"]

MODES = ("auto", "require", "off")
MODULES = ("httphead", "mysqltime", "pgpipe", "respond", "rowjson", "shmsync", "tables")

_mode: str | None = None
_selected: dict[str, ModuleType] = {}
_kinds: dict[str, str] = {}
_fallbacks: dict[str, str] = {}
_path_kind = "pure"


def _check_name(name: str) -> None:
    if name not in MODULES:
        raise KeyError(f"qag._speedups has no module {name!r}; it has {', '.join(MODULES)}")


def twin(name: str, kind: str) -> ModuleType:
    """The "pure" or "compiled" twin of module `name`, whatever the mode (ImportError if not importable)."""
    _check_name(name)
    if kind == "pure":
        return importlib.import_module(f"{__name__}.{name}")
    if kind == "compiled":
        return importlib.import_module(f"{__name__}._{name}")
    raise ValueError(f"a twin is 'pure' or 'compiled', not {kind!r}")


def load(mode: str) -> None:
    """Select the twin of every module for `mode`: auto, require or off (ValueError otherwise)."""
    normalised = mode.strip().lower() if isinstance(mode, str) else None
    if normalised not in MODES:
        raise ValueError(f"QAG_SPEEDUPS must be auto, require or off, not {mode!r}")
    selected, kinds, fallbacks = {}, {}, {}
    for name in MODULES:
        module = None
        if normalised != "off":
            try:
                module = twin(name, "compiled")
            except ImportError as exc:
                if normalised == "require":
                    raise ImportError(
                        f"QAG_SPEEDUPS=require but the compiled module {__name__}._{name} cannot be "
                        f"imported ({exc}); build it (pip install -e . or python -m build_backend inplace) "
                        f"or set QAG_SPEEDUPS=auto", name=f"{__name__}._{name}") from exc
                fallbacks[name] = str(exc)
        kinds[name] = "pure" if module is None else "compiled"
        selected[name] = module if module is not None else twin(name, "pure")
    # The request path's modules compiled from their own source (request_path.py): refused under require when
    # missing or stale, otherwise reported as the import hook chooses them - by the mode this process started
    # with (its imports are done once), whatever mode is loaded here later.
    path_mode = "require" if normalised == "require" else request_path.mode()
    path_kind, path_reasons = request_path.status(path_mode)
    if path_reasons and path_mode != "off":
        fallbacks["request_path"] = "; ".join(f"{name}: {why}" for name, why in sorted(path_reasons.items()))
    # Published together only once every module is selected, so a failed load changes nothing.
    global _mode, _selected, _kinds, _fallbacks, _path_kind
    _selected, _kinds, _fallbacks, _mode, _path_kind = selected, kinds, fallbacks, normalised, path_kind


def _ensure_loaded() -> None:
    if _mode is None:
        load(os.environ.get("QAG_SPEEDUPS", "auto"))


def get(name: str) -> ModuleType:
    """The selected twin of module `name` (for example get("rowjson").encode_json)."""
    module = _selected.get(name)   # once loaded, one lookup: the request path asks on every call
    if module is None:
        _check_name(name)
        _ensure_loaded()
        module = _selected[name]
    return module


def mode() -> str:
    """The mode in force: auto, require or off."""
    _ensure_loaded()
    return _mode


def loaded() -> dict[str, str]:
    """Which twin each module runs: {"rowjson": "compiled"} or {"rowjson": "pure"}, ..."""
    _ensure_loaded()
    return dict(_kinds)


def summary() -> dict[str, str]:
    """loaded(), plus "request_path": whether the request path's own modules run compiled (qag version, the
    startup line)."""
    _ensure_loaded()
    return {**_kinds, "request_path": _path_kind}


def fallbacks() -> dict[str, str]:
    """Modules that auto mode runs pure because their compiled twin did not import, with the import error."""
    _ensure_loaded()
    return dict(_fallbacks)
