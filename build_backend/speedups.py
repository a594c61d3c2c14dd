"""The speedups half of the build: the mode, the Cython extensions of qag/_speedups, and a reporting build_ext."""

from __future__ import annotations

import glob
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


def extensions(mode: str) -> list[Extension]:
    """One extension per qag/_speedups/_<name>.pyx (module qag._speedups._<name>), none when mode is off."""
    if mode == "off":
        return []
    sources = sorted(glob.glob(os.path.join(SPEEDUPS_DIR, "_*.pyx")))
    return [Extension("qag._speedups." + os.path.basename(path)[:-4], [path]) for path in sources]


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
        mode = resolve_mode()
        reason = cython_missing()
        if reason is None:
            from Cython.Build import cythonize

            try:
                translated = cythonize(self.extensions, build_dir=CYTHON_BUILD_DIR,
                                       compiler_directives={"language_level": 3})
            except Exception as exc:  # Cython reports its errors above and raises CompileError
                reason = f"Cython could not translate {SPEEDUPS_DIR}: {exc}"
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

    def _give_up(self, mode: str, reason: str) -> None:
        if mode == "require":
            raise SystemExit(f"qag build: {reason} ({ENV}=require)")
        banner(reason)


def setup_kwargs() -> dict:
    """The setup() arguments that pyproject.toml cannot hold: the extensions and their build command."""
    return {"ext_modules": extensions(resolve_mode()), "cmdclass": {"build_ext": BuildSpeedups}}
