"""The request path's compiled build or its source: what the import hook picks for each QAG_SPEEDUPS mode."""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import os
import subprocess
import sys

import pytest

from qag._speedups import request_path

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def _module(tmp_path, *, built: bool = True, digest: str | None = "match", source: str = "X = 1\n"):
    """A module `m` in tmp_path: its source, optionally a (stand-in) build and a digest file."""
    (tmp_path / "m.py").write_text(source)
    if built:
        (tmp_path / f"m{SUFFIX}").write_bytes(b"")
    if digest is not None:
        value = hashlib.sha256(source.encode()).hexdigest() if digest == "match" else digest
        (tmp_path / f"m{request_path.DIGEST_SUFFIX}").write_text(value + "\n")
    return str(tmp_path)


@pytest.mark.parametrize("mode", ["auto", "require"])
def test_a_build_of_the_current_source_is_chosen(tmp_path, mode):
    assert request_path.choose(_module(tmp_path), "m", mode) == ("compiled", str(tmp_path / f"m{SUFFIX}"), None)


def test_off_always_takes_the_source(tmp_path):
    assert request_path.choose(_module(tmp_path), "m", "off") == ("pure", str(tmp_path / "m.py"), None)


def test_a_build_of_an_older_source_is_never_run(tmp_path):
    directory = _module(tmp_path, digest="0" * 64)
    kind, file, why = request_path.choose(directory, "m", "auto")
    assert (kind, file) == ("pure", str(tmp_path / "m.py")) and "changed after the build" in why
    with pytest.raises(ImportError, match="changed after the build"):
        request_path.choose(directory, "m", "require")


def test_a_missing_build_falls_back_under_auto_and_is_refused_under_require(tmp_path):
    directory = _module(tmp_path, built=False)
    assert request_path.choose(directory, "m", "auto")[:2] == ("pure", str(tmp_path / "m.py"))
    with pytest.raises(ImportError, match="no compiled build"):
        request_path.choose(directory, "m", "require")


def test_a_module_without_a_digest_file_is_not_the_hooks(tmp_path):
    assert request_path.choose(_module(tmp_path, digest=None), "m", "auto") is None


def _imported_from(mode: str) -> dict[str, str]:
    """In a fresh interpreter under QAG_SPEEDUPS=mode: the file each request-path module was loaded from."""
    code = ("import importlib, json, qag\n"
            "names = ['qag.app', 'qag.api.run', 'qag.backends.mysql', 'qag.worker.wsgi', 'qag.cache.metadata']\n"
            "print(json.dumps({n: importlib.import_module(n).__file__ for n in names}))\n")
    env = dict(os.environ, QAG_SPEEDUPS=mode)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_off_imports_every_request_path_module_from_its_source():
    assert all(path.endswith(".py") for path in _imported_from("off").values())


def test_this_build_runs_compiled_when_it_has_a_build():
    kind, why_not = request_path.status("auto")
    if kind != "compiled":
        if os.environ.get("QAG_SPEEDUPS", "").strip().lower() == "require":
            pytest.fail(f"QAG_SPEEDUPS=require but the request path is not compiled: {why_not}")
        pytest.skip(f"this build's request path is not compiled: {why_not}")
    assert all(path.endswith(SUFFIX) for path in _imported_from("auto").values())
