"""The one selector of compiled or pure code (qag/_speedups): its list, its test of a build, its choice, its reports."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from qag import _speedups
from qag._speedups import compiled
from qag.settings import SettingsError, value
from tests.speedups import conftest as speedups_conftest

REPO = Path(__file__).resolve().parents[2]
SUFFIX = compiled.importlib.machinery.EXTENSION_SUFFIXES[0]
# Optional drivers a request-path module imports at its top (extras: mysql, postgres).
DRIVERS = {"MySQLdb", "psycopg"}


# --- the list ---------------------------------------------------------------------------------------------------
def test_the_list_names_existing_sources_once():
    assert len(set(compiled.COMPILED)) == len(compiled.COMPILED)
    for path in compiled.COMPILED:
        assert (REPO / path).is_file(), path
        assert path.endswith(".py") or (path.startswith("qag/_speedups/_") and path.endswith(".pyx")), path
    assert set(_speedups.MODULES) == {p.stem[1:] for p in (REPO / "qag" / "_speedups").glob("_*.pyx")}
    for name in _speedups.MODULES:   # each .pyx has its pure twin
        assert (REPO / "qag" / "_speedups" / f"{name}.py").is_file(), name


# The code map's [c] marks are checked against compiled.COMPILED by tests/unit/test_docs_map.py.


def test_only_the_settings_read_qag_speedups_from_the_environment():
    """The mode is read once, through qag/settings.py (its table); no other qag module looks at the environment
    for it."""
    readers = []
    for path in (REPO / "qag").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value == "QAG_SPEEDUPS":
                readers.append(str(path.relative_to(REPO)))
    assert sorted(set(readers)) == ["qag/_speedups/__init__.py", "qag/settings.py"]


def test_the_mode_is_a_setting():
    assert value("QAG_SPEEDUPS", {}) == "auto"
    assert value("QAG_SPEEDUPS", {"QAG_SPEEDUPS": " Require "}) == "require"
    with pytest.raises(SettingsError, match="QAG_SPEEDUPS must be one of auto, require or off, not 'fast'"):
        value("QAG_SPEEDUPS", {"QAG_SPEEDUPS": "fast"})


# --- the test of a build ----------------------------------------------------------------------------------------
def _module(root: Path, source="X = 1\n", built=True, digest="match") -> str:
    path = "qag/m.py"
    (root / "qag").mkdir(exist_ok=True)
    (root / path).write_text(source)
    if built:
        (root / f"qag/m{SUFFIX}").write_bytes(b"")
    if digest is not None:
        text = compiled.source_digest(str(root / path)) if digest == "match" else digest
        (root / f"qag/m{compiled.DIGEST_SUFFIX}").write_text(text + "\n")
    return path


def test_a_build_with_the_digest_of_its_source_is_current(tmp_path):
    assert compiled.why_not_current(_module(tmp_path), str(tmp_path)) is None


def test_an_edited_source_makes_its_build_stale(tmp_path):
    path = _module(tmp_path)
    (tmp_path / path).write_text("X = 2\n")
    assert compiled.why_not_current(path, str(tmp_path)) == "stale: its source changed after the build"


def test_a_build_without_its_digest_is_stale_and_a_missing_one_not_built(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert compiled.why_not_current(_module(tmp_path / "a", digest=None), str(tmp_path / "a")).startswith("stale: ")
    assert compiled.why_not_current(_module(tmp_path / "b", built=False), str(tmp_path / "b")) == "not built"


def test_a_wheel_without_the_pyx_sources_takes_its_builds_as_they_are(tmp_path):
    (tmp_path / "qag" / "_speedups").mkdir(parents=True)
    (tmp_path / f"qag/_speedups/_rowjson{SUFFIX}").write_bytes(b"")
    assert compiled.why_not_current("qag/_speedups/_rowjson.pyx", str(tmp_path)) is None


def _typed_module(root: Path, pxd="cdef class A:\n    cdef public object a\n") -> str:
    """A module typed by a .pxd beside it, built from both: its digest file as the build writes it."""
    path = _module(root, digest=None)
    (root / "qag/m.pxd").write_text(pxd)
    (root / f"qag/m{compiled.DIGEST_SUFFIX}").write_text(compiled.build_record(str(root / path)))
    return path


def test_a_typed_build_records_its_pxd_and_an_edited_pxd_makes_it_stale(tmp_path):
    path = _typed_module(tmp_path)
    record = (tmp_path / f"qag/m{compiled.DIGEST_SUFFIX}").read_text().split("\n")
    assert record[1] == "pxd " + compiled.source_digest(str(tmp_path / "qag/m.pxd"))
    assert compiled.why_not_current(path, str(tmp_path)) is None
    (tmp_path / "qag/m.pxd").write_text("cdef class A:\n    cdef public object b\n")
    assert compiled.why_not_current(path, str(tmp_path)) == "stale: its .pxd changed after the build"


def test_a_pxd_that_another_cimports_is_in_its_build_record(tmp_path):
    """A .pxd that cimports another qag module's types (worker/wsgi.pxd: http11's Request) compiles them in: a change
    to the other .pxd makes the build stale, at any depth, while an unrelated or missing one doesn't count."""
    (tmp_path / "qag/sub").mkdir(parents=True)
    (tmp_path / "qag/sub/__init__.py").write_text("")
    (tmp_path / "qag/sub/base.pxd").write_text("from qag.sub.deep cimport D\ncdef class B:\n    cdef public object b\n")
    (tmp_path / "qag/sub/deep.pxd").write_text("cdef class D:\n    cdef public object d\n")
    path = _typed_module(tmp_path, pxd="cimport cython\nfrom qag.sub.base cimport B\nfrom qag.gone cimport G\n")
    assert compiled.typing_files(str(tmp_path / path)) == [
        str(tmp_path / "qag/m.pxd"), str(tmp_path / "qag/sub/base.pxd"), str(tmp_path / "qag/sub/deep.pxd")]
    assert compiled.why_not_current(path, str(tmp_path)) is None
    (tmp_path / "qag/sub/deep.pxd").write_text("cdef class D:\n    cdef public object d, e\n")
    assert compiled.why_not_current(path, str(tmp_path)) == \
        "stale: deep.pxd, which it cimports, changed after the build"


