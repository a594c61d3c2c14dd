"""Query-string arguments (qag/http/request.py parse_query): percent and plus decoding, the first value of a
repeated name, refusals of malformed escapes and non-UTF-8, and the plain-argument shortcut deciding as the
full decoding does."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qag.errors import QagError
from qag.http.request import _decode_component, parse_query


def decoded_each_part(query: str) -> dict:
    """The arguments as the full decoding gives them, part by part (what the shortcut must agree with)."""
    args: dict = {}
    for part in query.split("&"):
        if part:
            name, _, value = part.partition("=")
            name = _decode_component(name, True)
            if name not in args:
                args[name] = _decode_component(value, True)
    return args


def outcome(fn, query):
    try:
        return ("ok", fn(query))
    except QagError as exc:
        return ("refused", exc.code, exc.message)


@pytest.mark.parametrize("query,args", [
    ("", {}), ("a=1&b=2", {"a": "1", "b": "2"}), ("a=1&a=2", {"a": "1"}), ("a&b=", {"a": "", "b": ""}),
    ("&&a=1&", {"a": "1"}), ("q=a+b%20c", {"q": "a b c"}), ("%C3%A9=%E2%82%AC", {"é": "€"}),
    ("a=1=2", {"a": "1=2"}), ("a+b=1&a%20b=2", {"a b": "1"}),
    ("x=caf\u00c3\u00a9", {"x": "café"}),   # WSGI hands UTF-8 bytes over as latin-1 text
])
def test_arguments(query, args):
    assert parse_query(query) == args


@pytest.mark.parametrize("query", ["v=%zz", "v=%f", "v=%ff", "%e9=1", "a=1&v=%G0", "x=caf\u00e9"])
def test_malformed_or_non_utf8_escapes_are_refused(query):
    with pytest.raises(QagError) as info:
        parse_query(query)
    assert info.value.code == "invalid_request"


def test_a_repeated_names_later_value_is_not_decoded():
    assert parse_query("a=1&a=%zz") == {"a": "1"}


PIECES = st.sampled_from(["a", "b", "=", "&", "+", "%", "%20", "%zz", "%C3%A9", "%e9", "é", "€", "1", "", "%2B",
                          "%26", "%3D", "\x7f", "\x80"])


@settings(max_examples=800, deadline=None)
@given(query=st.lists(PIECES, max_size=12).map("".join) | st.text(max_size=20))
def test_the_plain_shortcut_decides_as_full_decoding(query):
    assert outcome(parse_query, query) == outcome(decoded_each_part, query)
