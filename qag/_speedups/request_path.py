"""The request path's own modules compiled from their .py sources, and the import hook that picks build or source.

Cython's pure-Python mode: qag/app.py, qag/api/run.py, ... are compiled as they are (build_backend lists them)
into extension modules beside their sources, each with a `<module>.source-sha256` file holding the digest of
the source it was built from. The source is the pure twin. `install(mode)` (from qag/__init__.py, before any of
them is imported) puts a finder first on sys.meta_path that, for a module with such a digest file, loads:

* QAG_SPEEDUPS=off: the source;
* auto: the compiled module when its digest matches the source's, else the source (a build older than the
  source is never run; `fallbacks()` says why);
* require: the compiled module, or ImportError when it is missing or stale.

Twins cannot change inside a running process (modules are imported once), unlike the _speedups modules.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

DIGEST_SUFFIX = ".source-sha256"

_finder: "_Finder | None" = None


def source_digest(path: str) -> str:
    """The SHA-256 of a source file's bytes, as the build records it."""
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def choose(directory: str, name: str, mode: str) -> tuple[str, str, str | None] | None:
    """(kind, file, why not compiled) for module `name` in `directory`, or None when it has no compiled build
    (no digest file: a module imported the usual way)."""
    digest_file = os.path.join(directory, name + DIGEST_SUFFIX)
    source = os.path.join(directory, name + ".py")
    if not os.path.exists(digest_file) or not os.path.exists(source):
        return None
    if mode == "off":
        return "pure", source, None
    compiled = next((os.path.join(directory, name + suffix) for suffix in importlib.machinery.EXTENSION_SUFFIXES
                     if os.path.exists(os.path.join(directory, name + suffix))), None)
    if compiled is None:
        why = "no compiled build beside the source"
    else:
        with open(digest_file, encoding="ascii") as fh:
            recorded = fh.read().strip()
        why = None if recorded == source_digest(source) else "the source changed after the build (rebuild)"
    if why is None:
        return "compiled", compiled, None
    if mode == "require":
        raise ImportError(f"QAG_SPEEDUPS=require but {os.path.join(directory, name)}: {why}", name=name)
    return "pure", source, why


class _Finder(importlib.abc.MetaPathFinder):
    """Finds qag's compiled request-path modules: the build or the source, by mode (see the module docstring)."""

    def __init__(self, mode: str):
        self.mode = mode
        self.kinds: dict[str, str] = {}
        self.fallbacks: dict[str, str] = {}

    def find_spec(self, fullname, path, target=None):
        if not fullname.startswith("qag.") or not path:
            return None
        last = fullname.rpartition(".")[2]
        for directory in path:
            found = choose(directory, last, self.mode)
            if found is None:
                continue
            kind, file, why = found
            self.kinds[fullname] = kind
            if why:
                self.fallbacks[fullname] = why
            if kind == "compiled":
                loader = importlib.machinery.ExtensionFileLoader(fullname, file)
                return importlib.util.spec_from_file_location(fullname, file, loader=loader)
            return importlib.util.spec_from_file_location(fullname, file)
        return None


def install(mode: str) -> None:
    """Put the finder first on sys.meta_path for this process (once); a mode other than off/require is auto."""
    global _finder
    if _finder is not None:
        return
    mode = mode.strip().lower() if isinstance(mode, str) else "auto"
    _finder = _Finder(mode if mode in ("off", "require") else "auto")
    sys.meta_path.insert(0, _finder)


def status(mode: str) -> tuple[str, dict[str, str]]:
    """What `mode` gives this installation's request path without importing it: ("compiled", {}) when every
    module with a build loads it, else ("pure", {module: why}); ("pure", {"qag": why}) for a build without
    any (a pure wheel). Raises ImportError under require, as the import would."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    why_not: dict[str, str] = {}
    found = 0
    for directory, _, files in os.walk(package):
        for file in files:
            if not file.endswith(DIGEST_SUFFIX):
                continue
            found += 1
            name = file[:-len(DIGEST_SUFFIX)]
            kind, _, why = choose(directory, name, mode)
            if kind != "compiled":
                module = os.path.relpath(os.path.join(directory, name), os.path.dirname(package))
                why_not[module.replace(os.sep, ".")] = why or "QAG_SPEEDUPS=off"
    if not found:
        if mode == "require":
            raise ImportError("QAG_SPEEDUPS=require but this build of qag has no compiled request path "
                              "(rebuild with a C compiler and Cython>=3)")
        return "pure", {"qag": "this build has no compiled request path"}
    return ("compiled" if not why_not else "pure"), why_not


def mode() -> str:
    """The mode the hook chooses by in this process (auto before install)."""
    return _finder.mode if _finder is not None else "auto"


def loaded() -> dict[str, str]:
    """The request-path modules imported so far and which twin each runs: {"qag.app": "compiled", ...}."""
    return dict(_finder.kinds) if _finder is not None else {}


def fallbacks() -> dict[str, str]:
    """Request-path modules that run from source although compiling was wanted, with the reason."""
    return dict(_finder.fallbacks) if _finder is not None else {}