def test_a_pxd_that_a_pyx_twin_cimports_is_in_its_build_record(tmp_path):
    """A .pyx twin that cimports a qag .pxd (inline code: _pgpipe and _myresult cimport _lonewait) compiles that code
    in: a change to the .pxd, or to one it cimports, makes the build stale."""
    (tmp_path / "qag/_speedups").mkdir(parents=True)
    (tmp_path / "qag/_speedups/_shared.pxd").write_text("from qag._speedups._deeper cimport x\n"
                                                         "cdef inline int one() noexcept nogil:\n    return 1\n")
    (tmp_path / "qag/_speedups/_deeper.pxd").write_text("cdef inline int x() noexcept nogil:\n    return 2\n")
    path = "qag/_speedups/_twin.pyx"
    (tmp_path / path).write_text("from qag._speedups._shared cimport one\n")
    (tmp_path / f"qag/_speedups/_twin{SUFFIX}").write_bytes(b"")
    assert compiled.typing_files(str(tmp_path / path)) == [
        str(tmp_path / "qag/_speedups/_shared.pxd"), str(tmp_path / "qag/_speedups/_deeper.pxd")]
    (tmp_path / f"qag/_speedups/_twin{compiled.DIGEST_SUFFIX}").write_text(compiled.build_record(str(tmp_path / path)))
    assert compiled.why_not_current(path, str(tmp_path)) is None
    (tmp_path / "qag/_speedups/_deeper.pxd").write_text("cdef inline int x() noexcept nogil:\n    return 3\n")
    assert compiled.why_not_current(path, str(tmp_path)) == \
        "stale: _deeper.pxd, which it cimports, changed after the build"


def test_a_build_made_before_its_pxd_was_added_is_stale(tmp_path):
    path = _module(tmp_path)
    assert compiled.why_not_current(path, str(tmp_path)) is None
    (tmp_path / "qag/m.pxd").write_text("cdef class A:\n    pass\n")
    assert compiled.why_not_current(path, str(tmp_path)) == "stale: its .pxd changed after the build"


