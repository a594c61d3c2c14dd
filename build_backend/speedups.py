"""The speedups half of the build: the mode, the Cython extensions of qag/_speedups, and a reporting build_ext."""

from __future__ import annotations

import glob
import hashlib
import os
import sys
import sysconfig
import tempfile

import setuptools  # noqa: F401  (first, so `distutils` below is setuptools' copy on every Python)
from setuptools import Extension
from setuptools.command.build_ext import build_ext

MODES = ("auto", "require", "off")
ENV = "QAG_BUILD_SPEEDUPS"
SPEEDUPS_DIR = os.path.join("qag", "_speedups")
CYTHON_BUILD_DIR = os.path.join("build", "cython")


def resolve_mode(value: object = None, source: str = "--config-settings speedups") -> str:
    """The build mode from `value` when given, else from $QAG_BUILD_SPEEDUPS (default auto); exits on anything else."""
    if value is None:
        value, source = os.environ.get(ENV, "auto"), ENV
    mode = value.strip().lower() if isinstance(value, str) else None
    if mode not in MODES:
        raise SystemExit(f"qag build: {source}={value!r} is not a speedups mode; use auto, require or off")
    return mode


# The request path's own modules, compiled from their .py as they are (Cython's pure-Python mode); the source
# stays the pure twin, chosen at import by qag/_speedups/request_path.py, which also finds them by the digest
# file written beside each build. Chosen by profile: what a saved-query call runs, worker included.
REQUEST_PATH = ("qag/app.py", "qag/auth.py", "qag/encode.py", "qag/api/_common.py", "qag/api/_usage.py",
                "qag/api/run.py", "qag/sql/params.py", "qag/sql/prepare.py", "qag/sql/window.py",
                "qag/http/request.py", "qag/http/response.py", "qag/http/router.py", "qag/backends/base.py",
                "qag/backends/mysql.py", "qag/backends/_mysql_sql.py", "qag/backends/pool.py", "qag/backends/postgres.py",
                "qag/backends/registry.py", "qag/cache/metadata.py", "qag/cache/shm.py", "qag/observe/events.py",
                "qag/observe/history.py", "qag/observe/logs.py", "qag/observe/metrics.py",
                "qag/observe/observer.py", "qag/policy/grants.py", "qag/policy/guard.py", "qag/policy/masking.py",
                "qag/worker/http11.py", "qag/worker/parser.py", "qag/worker/poller.py", "qag/worker/wsgi.py",
                "qag/store/sqlite.py", "qag/worker/worker.py")
DIGEST_SUFFIX = ".source-sha256"   # as qag/_speedups/request_path.py reads it (nothing here imports qag)
# Annotations stay documentation: Cython would otherwise take `environ: dict` as "exactly a dict".
_PY_DIRECTIVES = {"language_level": 3, "annotation_typing": False}


def extensions(mode: str) -> list[Extension]:
    """One extension per qag/_speedups/_<name>.pyx (module qag._speedups._<name>) and per request-path module
    (same name as its .py); none when mode is off."""
    if mode == "off":
        return []
    sources = sorted(glob.glob(os.path.join(SPEEDUPS_DIR, "_*.pyx")))
    exts = [Extension("qag._speedups." + os.path.basename(path)[:-4], [path]) for path in sources]
    for path in REQUEST_PATH:
        ext = Extension(path[:-3].replace("/", "."), [path])
        ext.qag_source = path   # kept: cythonize replaces the sources with the generated C
        exts.append(ext)
    return exts


def digest_path(ext: Extension, built: str) -> str:
    """Where the digest of a request-path module's source goes: beside its build `built`."""
    return os.path.join(os.path.dirname(built), ext.name.rpartition(".")[2] + DIGEST_SUFFIX)


def write_digest(ext: Extension, built: str) -> None:
    """Beside a request-path module's build: the SHA-256 of the source it was built from."""
    with open(ext.qag_source, "rb") as fh:
        digest = hashlib.sha256(fh.read()).hexdigest()
    with open(digest_path(ext, built), "w", encoding="ascii") as fh:
        fh.write(digest + "\n")


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


def banner(reason: str) -> None:
    """Tell, on stderr and hard to miss, that this build is pure Python and why."""
    rule = "*" * 78
    print("\n".join((
        rule,
        "qag: the compiled speedups (qag/_speedups) were NOT built; this build is pure Python.",
        f"  why: {reason}",
        "  qag works, but its hot path (row encoding, ...) runs slower; `qag version` shows which",
        "  twin is loaded. To compile: install a C compiler, the Python headers and Cython>=3,",
        "  then rebuild. To make this an error instead: QAG_BUILD_SPEEDUPS=require",
        "  (pip: -C speedups=require).",
        rule,
    )), file=sys.stderr, flush=True)


class BuildSpeedups(build_ext):
    """build_ext that cythonizes first and, in auto mode, reports and skips what cannot be compiled."""

    def run(self) -> None:
        if not self.extensions:
            return super().run()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1   # some thirty modules: compile them side by side
        mode = resolve_mode()
        reason = cython_missing()
        if reason is None:
            from Cython.Build import cythonize

            pyx = [ext for ext in self.extensions if not hasattr(ext, "qag_source")]
            py = [ext for ext in self.extensions if hasattr(ext, "qag_source")]
            try:
                threads = os.cpu_count() or 1
                translated = (cythonize(pyx, build_dir=CYTHON_BUILD_DIR, nthreads=threads,
                                        compiler_directives={"language_level": 3})
                              + (cythonize(py, build_dir=CYTHON_BUILD_DIR, nthreads=threads,
                                           compiler_directives=_PY_DIRECTIVES) if py else []))
            except Exception as exc:  # Cython reports its errors above and raises CompileError
                reason = f"Cython could not translate {SPEEDUPS_DIR} or the request path: {exc}"
            else:
                # Only the sources change: setuptools has already set up its own state on these objects.
                c_sources = {ext.name: ext.sources for ext in translated}
                for ext in self.extensions:
                    ext.sources = c_sources[ext.name]
        if reason is not None:
            self._give_up(mode, reason)
            self.extensions = []
            return None
        return super().run()

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # the compiler's own output is already above
            self._give_up(resolve_mode(), f"compiling {ext.name} failed: {exc}")
            return
        if hasattr(ext, "qag_source"):
            write_digest(ext, self.get_ext_fullpath(ext.name))

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
