"""The speedups half of the build: the mode, the Cython extensions of qag/_speedups, and a reporting build_ext."""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
import tempfile
import threading
import time

import setuptools  # noqa: F401  (first, so `distutils` below is setuptools' copy on every Python)
from setuptools import Extension
from setuptools.command.build_ext import build_ext

MODES = ("auto", "require", "off")
ENV = "QAG_BUILD_SPEEDUPS"
SPEEDUPS_DIR = os.path.join("qag", "_speedups")
CYTHON_BUILD_DIR = os.path.join("build", "cython")
# Set by `python -m build_backend` to a descriptor on the terminal: the build's own lines go there while the
# tools' output (Cython, the compiler's commands and warnings) goes to a log. Unset (pip, `python -m build`):
# stderr, which pip shows with -v.
MESSAGES_FD = "QAG_BUILD_MESSAGES_FD"


def resolve_mode(value: object = None, source: str = "--config-settings speedups") -> str:
    """The build mode from `value` when given, else from $QAG_BUILD_SPEEDUPS (default auto); exits on anything else."""
    if value is None:
        value, source = os.environ.get(ENV, "auto"), ENV
    mode = value.strip().lower() if isinstance(value, str) else None
    if mode not in MODES:
        raise SystemExit(f"qag build: {source}={value!r} is not a speedups mode; use auto, require or off")
    return mode


def _load_list():
    """qag/_speedups/compiled.py, loaded by its path: the one list of compiled modules and the test of a current
    build, shared with qag's selector (importing qag itself would run that selector)."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "qag", "_speedups", "compiled.py")
    spec = importlib.util.spec_from_file_location("_qag_compiled_list", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LIST = _load_list()
DIGEST_SUFFIX = LIST.DIGEST_SUFFIX
# Annotations stay documentation: Cython would otherwise take `environ: dict` as "exactly a dict".
_PY_DIRECTIVES = {"language_level": 3, "annotation_typing": False}


def extensions(mode: str) -> list[Extension]:
    """One extension per module of qag/_speedups/compiled.py's list; none when mode is off."""
    if mode == "off":
        return []
    exts = []
    for path in LIST.COMPILED:
        # A .pxd typing a .py is a source of its build too: build_ext recompiles when it is newer than the build.
        ext = Extension(LIST.module(path), [path], depends=LIST.typing_files(path))
        ext.qag_source = path   # kept: cythonize replaces the sources with the generated C
        exts.append(ext)
    return exts


def digest_path(ext: Extension, built: str) -> str:
    """Where the digest of a compiled module's source goes: beside its build `built`."""
    return os.path.join(os.path.dirname(built), ext.name.rpartition(".")[2] + DIGEST_SUFFIX)


def write_digest(ext: Extension, built: str) -> None:
    """Beside a compiled module's build: the SHA-256 of the source it was built from (and of its .pxd)."""
    record = LIST.build_record(ext.qag_source)
    with open(digest_path(ext, built), "w", encoding="ascii") as fh:
        fh.write(record)


def cython_missing() -> str | None:
    """Why Cython cannot be used here, or None."""
    try:
        import Cython
    except ImportError:
        return "Cython is not installed in the build environment (qag needs Cython>=3)"
    major = Cython.__version__.split(".")[0]
    if not major.isdigit() or int(major) < 3:
        return f"Cython {Cython.__version__} is too old (qag needs Cython>=3)"
    return None


def cannot_compile() -> str | None:
    """Why the speedups cannot be compiled in this environment (no Cython, no working C compiler), or None."""
    reason = cython_missing()
    if reason:
        return reason
    from distutils.ccompiler import new_compiler
    from distutils.sysconfig import customize_compiler

    with tempfile.TemporaryDirectory(prefix="qag-probe-") as tmp:
        source = os.path.join(tmp, "probe.c")
        with open(source, "w") as f:
            f.write("#include <Python.h>\nint qag_probe(void) { return Py_IsInitialized(); }\n")
        compiler = new_compiler()
        customize_compiler(compiler)
        compiler.add_include_dir(sysconfig.get_paths()["include"])
        try:
            compiler.compile([source], output_dir=tmp)
        except Exception as exc:  # CompileError, a missing executable, ...: all mean "cannot compile"
            first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            return f"no working C compiler with the Python headers ({first_line})"
    return None


_say_lock = threading.Lock()