def test_a_module_without_a_pxd_records_its_source_digest_alone(tmp_path):
    path = _module(tmp_path, digest=None)
    assert compiled.build_record(str(tmp_path / path)) == compiled.source_digest(str(tmp_path / path)) + "\n"
    assert compiled.typing_file(str(tmp_path / path)) is None
    assert compiled.typing_file(str(tmp_path / "qag/_speedups/_rowjson.pyx")) is None


def test_a_wheel_without_the_pxd_takes_its_typed_build_as_it_is(tmp_path):
    path = _typed_module(tmp_path)
    (tmp_path / "qag/m.pxd").unlink()   # wheels carry the .py twins, never the .pxd (pyproject.toml)
    assert compiled.why_not_current(path, str(tmp_path)) is None
    (tmp_path / path).write_text("X = 2\n")
    assert compiled.why_not_current(path, str(tmp_path)) == "stale: its source changed after the build"


# --- the choice -------------------------------------------------------------------------------------------------
def test_compiled_only_when_every_build_is_current_and_httptools_is_there():
    assert _speedups.decide("auto", {}, True) == ("compiled", {})
    assert _speedups.decide("require", {}, True) == ("compiled", {})
    assert _speedups.decide("auto", {"qag.app": "stale: x"}, True) == ("pure", {"qag.app": "stale: x"})
    assert _speedups.decide("auto", {}, False) == ("pure", {"httptools": "not installed"})
    assert _speedups.decide("off", {"qag.app": "stale: x"}, True) == ("pure", {})


def _tree(tmp_path: Path, stale: bool) -> Path:
    """A copy of qag/ without any build; with `stale`, a stand-in build of qag/app.py from an older source (never
    loaded: a stale build is never run)."""
    root = tmp_path / "tree"
    shutil.copytree(REPO / "qag", root / "qag", ignore=shutil.ignore_patterns(
        "__pycache__", "*.so", f"*{compiled.DIGEST_SUFFIX}", "*.c", "*.partial"))
    if stale:
        (root / f"qag/app{SUFFIX}").write_bytes(b"not an extension module")
        (root / f"qag/app{compiled.DIGEST_SUFFIX}").write_text("0" * 64 + "\n")
    return root


