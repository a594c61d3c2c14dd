"""qag/shapes.py: its small schema reader agrees with a real JSON Schema validator on the fragments the
validators use, so what /openapi.json publishes is what the validators accept."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

jsonschema = pytest.importorskip("jsonschema")

from qag import shapes  # noqa: E402

FRAGMENTS = {
    "grace_minutes": shapes.GRACE_MINUTES, "max_concurrent": shapes.MAX_CONCURRENT, "max_rows": shapes.MAX_ROWS,
    "query_timeout": shapes.QUERY_TIMEOUT, "quota_count": shapes.QUOTA_COUNT, "cache_ttl": shapes.CACHE_TTL,
    "version": shapes.VERSION_NUMBER, "quota": shapes.QUOTA, "mask_rule": shapes.MASK_RULE,
    "query_name": shapes.QUERY_NAME_SCHEMA, "connection_name": shapes.CONNECTION_NAME_SCHEMA,
    "collection": shapes.COLLECTION_NAME_SCHEMA, "key_name": shapes.KEY_NAME_SCHEMA,
}

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2, 2 ** 64), st.floats(allow_nan=False),
                    st.integers(-5, 20_000).map(float), st.text(max_size=12),
                    st.sampled_from(["a.b", "*.phone", "ab", ".x", "x\n", "day", "month", "hash", "A b-1"]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3),
    st.dictionaries(st.sampled_from(["calls", "rows", "per", "column", "action", "x"]), inner, max_size=3)),
    max_leaves=6)


@pytest.mark.parametrize("name", sorted(FRAGMENTS))
@settings(max_examples=300, deadline=None)
@given(value=values)
def test_fits_agrees_with_jsonschema(name, value):
    schema = FRAGMENTS[name]
    expected = jsonschema.Draft202012Validator(schema).is_valid(value)
    assert shapes.fits(schema, value) is expected, (name, value)


def test_whole():
    assert shapes.whole(3) == 3 and shapes.whole(3.0) == 3 and type(shapes.whole(3.0)) is int
    assert shapes.whole(3.5) is None and shapes.whole(True) is None and shapes.whole("3") is None


def test_anchored_patterns_refuse_a_final_newline():
    import re
    assert re.search(shapes.anchored("[a-z]+"), "abc") and not re.search(shapes.anchored("[a-z]+"), "abc\n")
    assert shapes.QUERY_NAME.fullmatch("my query") and not shapes.QUERY_NAME.fullmatch("x\n")
