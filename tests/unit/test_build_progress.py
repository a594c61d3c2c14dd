"""The build's own lines (one per module compiled, counted), its parallel compiles, and which builds are current."""

from __future__ import annotations

import hashlib
import os
import sysconfig
import threading
import time

import pytest

speedups = pytest.importorskip("build_backend.speedups", reason="the build helpers live in the source tree only")

from setuptools import Distribution, Extension  # noqa: E402  (after the skip: setuptools comes with the tree's tools)

SUFFIX = sysconfig.get_config_var("EXT_SUFFIX")


@pytest.fixture
def messages(tmp_path, monkeypatch):
    """What the build says, read from the descriptor `python -m build_backend` would hand it."""
    path = tmp_path / "messages"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    monkeypatch.setenv(speedups.MESSAGES_FD, str(fd))
    yield lambda: path.read_text()
    os.close(fd)


@pytest.fixture
def fake_compiler(monkeypatch):
    """setuptools' compile of one extension replaced: 0.4 s of waiting, then the target written. Returns the
    (name, start, end) of each compile, in the order they started."""
    calls: list[list] = []

    def build_extension(self, ext):
        record = [ext.name, time.monotonic(), None]
        calls.append(record)
        time.sleep(0.4)
        if ext.name.endswith("bad"):
            from distutils.errors import CompileError
            raise CompileError("error: stand-in compiler says no")
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as fh:
            fh.write(b"built")
        record[2] = time.monotonic()

    monkeypatch.setattr(speedups.build_ext, "build_extension", build_extension)
    return calls


