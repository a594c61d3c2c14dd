"""The table verdict twins (qag._speedups tables): same results and same exceptions on generated inputs.

A security test: the verdict decides which tables a key may read, so the compiled twin must never allow
what the pure one refuses."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qag import _speedups
from tests.speedups.conftest import call_outcome, compiled_or_skip

NAMES = st.sampled_from(["main.t", "main.secret", "crm.customer", "billing.customer", "shop.public.orders",
                         "", "MAIN.T", "main.t ", "é.ü"]) | st.text(max_size=12)
ANY = st.one_of(st.none(), st.integers(), st.binary(max_size=4), NAMES, st.tuples(NAMES))


def outcome(module, tables, grants):
    return call_outcome(module.forbidden, tables, grants)


@pytest.fixture(scope="module")
def twins():
    return _speedups.twin("tables", "pure"), compiled_or_skip("tables")


def test_examples(speedups):
    grants = frozenset({"main.t", "main.u"})
    assert speedups.tables.forbidden(("main.t",), grants) == ()
    assert speedups.tables.forbidden(("main.z", "main.t", "main.a"), grants) == ("main.a", "main.z")
    assert speedups.tables.forbidden((), frozenset()) == ()
    assert speedups.tables.forbidden(("main.t",), frozenset()) == ("main.t",)
    for tables, grants in ((["main.t"], frozenset()), (("main.t",), {"main.t"}), ((1,), frozenset()),
                           (None, frozenset())):
        with pytest.raises(TypeError):
            speedups.tables.forbidden(tables, grants)


@settings(max_examples=400, deadline=None)
@given(tables=st.lists(NAMES, max_size=12).map(tuple), grants=st.frozensets(NAMES, max_size=12))
def test_twins_agree_on_well_formed_inputs(twins, tables, grants):
    pure, compiled = twins
    expected = outcome(pure, tables, grants)
    assert outcome(compiled, tables, grants) == expected
    # The verdict itself: exactly the tables outside the grants, sorted, none allowed that isn't granted.
    assert expected == ("ok", tuple(sorted(t for t in tables if t not in grants)))


@settings(max_examples=300, deadline=None)
@given(tables=st.one_of(st.lists(ANY, max_size=5).map(tuple), ANY, st.lists(NAMES, max_size=3)),
       grants=st.one_of(st.frozensets(NAMES, max_size=4), st.sets(NAMES, max_size=3), ANY))
def test_twins_agree_on_bad_inputs(twins, tables, grants):
    pure, compiled = twins
    assert outcome(compiled, tables, grants) == outcome(pure, tables, grants)
