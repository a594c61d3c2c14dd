"""Fixtures that run each speedups test against the pure and the compiled twin."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from types import ModuleType

import pytest

from qag import _speedups


def required() -> bool:
    """Whether a compiled twin that is not built fails the test rather than skipping it: under QAG_SPEEDUPS=require,
    and in the full CI run (QAG_TEST_REQUIRE_SERVICES=1) unless QAG_SPEEDUPS=off says the run is the pure one (the
    unit tier in a bare environment, which has no build)."""
    mode = _speedups.mode()
    return mode == "require" or (os.environ.get("QAG_TEST_REQUIRE_SERVICES") == "1" and mode != "off")


def call_outcome(fn: Callable, *args) -> tuple:
    """("ok", result) or ("raised", exception type, text): what twins are compared on."""
    try:
        return ("ok", fn(*args))
    except Exception as exc:  # noqa: BLE001 - the exception type and text are what is compared
        return ("raised", type(exc), str(exc))


@contextlib.contextmanager
def other_thread_steps() -> Iterator[list]:
    """A Python thread counting while the block runs: the monotonic times of its steps, which show when the
    interpreter lock was free (a wait that kept it would leave a gap)."""
    seen, stop = [], threading.Event()

    def count():
        while not stop.is_set():
            seen.append(time.monotonic())

    counter = threading.Thread(target=count)
    counter.start()
    try:
        yield seen
    finally:
        stop.set()
        counter.join()


def compiled_or_skip(name: str) -> ModuleType:
    """The compiled twin of `name`; skips the test when it is not built (fails when required())."""
    try:
        return _speedups.twin(name, "compiled")
    except ImportError as exc:
        reason = (f"compiled twin qag._speedups._{name} is not built ({exc}): only the pure twin is tested here; "
                  "build it with `python -m build_backend inplace` or `pip install .`")
        if required():
            pytest.fail(f"the compiled twins must be tested in this run: {reason}")
        pytest.skip(reason)


class Twins:
    """The speedups modules of one kind: `twins.rowjson` is that kind's rowjson."""

    def __init__(self, kind: str):
        self.kind = kind

    def __getattr__(self, name: str) -> ModuleType:
        if name not in _speedups.MODULES:
            raise AttributeError(name)
        return _speedups.twin(name, "pure") if self.kind == "pure" else compiled_or_skip(name)

    def __repr__(self) -> str:
        return f"<{self.kind} twins>"


@pytest.fixture(params=["pure", "compiled"])
def speedups(request) -> Twins:
    """Each test using it runs once with the pure twins and once with the compiled ones."""
    return Twins(request.param)


@pytest.fixture(scope="session")
def twin_pair() -> Callable[[str], tuple[ModuleType, ModuleType]]:
    """pair(name) -> (pure, compiled) for differential tests; skips or fails like `speedups`."""
    def pair(name: str) -> tuple[ModuleType, ModuleType]:
        return _speedups.twin(name, "pure"), compiled_or_skip(name)
    return pair