def say(text: str) -> None:
    """Lines for the person building: on $QAG_BUILD_MESSAGES_FD when set, else stderr; whole, from any thread."""
    data = (text.rstrip("\n") + "\n").encode("utf-8", "replace")
    fd = os.environ.get(MESSAGES_FD, "")
    with _say_lock:
        if fd.isdigit():
            try:
                os.write(int(fd), data)
                return
            except OSError:   # the runner is gone: stderr still reaches a log or pip -v
                pass
        print(text.rstrip("\n"), file=sys.stderr, flush=True)


def out_of_date(sources: list[str], target: str) -> bool:
    """Whether build_ext will compile `target` from `sources` (its test: a missing target, or a source missing
    or newer)."""
    if not os.path.exists(target):
        return True
    built = os.path.getmtime(target)
    return any(not os.path.exists(src) or os.path.getmtime(src) > built for src in sources)


def module_sources(root: str = ".") -> dict[str, str]:
    """{module: its source under `root`} for every module the build compiles (extensions() without the mode)."""
    return {LIST.module(path): os.path.join(root, path) for path in LIST.COMPILED}


def current_builds(root: str = ".") -> set[str]:
    """The modules whose build beside its source under `root` is one qag would run: present, with the digest of
    its source as the source is now (the selector's own test, qag/_speedups/compiled.py)."""
    return {LIST.module(path) for path in LIST.COMPILED if LIST.why_not_current(path, root) is None}


def _modules(count: int) -> str:
    return f"{count} module{'' if count == 1 else 's'}"


def _duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 60 else f"{int(seconds // 60)} min {int(seconds % 60):02d} s"


def banner(reason: str) -> None:
    """Tell, on stderr and hard to miss, that this build is pure Python and why."""
    rule = "*" * 78
    say("\n".join((
        rule,
        "qag: the compiled speedups (qag/_speedups) were NOT built; this build is pure Python.",
        f"  why: {reason}",
        "  qag works, but its hot path (row encoding, ...) runs slower; `qag version` shows which",
        "  twin is loaded. To compile: install a C compiler, the Python headers and Cython>=3,",
        "  then rebuild. To make this an error instead: QAG_BUILD_SPEEDUPS=require",
        "  (pip: -C speedups=require).",
        rule,
    )))