def _command(tmp_path, sources: dict[str, int], jobs: int, fresh: tuple[str, ...] = ()):
    """A BuildSpeedups over stand-in C sources {module: size}; the modules in `fresh` already built."""
    exts = []
    for name, size in sources.items():
        source = tmp_path / f"{name}.c"
        source.write_bytes(b"x" * size)
        exts.append(Extension(name, [str(source)]))
    cmd = speedups.BuildSpeedups(Distribution({"name": "stand-in", "ext_modules": exts}))
    cmd.build_lib, cmd.build_temp, cmd.parallel = str(tmp_path / "lib"), str(tmp_path / "temp"), jobs
    cmd.ensure_finalized()
    for name in fresh:
        target = cmd.get_ext_fullpath(name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as fh:
            fh.write(b"old build")
        later = os.path.getmtime(tmp_path / f"{name}.c") + 10
        os.utime(target, (later, later))
    return cmd


def test_a_line_per_module_compiled_counted_and_none_for_the_up_to_date(tmp_path, messages, fake_compiler):
    cmd = _command(tmp_path, {"pkg.small": 10, "pkg.big": 3000, "pkg.fresh": 500}, jobs=2, fresh=("pkg.fresh",))
    cmd.build_extensions()
    said = messages().splitlines()
    assert said[0] == "qag build: compiling 2 of 3 modules, 2 at a time"
    progress = [line for line in said if line.startswith("qag build: [")]
    assert [line.split("] ")[0] for line in progress] == ["qag build: [1/2", "qag build: [2/2"]
    assert {line.split("] ")[1].split(" (")[0] for line in progress} == {"pkg.small", "pkg.big"}
    assert said[-1].startswith("qag build: 2 modules compiled in ")
    assert not any("pkg.fresh" in line for line in said)


def test_nothing_to_do_says_so_in_one_line(tmp_path, messages, fake_compiler):
    cmd = _command(tmp_path, {"pkg.a": 10}, jobs=2, fresh=("pkg.a",))
    cmd.build_extensions()
    assert messages().splitlines() == ["qag build: all 1 compiled modules are up to date"]


def test_modules_compile_side_by_side_with_several_jobs(tmp_path, messages, fake_compiler):
    _command(tmp_path, {"pkg.a": 10, "pkg.b": 20}, jobs=2).build_extensions()
    (_, start_a, end_a), (_, start_b, end_b) = fake_compiler
    assert start_b < end_a and start_a < end_b, fake_compiler   # the two compiles overlapped


def test_every_core_by_default(tmp_path):
    cmd = _command(tmp_path, {"pkg.a": 10}, jobs=None)
    assert cmd._jobs() == (os.cpu_count() or 1)
    cmd.parallel = "3"   # as `-j 3` arrives before finalize_options
    assert cmd._jobs() == 3


def test_one_job_compiles_one_at_a_time_largest_first(tmp_path, messages, fake_compiler):
    _command(tmp_path, {"pkg.small": 10, "pkg.mid": 200, "pkg.big": 3000}, jobs=1).build_extensions()
    assert [name for name, _, _ in fake_compiler] == ["pkg.big", "pkg.mid", "pkg.small"]
    for (_, _, end), (_, start, _) in zip(fake_compiler, fake_compiler[1:]):
        assert end <= start


def test_a_failed_module_is_said_and_the_rest_still_built_under_auto(tmp_path, messages, fake_compiler, monkeypatch):
    monkeypatch.setenv(speedups.ENV, "auto")
    cmd = _command(tmp_path, {"pkg.bad": 10, "pkg.good": 20}, jobs=2)
    cmd.build_extensions()
    said = messages()
    assert "] pkg.bad (FAILED)" in said and "were NOT built" in said and "stand-in compiler says no" in said
    assert said.splitlines()[-1].startswith("qag build: 1 module compiled, 1 failed in ")
    assert os.path.exists(cmd.get_ext_fullpath("pkg.good"))


def test_a_failed_module_stops_the_build_under_require(tmp_path, messages, fake_compiler, monkeypatch):
    monkeypatch.setenv(speedups.ENV, "require")
    with pytest.raises(SystemExit, match="compiling pkg.bad failed"):
        _command(tmp_path, {"pkg.bad": 10}, jobs=1).build_extensions()


def test_messages_from_many_threads_stay_whole_lines(messages):
    threads = [threading.Thread(target=lambda i=i: [speedups.say(f"line {i} " + "x" * 300) for _ in range(50)])
               for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = messages().splitlines()
    assert len(lines) == 400 and all(line.startswith("line ") and line.endswith("x" * 300) for line in lines)


# --- which builds beside the sources qag would run ---------------------------------------------------------------
def _built(root, path: str, source: bytes) -> None:
    """`path` (an entry of qag/_speedups/compiled.py's list) under `root` with a current build beside it."""
    file = root / path
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_bytes(source)
    stem = os.path.splitext(str(file))[0]
    with open(stem + SUFFIX, "wb"):
        pass
    with open(stem + speedups.DIGEST_SUFFIX, "w") as fh:
        fh.write(hashlib.sha256(source).hexdigest() + "\n")


def _tree(tmp_path):
    """A stand-in tree: the request path's qag/app.py and qag/_speedups/_rowjson.pyx, each with a current build."""
    _built(tmp_path, "qag/app.py", b"X = 1\n")
    _built(tmp_path, "qag/_speedups/_rowjson.pyx", b"")
    return tmp_path


def test_current_builds_are_those_of_the_source_as_it_is(tmp_path):
    root = _tree(tmp_path)
    assert speedups.current_builds(str(root)) == {"qag.app", "qag._speedups._rowjson"}
    assert "qag.app" in speedups.module_sources(str(root)) and "qag.api.run" in speedups.module_sources(str(root))


def test_an_edited_source_makes_its_build_stale(tmp_path):
    root = _tree(tmp_path)
    (root / "qag" / "app.py").write_text("X = 2\n")                  # the digests no longer match
    (root / "qag" / "_speedups" / "_rowjson.pyx").write_text("# edited\n")
    assert speedups.current_builds(str(root)) == set()


def test_a_build_without_its_digest_or_missing_is_not_current(tmp_path):
    root = _tree(tmp_path)
    (root / "qag" / f"app{speedups.DIGEST_SUFFIX}").unlink()
    (root / "qag" / "_speedups" / f"_rowjson{SUFFIX}").unlink()
    assert speedups.current_builds(str(root)) == set()


def test_a_pxd_typing_a_module_is_a_dependency_of_its_extension(tmp_path, monkeypatch):
    """build_ext compares a build with its sources and depends: a newer .pxd alone must rebuild the module."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "qag" / "api").mkdir(parents=True)
    (tmp_path / "qag" / "api" / "run.py").write_text("X = 1\n")
    (tmp_path / "qag" / "api" / "run.pxd").write_text("cdef class A:\n    pass\n")
    by_name = {ext.name: ext for ext in speedups.extensions("auto")}
    assert by_name["qag.api.run"].depends == ["qag/api/run.pxd"]
    assert by_name["qag.app"].depends == []


# --- builds appear whole ---------------------------------------------------------------------------------------
class _Linker:
    """A stand-in linker writing its output in two steps, interrupted in between when `stop`."""

    def __init__(self, stop: bool = False):
        self.stop = stop

    def link_shared_object(self, objects, output_filename, *args, **kwargs):
        os.makedirs(os.path.dirname(output_filename), exist_ok=True)
        with open(output_filename, "wb") as fh:
            fh.write(b"half a module")
            fh.flush()
            if self.stop:
                raise KeyboardInterrupt   # Ctrl-C on `make demo` mid-link
            fh.write(b", and the rest")


def test_a_module_is_linked_whole_or_not_at_all(tmp_path, messages, monkeypatch):
    monkeypatch.setattr(speedups.build_ext, "build_extension",
                        lambda self, ext: self.compiler.link_shared_object([], self.get_ext_fullpath(ext.name)))
    cmd = _command(tmp_path, {"pkg.ok": 10}, jobs=1)
    cmd.compiler = _Linker()
    cmd.build_extensions()
    with open(cmd.get_ext_fullpath("pkg.ok"), "rb") as fh:
        assert fh.read() == b"half a module, and the rest"
    stopped = _command(tmp_path, {"pkg.stop": 10}, jobs=1)
    stopped.compiler = _Linker(stop=True)
    with pytest.raises(KeyboardInterrupt):
        stopped.build_extensions()
    # Nothing at the module's path: the next build compiles it again instead of taking half a file as current.
    target = stopped.get_ext_fullpath("pkg.stop")
    assert not os.path.exists(target) and not os.path.exists(target + ".partial")
    assert speedups.out_of_date([str(tmp_path / "pkg.stop.c")], target)


def test_what_a_killed_link_left_is_removed_by_the_next_build(tmp_path, messages, fake_compiler):
    cmd = _command(tmp_path, {"pkg.a": 10}, jobs=1, fresh=("pkg.a",))
    leftover = cmd.get_ext_fullpath("pkg.a") + ".partial"   # SIGTERM mid-link: no except clause ran
    with open(leftover, "wb") as fh:
        fh.write(b"half a module")
    cmd.build_extensions()   # pkg.a is up to date: nothing relinks over the leftover
    assert not os.path.exists(leftover)


def test_a_copy_beside_the_sources_never_shows_half_a_file(tmp_path, monkeypatch):
    cmd = _command(tmp_path, {"pkg.a": 10}, jobs=1)
    target, new = tmp_path / "m.so", tmp_path / "new.so"
    target.write_bytes(b"old build")
    new.write_bytes(b"new build")
    seen_during = []
    copy = speedups.build_ext.copy_file

    def watched(self, infile, outfile, *args, **kwargs):
        result = copy(self, infile, outfile, *args, **kwargs)
        seen_during.append(target.read_bytes())   # what an importer would find at that moment
        return result

    monkeypatch.setattr(speedups.build_ext, "copy_file", watched)
    loaded = open(target, "rb")   # a process that has the old build loaded
    try:
        assert cmd.copy_file(str(new), str(target)) == (str(target), True)
        assert seen_during == [b"old build"] and target.read_bytes() == b"new build"
        assert loaded.read() == b"old build"
    finally:
        loaded.close()
    assert not list(tmp_path.glob("*.partial"))
