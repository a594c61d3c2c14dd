"""The simple-head twins (qag._speedups httphead): the same requests taken, the same bytes left to llhttp, the
same refusals.

A security test: what these take never reaches llhttp, so they must take only heads llhttp reads the same way
(tests/unit/test_worker_parser.py compares the parser with and without them) and keep every limit."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qag import _speedups
from qag.http11 import HttpError, Limits
from tests.speedups.conftest import compiled_or_skip

LIMITS = Limits(line=60, fields=4, field_size=40, body=64)


def outcome(module, data: bytes, limits=LIMITS):
    ready: deque = deque()
    try:
        result = module.take(data, limits, ready)
    except HttpError as exc:
        result = ("refused", exc.status, exc.message)
    return result, [(r.method, r.uri, r.version, r.headers, r.keep_alive, r.upgrade, r.body) for r in ready]


@pytest.fixture(scope="module")
def twins():
    return _speedups.twin("httphead", "pure"), compiled_or_skip("httphead")


def test_pipelined_simple_heads(speedups):
    data = (b"GET /q/c?id=7&x=%20 HTTP/1.1\r\nHost: a:1\r\nX-API-Key:  k \t\r\nAccept:\r\n\r\n"
            b"HEAD / HTTP/1.1\r\nConnection: keep-alive\r\nconnection: x\r\n\r\n"
            b"POST / HTTP/1.1\r\n")
    assert outcome(speedups.httphead, data) == ((len(data) - len(b"POST / HTTP/1.1\r\n"), False), [
        ("GET", "/q/c?id=7&x=%20", (1, 1), [("HOST", "a:1"), ("X-API-KEY", "k"), ("ACCEPT", "")], True, False, b""),
        ("HEAD", "/", (1, 1), [("CONNECTION", "keep-alive"), ("CONNECTION", "x")], True, False, b"")])


@pytest.mark.parametrize("head,keep", [
    (b"GET / HTTP/1.0\r\n\r\n", False),
    (b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", True),
    (b"GET / HTTP/1.1\r\nConnection: keep-alive, close\r\n\r\n", False),
    (b"GET / HTTP/1.1\r\nConnection: a\r\nConnection:\tCLOSE \r\n\r\n", False),
])
def test_the_connection_ends_as_http11_decides(speedups, head, keep):
    (used, dead), reqs = outcome(speedups.httphead, head + b"GET /next HTTP/1.1\r\n\r\n")
    assert reqs[0][4] is keep and dead is (not keep)
    assert used == (len(head) if not keep else len(head) + 22) and len(reqs) == (1 if not keep else 2)


@pytest.mark.parametrize("head", [
    b"POST / HTTP/1.1\r\n\r\n", b"get / HTTP/1.1\r\n\r\n", b"GET /a#f HTTP/1.1\r\n\r\n", b"GET * HTTP/1.1\r\n\r\n",
    b"GET http://a/ HTTP/1.1\r\n\r\n", b"GET / HTTP/1.2\r\n\r\n", b"GET / HTTP/2.0\r\n\r\n", b"GET  / HTTP/1.1\r\n\r\n",
    b"GET / HTTP/1.1\r\nContent-Length: 0\r\n\r\n", b"GET / HTTP/1.1\r\ntransfer-ENCODING: chunked\r\n\r\n",
    b"GET / HTTP/1.1\r\nUpgrade: h2c\r\n\r\n", b"GET / HTTP/1.1\r\nExpect: 100-continue\r\n\r\n",
    b"GET / HTTP/1.1\r\nX: caf\xc3\xa9\r\n\r\n", b"GET / HTTP/1.1\r\nX: a\r\n b\r\n\r\n", b"GET / HTTP/1.1\r\nX : a\r\n\r\n",
    b"GET / HTTP/1.1\r\n: a\r\n\r\n", b"GET / HTTP/1.1\nX: a\r\n\r\n", b"GET / HTTP/1.1\r\nX: a\n\r\n",
    b"GET / HTTP/1.1\r\nX: a\r\n", b"GET / HTTP/1.1\r\nX: a\r\n\r", b"GET /", b"\r\nGET / HTTP/1.1\r\n\r\n",
    b"GET / HTTP/1.1\r\nX: \x00\r\n\r\n", b"GET /\x7f HTTP/1.1\r\n\r\n", b"",
])
def test_other_heads_are_left_to_llhttp(speedups, head):
    assert outcome(speedups.httphead, head) == ((0, False), [])


def test_only_bytes_are_read(speedups):
    for data in (bytearray(b"GET / HTTP/1.1\r\n\r\n"), memoryview(b"GET / HTTP/1.1\r\n\r\n")):
        ready: deque = deque()
        assert speedups.httphead.take(data, LIMITS, ready) in ((0, False), (18, False))
        assert len(ready) <= 1


@pytest.mark.parametrize("data,status", [
    (b"GET /" + b"a" * 46 + b" HTTP/1.1\r\n\r\n", None),                     # 3 + 1 + 47 + 9 = 60: the limit
    (b"GET /" + b"a" * 47 + b" HTTP/1.1\r\n\r\n", 414),
    (b"HEAD /" + b"a" * 46 + b" HTTP/1.1\r\n\r\n", 414),
    (b"GET / HTTP/1.1\r\nX: " + b"a" * 37 + b"\r\n\r\n", None),               # 1 + 2 + 37 = 40
    (b"GET / HTTP/1.1\r\nX: " + b"a" * 38 + b"\r\n\r\n", 431),
    (b"GET / HTTP/1.1\r\nX:    " + b"a" * 37 + b"\r\n\r\n", None),            # leading whitespace not counted
    (b"GET / HTTP/1.1\r\nX: " + b"a" * 36 + b"  \r\n\r\n", 431),               # trailing whitespace counted
    (b"GET / HTTP/1.1\r\n" + b"X: 1\r\n" * 4 + b"\r\n", None),
    (b"GET / HTTP/1.1\r\n" + b"X: 1\r\n" * 5 + b"\r\n", 431),
])
def test_limits_refuse_as_http11_does(speedups, data, status):
    (result, reqs) = outcome(speedups.httphead, data)
    if status is None:
        assert result == (len(data), False) and len(reqs) == 1
    else:
        assert result[:2] == ("refused", status) and reqs == []


def test_a_refusal_keeps_the_requests_before_it(speedups):
    data = b"GET /a HTTP/1.1\r\n\r\nGET /" + b"b" * 60 + b" HTTP/1.1\r\n\r\n"
    assert outcome(speedups.httphead, data) == (("refused", 414, "request line too long"),
                                                [("GET", "/a", (1, 1), [], True, False, b"")])


_byte = st.sampled_from(list(b"azAZ09 \t-_.:/?=&%~!\"#$'()*+,;<>@[]^`{|}"))
_name = st.sampled_from([b"Host", b"X-API-Key", b"a", b"Connection", b"connection", b"Content-Length", b"Upgrade",
                         b"Expect", b"Transfer-Encoding", b"X_Y", b"!#$%&'*+.^`|~", b"X" * 30])
_value = st.one_of(st.lists(_byte, max_size=12).map(bytes),
                   st.sampled_from([b"close", b" keep-alive ", b"Keep-Alive, close", b"", b"a" * 38]))


@st.composite
def near_simple(draw):
    """Heads at and just past the edge of what the twins take: plain ones, then now and then one byte changed."""
    method = draw(st.sampled_from([b"GET", b"GET", b"HEAD", b"get", b"POST"]))
    path = b"/" + bytes(c for c in draw(st.lists(_byte, max_size=50)) if c != 32)
    version = draw(st.sampled_from([b"HTTP/1.1", b"HTTP/1.1", b"HTTP/1.0", b"HTTP/1.2"]))
    fields = draw(st.lists(st.tuples(_name, st.sampled_from([b":", b": ", b":\t ", b" :"]), _value), max_size=6))
    head = bytearray(method + b" " + path + b" " + version + b"\r\n"
                     + b"".join(n + sep + v + b"\r\n" for n, sep, v in fields) + b"\r\n")
    if draw(st.integers(0, 3)) == 0:
        head[draw(st.integers(0, len(head) - 1))] = draw(st.integers(0, 255))
    return bytes(head)


@settings(max_examples=600, deadline=None)
@given(st.lists(near_simple(), min_size=1, max_size=3), st.integers(0, 400))
def test_twins_agree(twins, heads, cut):
    pure, compiled = twins
    data = b"".join(heads)
    for chunk in (data, data[:cut]):
        assert outcome(compiled, chunk) == outcome(pure, chunk)
