"""The one list of qag's compiled modules and the test of a current build: read by the build and by the selector."""

# Only the standard library: build_backend loads this file by its path, without importing qag.
from __future__ import annotations

import hashlib
import importlib.machinery
import os
import re

# Written beside each build: the SHA-256 of the source it was compiled from.
DIGEST_SUFFIX = ".source-sha256"

# Paths from the folder that holds qag/. A `.pyx` builds the compiled twin of the module named without its
# underscore (qag/_speedups/_rowjson.pyx -> qag._speedups._rowjson; the pure twin is qag/_speedups/rowjson.py).
# A `.py` is compiled as it is (Cython's pure-Python mode) into a module of its own name; its source is the pure
# twin. Those are the request path, chosen by profile: what a saved-query call runs, the worker included.
COMPILED = (
    "qag/_speedups/_httphead.pyx", "qag/_speedups/_myresult.pyx", "qag/_speedups/_mysqltime.pyx",
    "qag/_speedups/_pgpipe.pyx", "qag/_speedups/_respond.pyx", "qag/_speedups/_rowjson.pyx",
    "qag/_speedups/_shmsync.pyx", "qag/_speedups/_tables.pyx",
    "qag/app.py", "qag/auth.py", "qag/encode.py", "qag/http11.py",
    "qag/api/_common.py", "qag/api/_usage.py", "qag/api/run.py",
    "qag/backends/base.py", "qag/backends/_mysql_sql.py", "qag/backends/mysql.py", "qag/backends/pool.py",
    "qag/backends/postgres.py", "qag/backends/registry.py", "qag/backends/watchdog.py",
    "qag/cache/metadata.py", "qag/cache/shm.py",
    "qag/http/request.py", "qag/http/response.py", "qag/http/router.py",
    "qag/observe/events.py", "qag/observe/history.py", "qag/observe/live.py", "qag/observe/logs.py",
    "qag/observe/metrics.py", "qag/observe/observer.py",
    "qag/policy/grants.py", "qag/policy/guard.py", "qag/policy/masking.py",
    "qag/sql/params.py", "qag/sql/prepare.py", "qag/sql/window.py",
    "qag/store/sqlite.py",
    "qag/worker/parser.py", "qag/worker/poller.py", "qag/worker/wsgi.py", "qag/worker/worker.py",
)


def module(path: str) -> str:
    """The module an entry of COMPILED builds: "qag/api/run.py" -> "qag.api.run"."""
    return os.path.splitext(path)[0].replace("/", ".")


def twins() -> tuple[str, ...]:
    """The names of the .pyx twin pairs: ("httphead", "mysqltime", ...)."""
    return tuple(os.path.basename(path)[1:-len(".pyx")] for path in COMPILED if path.endswith(".pyx"))


def request_path() -> tuple[str, ...]:
    """The modules compiled from their own source: ("qag.app", ...)."""
    return tuple(module(path) for path in COMPILED if path.endswith(".py"))


def source_digest(path: str) -> str:
    """The SHA-256 of a source file's bytes, as the build records it."""
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def typing_file(source: str) -> str | None:
    """The .pxd beside a `.py` entry (same name) that types Cython's build of it, when there is one: the build is
    made from both, so both are in what it records."""
    if not source.endswith(".py"):
        return None
    pxd = source[:-len(".py")] + ".pxd"
    return pxd if os.path.exists(pxd) else None


_CIMPORT = re.compile(r"^[ \t]*(?:from[ \t]+(qag(?:\.\w+)+)[ \t]+cimport|cimport[ \t]+(qag(?:\.\w+)+))", re.MULTILINE)


def typing_files(source: str) -> list[str]:
    """Every .pxd Cython's build of `source` reads: its own (typing_file) and the qag .pxd files that it or the .pyx
    source cimports, at any depth. Their types and inline code are compiled into the build, so a change to any of
    them makes it stale (run as it is, it would fail its import-time check of the other module's type size, or run
    the old inline code)."""
    own = typing_file(source)
    where = os.sep + os.path.abspath(source)
    root = where[:where.rindex(os.sep + "qag" + os.sep)][1:] or os.sep   # the folder that holds qag/
    found = [own] if own is not None else []
    # A .py cimports nothing; a .pyx that isn't there (a wheel's tree, which has only builds) has nothing to read.
    queue = [own] if own is not None else [source] if source.endswith(".pyx") and os.path.exists(source) else []
    while queue:
        with open(queue.pop(), encoding="utf-8") as fh:
            text = fh.read()
        for match in _CIMPORT.finditer(text):
            pxd = os.path.join(root, *(match.group(1) or match.group(2)).split(".")) + ".pxd"
            if os.path.exists(pxd) and pxd not in found:
                found.append(pxd)
                queue.append(pxd)
    return found


def build_record(source: str) -> str:
    """What a build writes beside itself: the digest of its source, and for a module typed by .pxd files a line
    `pxd <digest>` for each (typing_files)."""
    return source_digest(source) + "\n" + "".join(f"pxd {source_digest(pxd)}\n" for pxd in typing_files(source))


def built_file(path: str, root: str) -> str | None:
    """The build of COMPILED entry `path` under `root` (the folder holding qag/), as the import system would find
    it, or None."""
    stem = os.path.join(root, os.path.splitext(path)[0])
    return next((stem + suffix for suffix in importlib.machinery.EXTENSION_SUFFIXES
                 if os.path.exists(stem + suffix)), None)


def why_not_current(path: str, root: str) -> str | None:
    """Why the build of COMPILED entry `path` under `root` is not one to run ("not built", "stale: ..."), or None
    when it is: present, with the digest of its source as the source is now, and of its .pxd when one types it.
    An installed wheel carries no .pyx and no .pxd sources: its builds of them are taken as they are."""
    if built_file(path, root) is None:
        return "not built"
    source = os.path.join(root, path)
    if not os.path.exists(source):
        return None
    try:
        with open(os.path.join(root, os.path.splitext(path)[0] + DIGEST_SUFFIX), encoding="ascii") as fh:
            recorded = fh.read().split("\n")
    except OSError:
        return "stale: built without the digest of its source"
    if recorded[0].strip() != source_digest(source):
        return "stale: its source changed after the build"
    typed = {line.strip() for line in recorded[1:]}
    for pxd in typing_files(source):
        if f"pxd {source_digest(pxd)}" not in typed:
            return "stale: its .pxd changed after the build" if pxd == typing_file(source) else \
                f"stale: {os.path.basename(pxd)}, which it cimports, changed after the build"
    return None
