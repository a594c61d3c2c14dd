"""In-tree PEP 517 backend: setuptools.build_meta, plus the speedups mode, a compiler check and a banner.

Mode: `--config-settings speedups=auto|require|off` (pip: `-C speedups=...`), else $QAG_BUILD_SPEEDUPS,
else auto. auto compiles qag/_speedups when Cython>=3 and a C compiler work and otherwise builds a pure
wheel after a banner on stderr; require fails instead; off never compiles. The mode reaches setup.py
through $QAG_BUILD_SPEEDUPS. Nothing here imports qag.
"""

from __future__ import annotations

import os

from setuptools import build_meta as _setuptools

from . import speedups as _speedups

__all__ = [
    "build_wheel", "build_sdist", "build_editable", "get_requires_for_build_wheel",
    "get_requires_for_build_sdist", "get_requires_for_build_editable",
    "prepare_metadata_for_build_wheel", "prepare_metadata_for_build_editable",
]


def _prepare(config_settings: dict | None, compiling: bool) -> dict | None:
    """Resolve the mode and hand it to setup.py; returns the settings setuptools should see."""
    settings = dict(config_settings or {})
    mode = _speedups.resolve_mode(settings.pop("speedups", None))
    if compiling and mode != "off" and _speedups.extensions(mode):
        # Checked before setuptools starts so that a build that cannot compile is tagged as pure.
        reason = _speedups.cannot_compile()
        if reason is not None:
            if mode == "require":
                raise SystemExit(f"qag build: cannot compile the speedups: {reason} ({_speedups.ENV}=require)")
            _speedups.banner(reason)
            mode = "off"
    os.environ[_speedups.ENV] = mode
    return settings or None


def get_requires_for_build_wheel(config_settings=None):
    return _setuptools.get_requires_for_build_wheel(_prepare(config_settings, False))


def get_requires_for_build_sdist(config_settings=None):
    return _setuptools.get_requires_for_build_sdist(_prepare(config_settings, False))


def get_requires_for_build_editable(config_settings=None):
    return _setuptools.get_requires_for_build_editable(_prepare(config_settings, False))


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    return _setuptools.prepare_metadata_for_build_wheel(metadata_directory, _prepare(config_settings, False))


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    return _setuptools.prepare_metadata_for_build_editable(metadata_directory, _prepare(config_settings, False))


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _setuptools.build_wheel(wheel_directory, _prepare(config_settings, True), metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _setuptools.build_editable(wheel_directory, _prepare(config_settings, True), metadata_directory)


def build_sdist(sdist_directory, config_settings=None):
    return _setuptools.build_sdist(sdist_directory, _prepare(config_settings, False))