def _qag(root: Path, mode: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QAG_", "QUERYAPIGATE_"))}
    env.update(PYTHONPATH=str(root), QAG_SPEEDUPS=mode, QAG_HOME=str(root / "home"))
    return subprocess.run([sys.executable, *args], cwd=root, env=env, capture_output=True, text=True, timeout=120)


def test_a_stale_build_runs_pure_with_a_warning_under_auto_and_is_refused_under_require(tmp_path):
    root = _tree(tmp_path, stale=True)
    auto = _qag(root, "auto", "-m", "qag", "version")
    assert auto.returncode == 0, auto.stderr
    assert "(speedups auto: request_path=pure," in auto.stdout and "http_parser=pure" in auto.stdout
    assert auto.stderr.count("\n") == 1 and auto.stderr.startswith("qag: warning: QAG_SPEEDUPS=auto runs pure")
    assert "qag.app: stale: its source changed after the build" in auto.stderr
    loaded = _qag(root, "auto", "-c", "import qag.app; print(qag.app.__file__)")
    assert loaded.stdout.strip().endswith("app.py"), loaded.stderr
    require = _qag(root, "require", "-m", "qag", "version")
    assert require.returncode != 0 and require.stdout == ""
    assert require.stderr.count("\n") == 1, require.stderr
    assert require.stderr.startswith("qag: QAG_SPEEDUPS=require but "), require.stderr
    assert "qag.app: stale" in require.stderr


def test_no_build_at_all_is_a_pure_installation_without_a_warning(tmp_path):
    root = _tree(tmp_path, stale=False)
    for mode in ("auto", "off"):
        out = _qag(root, mode, "-m", "qag", "version")
        assert out.returncode == 0 and out.stderr == "", out.stderr
        choices = dict(re.findall(r"(\w+)=(\w+)", out.stdout.split(": ", 1)[1]))
        assert set(choices) == {"request_path", *_speedups.MODULES, "http_parser"}
        assert set(choices.values()) == {"pure"}, out.stdout


def _imported_from(mode: str) -> dict[str, str]:
    """In a fresh interpreter under QAG_SPEEDUPS=mode: the file each request-path module was loaded from (those
    whose driver is not installed left out)."""
    code = ("import importlib, json, qag\nfrom qag._speedups import compiled\nfiles = {}\n"
            "for name in compiled.request_path():\n"
            "    try:\n        files[name] = importlib.import_module(name).__file__\n"
            f"    except ModuleNotFoundError as exc:\n        assert exc.name in {DRIVERS!r}, exc\n"
            "print(json.dumps(files))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=dict(os.environ, QAG_SPEEDUPS=mode),
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_off_imports_every_request_path_module_from_its_source():
    files = _imported_from("off")
    assert len(files) >= len(compiled.request_path()) - len(DRIVERS)
    assert all(path.endswith(".py") for path in files.values()), files


def test_this_tree_runs_compiled_when_every_build_is_current():
    not_current = _speedups.builds()
    if not_current:
        reason = f"not every build of this tree is current: {dict(list(not_current.items())[:3])}"
        if speedups_conftest.required():
            pytest.fail(reason)
        pytest.skip(reason)
    assert all(path.endswith(SUFFIX) for path in _imported_from("auto").values())


# --- the twin pairs ---------------------------------------------------------------------------------------------
@pytest.fixture
def selection(monkeypatch):
    """Install a selection of the given mode and kind for the test (the process's own is put back after)."""
    def install(mode: str, kind: str, problems=None):
        chosen = _speedups._Selection(mode, kind, problems or {})
        monkeypatch.setattr(_speedups, "_selection", chosen)
        return chosen
    return install


def test_a_pure_process_gets_the_pure_twins(selection):
    selection("off", "pure")
    assert _speedups.get("rowjson") is _speedups.twin("rowjson", "pure")
    assert set(_speedups.choices().values()) == {"pure"} and _speedups.fallbacks() == {}
    assert _speedups.check() is None


def test_a_compiled_twin_that_does_not_import_falls_back_under_auto_and_is_refused_under_require(
        selection, monkeypatch):
    pure_twin = _speedups.twin

    def twin(name, kind):
        """Every compiled twin imports (its pure twin stands in) but rowjson's, as where it can't be loaded."""
        if kind == "compiled" and name == "rowjson":
            raise ImportError("No module named 'qag._speedups._rowjson'")
        return pure_twin(name, "pure")
    monkeypatch.setattr(_speedups, "twin", twin)
    selection("auto", "compiled")
    assert _speedups.get("rowjson") is pure_twin("rowjson", "pure")
    assert _speedups.choices()["rowjson"] == "pure" and "qag._speedups._rowjson" in _speedups.fallbacks()["rowjson"]
    selection("require", "compiled")
    with pytest.raises(_speedups.SpeedupsError, match=r"QAG_SPEEDUPS=require but the compiled module "
                                                      r"qag\._speedups\._rowjson cannot be imported"):
        _speedups.get("rowjson")


def test_require_refuses_a_pure_process_in_one_line(selection):
    selection("require", "pure", {f"qag.m{i}": "not built" for i in range(5)})
    with pytest.raises(_speedups.SpeedupsError) as info:
        _speedups.check()
    assert "\n" not in str(info.value) and "and 2 more" in str(info.value)
    with pytest.raises(_speedups.SpeedupsError):
        _speedups.get("rowjson")


def test_unknown_names():
    with pytest.raises(KeyError, match="no twin pair 'nope'"):
        _speedups.get("nope")
    with pytest.raises(ValueError, match="'pure' or 'compiled'"):
        _speedups.twin("rowjson", "fast")


def test_a_compiled_twin_not_built_fails_when_required_and_skips_otherwise(monkeypatch):
    def missing(name, kind):
        raise ImportError(f"no compiled {name}")
    monkeypatch.setattr(speedups_conftest._speedups, "twin", missing)
    monkeypatch.setattr(speedups_conftest, "required", lambda: True)
    with pytest.raises(pytest.fail.Exception, match="the compiled twins must be tested in this run"):
        speedups_conftest.Twins("compiled").rowjson
    monkeypatch.setattr(speedups_conftest, "required", lambda: False)
    with pytest.raises(pytest.skip.Exception, match="only the pure twin is tested here"):
        speedups_conftest.Twins("compiled").rowjson
