"""The compiled speedups' part of the build (extensions, build_ext); all metadata is in pyproject.toml."""

from setuptools import setup

from build_backend.speedups import setup_kwargs

setup(**setup_kwargs())