class BuildSpeedups(build_ext):
    """build_ext that cythonizes first, compiles on every core with a line per module, and, in auto mode, reports
    and skips what cannot be compiled."""

    def _jobs(self) -> int:
        if not self.parallel or self.parallel is True:
            return os.cpu_count() or 1
        return max(1, int(self.parallel))

    def run(self) -> None:
        if not self.extensions:
            return super().run()
        # Some forty modules: translated and compiled side by side (-j N, `python -m build_backend inplace -j N`).
        self.parallel = self._jobs()
        mode = resolve_mode()
        # Probed once here too (the PEP 517 backend did already): an in-place build without a compiler would
        # otherwise fail module by module, a banner each.
        reason = cannot_compile()
        if reason is None:
            from Cython.Build import cythonize

            py = [ext for ext in self.extensions if getattr(ext, "qag_source", "").endswith(".py")]
            pyx = [ext for ext in self.extensions if ext not in py]
            started = time.monotonic()
            try:
                translated = (cythonize(pyx, build_dir=CYTHON_BUILD_DIR, nthreads=self.parallel,
                                        compiler_directives={"language_level": 3})
                              + (cythonize(py, build_dir=CYTHON_BUILD_DIR, nthreads=self.parallel,
                                           compiler_directives=_PY_DIRECTIVES) if py else []))
            except Exception as exc:  # Cython reports its errors above and raises CompileError
                reason = f"Cython could not translate {SPEEDUPS_DIR} or the request path: {exc}"
            else:
                say(f"qag build: C sources of {_modules(len(translated))} ready (Cython, "
                    f"{_duration(time.monotonic() - started)})")
                # Only the sources change: setuptools has already set up its own state on these objects.
                c_sources = {ext.name: ext.sources for ext in translated}
                for ext in self.extensions:
                    ext.sources = c_sources[ext.name]
        if reason is not None:
            self._give_up(mode, reason)
            self.extensions = []
            return None
        return super().run()

    def build_extensions(self) -> None:
        # Here the targets are build_lib's (setuptools copies them beside the sources afterwards), the files
        # build_ext itself compares with the sources to skip what is up to date.
        self._todo = {ext.name for ext in self.extensions
                      if self.force or out_of_date(list(ext.sources) + list(ext.depends),
                                                   self.get_ext_fullpath(ext.name))}
        self._done = self._failed = 0
        self._count_lock = threading.Lock()
        # Largest C first: the long compiles start at once and the short ones fill the cores around them, so
        # the build does not end on one core compiling the biggest module alone.
        self.extensions.sort(key=lambda ext: -sum(os.path.getsize(src) for src in ext.sources
                                                  if os.path.exists(src)))
        for ext in self.extensions:
            # What a build killed mid-link left (SIGTERM gives no chance to clean up): never packed into a wheel.
            leftover = self.get_ext_fullpath(ext.name) + ".partial"
            if os.path.exists(leftover):
                os.remove(leftover)
        link = getattr(self.compiler, "link_shared_object", None)
        if link is not None:
            def link_whole(objects, output_filename, *args, **kwargs):
                # Linked beside, then renamed: a build stopped mid-link (Ctrl-C on `make demo`) leaves no
                # truncated module that the next build would take as up to date by its mtime.
                partial = output_filename + ".partial"
                try:
                    link(objects, partial, *args, **kwargs)
                except BaseException:
                    if os.path.exists(partial):
                        os.remove(partial)
                    raise
                os.replace(partial, output_filename)
            self.compiler.link_shared_object = link_whole
        started = time.monotonic()
        if self._todo:
            say(f"qag build: compiling {len(self._todo)} of {_modules(len(self.extensions))}, "
                f"{min(self.parallel, len(self._todo))} at a time")
        else:
            say(f"qag build: all {len(self.extensions)} compiled modules are up to date")
        super().build_extensions()
        if self._todo:
            failed = f", {self._failed} failed" if self._failed else ""
            say(f"qag build: {_modules(self._done - self._failed)} compiled{failed} in "
                f"{_duration(time.monotonic() - started)}")

    def build_extension(self, ext: Extension) -> None:
        started = time.monotonic()
        try:
            super().build_extension(ext)
        except Exception as exc:  # the compiler's own output is already above
            self._progress(ext, "FAILED")
            self._give_up(resolve_mode(), f"compiling {ext.name} failed: {exc}")
            return
        if hasattr(ext, "qag_source"):   # every module of the list; the tests' stand-ins have none
            write_digest(ext, self.get_ext_fullpath(ext.name))
        self._progress(ext, _duration(time.monotonic() - started))

    def _progress(self, ext: Extension, what: str) -> None:
        """One line per module compiled (none for one that was up to date), counted across the threads."""
        if ext.name not in getattr(self, "_todo", ()):
            return
        with self._count_lock:
            self._done += 1
            self._failed += what == "FAILED"
            total = len(self._todo)
            say(f"qag build: [{self._done:>{len(str(total))}}/{total}] {ext.name} ({what})")

    # An in-place or editable build copies each build back beside its source (setuptools' build_ext); the
    # digest files must travel with them.
    def _digest_pairs(self):
        build_py = self.get_finalized_command("build_py")
        for ext in self.extensions:
            if hasattr(ext, "qag_source"):
                inplace_file, regular_file = self._get_inplace_equivalent(build_py, ext)
                yield digest_path(ext, regular_file), digest_path(ext, inplace_file)

    def _get_output_mapping(self):
        yield from super()._get_output_mapping()
        if self.inplace:
            yield from self._digest_pairs()

    def copy_file(self, infile, outfile, *args, **kwargs):
        # Beside the sources a server or a test run may import a module at any moment, also while a build
        # copies (`make demo` starts on the pure twins while it builds): a new file appears whole, by rename,
        # and one already loaded keeps its own inode.
        partial = outfile + ".partial"
        _, copied = super().copy_file(infile, partial, *args, **kwargs)
        if os.path.exists(partial):
            os.replace(partial, outfile)
        return outfile, copied

    def copy_extensions_to_source(self) -> None:
        super().copy_extensions_to_source()
        for regular, inplace in self._digest_pairs():
            if os.path.exists(regular):
                self.copy_file(regular, inplace, level=self.verbose)

    def _give_up(self, mode: str, reason: str) -> None:
        if mode == "require":
            raise SystemExit(f"qag build: {reason} ({ENV}=require)")
        banner(reason)


def setup_kwargs() -> dict:
    """The setup() arguments that pyproject.toml cannot hold: the extensions and their build command."""
    return {"ext_modules": extensions(resolve_mode()), "cmdclass": {"build_ext": BuildSpeedups}}
