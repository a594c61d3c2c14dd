"""The response-field twins (qag._speedups respond): the same fields kept, the same head lines, the same refusals.

A security test: these checks are what keeps an application's field from splitting the response head, so the
compiled twin must refuse everything the pure one refuses, and name the same field."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from qag import _speedups
from tests.speedups.conftest import call_outcome, compiled_or_skip

TOKEN = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
NAMES = st.one_of(st.sampled_from(["X-A", "Content-Type", "content-length", "CONNECTION", "Date", "server",
                                   "Transfer-Encoding", "Keep-Alive", "te", "X Y", "", "X\nY", "é"]),
                  st.text(alphabet=TOKEN + " :\n\r\t", max_size=8))
VALUES = st.one_of(st.sampled_from(["", "1", " 2 ", "\t3\t", "close", " Close ", "keep-alive", "a\r\nX: 1",
                                    "x\ny", "\x7f", "é", "\u0100", "12abc", "+5", "1_0", "\xa05\x85"]),
                   st.text(alphabet=st.characters(max_codepoint=0x120), max_size=8))
ANY = st.one_of(NAMES, VALUES, st.none(), st.integers(), st.binary(max_size=3), st.lists(st.just("x"), max_size=1))
FIELDS = st.lists(st.one_of(st.tuples(NAMES, VALUES), st.tuples(ANY, ANY)), max_size=6)


def outcome(module, headers):
    return call_outcome(module.sort_fields, headers)


@pytest.fixture(scope="module")
def twins():
    return _speedups.twin("respond", "pure"), compiled_or_skip("respond")


def test_examples(speedups):
    sort = speedups.respond.sort_fields
    assert sort([("X-A", "1"), ("Content-Type", " text/plain \t"), ("Connection", " Close"), ("Date", "x"),
                 ("Transfer-Encoding", "chunked"), ("Content-Length", " 2 ")]) == (
        [("X-A", "1"), ("Content-Type", "text/plain"), ("Content-Length", "2")],
        b"X-A: 1\r\nContent-Type: text/plain\r\n", 2, True)
    assert sort(iter([("X-B", "é\t")])) == ([("X-B", "é")], "X-B: é\r\n".encode("latin-1"), None, False)
    assert sort([]) == ([], b"", None, False)
    assert sort([("Connection", "keep-alive")]) == ([], b"", None, False)


# Shared with tests/unit/test_worker_response.py, which sends them through the worker's start_response.
BAD_FIELDS = [
    ([("X-A", "1"), ("Bad Name", "x")], "invalid header name 'Bad Name'"),
    ([("X-A\nX-B", "x")], "invalid header name"),
    ([("X-A", "line\r\nInjected: 1")], "invalid value for header 'X-A'"),
    ([("X-A", "1"), ("X-B", "two\nlines")], "invalid value for header 'X-B'"),
    ([("X-A", "\u0100")], "invalid value for header 'X-A'"),
    ([("X-A", 1)], "invalid value for header 'X-A'"),
    ([(b"X-A", "1")], "invalid header name"),
    ([("", "1")], "invalid header name"),
    ([(["X-A"], "1")], "invalid header name"),
]


@pytest.mark.parametrize("headers, message", BAD_FIELDS)
def test_the_first_bad_field_is_named(speedups, headers, message):
    with pytest.raises(ValueError, match=message):
        speedups.respond.sort_fields(headers)


def test_a_name_seen_valid_still_has_its_value_checked(speedups):
    sort = speedups.respond.sort_fields
    assert sort([("X-Seen", "ok")])[0] == [("X-Seen", "ok")]
    for bad in ("bad\r\nInjected: 1", "\x00", None):
        with pytest.raises(ValueError, match="invalid value for header 'X-Seen'"):
            sort([("X-Seen", bad)])


@settings(max_examples=500, deadline=None)
@given(FIELDS)
def test_twins_agree(twins, headers):
    pure, compiled = twins
    assert outcome(compiled, headers) == outcome(pure, headers)


@pytest.mark.parametrize("kind", ["pure", "compiled"])
@given(headers=st.lists(st.tuples(st.text(alphabet=TOKEN + " \n:", max_size=6),
                                  st.text(alphabet=st.characters(max_codepoint=0x120), max_size=6)), max_size=5))
def test_accepted_exactly_when_each_field_matches_the_grammar(kind, headers):
    # (a valid but non-numeric Content-Length is refused by int(): not generated here)
    assume(all(n.lower() != "content-length" for n, _ in headers))
    module = _speedups.twin("respond", "pure") if kind == "pure" else compiled_or_skip("respond")
    each = all(module._NAME.fullmatch(n) and module._VALUE.fullmatch(v) for n, v in headers)
    assert (outcome(module, headers)[0] == "ok") == bool(each)


def test_a_name_is_looked_up_only_as_an_exact_str(speedups):
    # An object equal to a name seen valid (a str subclass, or anything hashing and comparing like it) is not
    # taken for it: the head is written from checked str only.
    sort = speedups.respond.sort_fields
    assert sort([("X-Known", "1")])[1] == b"X-Known: 1\r\n"

    class Name(str):
        pass

    class Lookalike:
        def __hash__(self):
            return hash("X-Known")

        def __eq__(self, other):
            return other == "X-Known"

    for name in (Name("X-Known"), Lookalike()):
        with pytest.raises(ValueError, match="invalid header name"):
            sort([(name, "1")])


def test_lines_are_the_kept_fields_in_latin_1(speedups):
    sort = speedups.respond.sort_fields
    kept, lines, _, _ = sort([("X-A", "\xe9t\xe9"), ("X-B", " padded\t"), ("Content-Length", "3"), ("X-C", "")])
    assert lines == b"".join(f"{n}: {v}\r\n".encode("latin-1") for n, v in kept if n != "Content-Length")
    assert lines == b"X-A: \xe9t\xe9\r\nX-B: padded\r\nX-C: \r\n"
