"""Saved-query names in the URL: the verdict, and the set of names already judged valid (both twins)."""

from __future__ import annotations

import importlib.util
import os

import pytest

import qag.api._common as built

SOURCE = os.path.join(os.path.dirname(built.__file__), "_common.py")


def _source_twin():
    spec = importlib.util.spec_from_file_location("qag.api._common_source_twin", SOURCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(params=["loaded", "source"])
def common(request):
    module = built if request.param == "loaded" else _source_twin()
    module._VALID_QUERY_NAMES.clear()
    yield module
    module._VALID_QUERY_NAMES.clear()


VALID = ["customer", "orders by day", "v1.2-report", "a" * 100, "ünïcode_names"]
INVALID = ["", ".hidden", "a" * 101, "x/y", "x\\y", "semi;colon", "new\nline", "tab\tname", None, 7, b"customer"]


@pytest.mark.parametrize("name", VALID)
def test_valid_names_are_valid_every_time_and_remembered(common, name):
    assert [common.valid_query_name(name) for _ in range(3)] == [True] * 3
    assert name in common._VALID_QUERY_NAMES


@pytest.mark.parametrize("name", INVALID)
def test_invalid_names_stay_invalid_and_are_never_remembered(common, name):
    assert [common.valid_query_name(name) for _ in range(3)] == [False] * 3
    assert common._VALID_QUERY_NAMES == set()


def test_a_str_subclass_is_judged_but_never_remembered(common):
    class Sly(str):
        def __hash__(self):   # would find a remembered name's entry
            return hash("customer")

        def __eq__(self, other):
            return True

    assert common.valid_query_name("customer")
    assert not common.valid_query_name(Sly("../../etc/passwd"))
    assert common.valid_query_name(Sly("fine"))
    assert common._VALID_QUERY_NAMES == {"customer"}


def test_the_remembered_names_are_bounded_and_verdicts_survive_a_reset(common):
    limit = common._VALID_QUERY_NAMES_MAX
    names = [f"q{i}" for i in range(limit + 10)]
    assert all(common.valid_query_name(n) for n in names)
    assert len(common._VALID_QUERY_NAMES) <= limit
    assert all(common.valid_query_name(n) for n in names)
    assert not common.valid_query_name(".q1") and not common.valid_query_name("q1/..")
