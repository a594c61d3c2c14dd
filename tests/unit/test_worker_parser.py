"""qag's worker's request parser twins (httptools and pure Python): same requests, same refusals, any split."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qag import _speedups
from qag.worker import parser as parser_mod
from qag.worker._parser_pure import Parser as PureParser
from qag.http11 import HttpError, Limits

REQUIRE = _speedups.mode() == "require"


def _c_parser():
    if parser_mod.httptools is None:
        if REQUIRE:
            pytest.fail("QAG_SPEEDUPS=require: httptools is not installed")
        pytest.skip("httptools is not installed")
    return parser_mod.CParser


LIMITS = Limits(line=200, fields=8, field_size=120, body=64)


def outcome(cls, chunks, limits=LIMITS, simple=True):
    """What a parser made of the chunks: the requests, then an error status or the connection's state.
    simple=False: the httptools twin without the simple-head twins (llhttp parses everything)."""
    p = cls(limits)
    if not simple:
        p.take_simple = None
    try:
        for chunk in chunks:
            p.feed(chunk)
    except HttpError as exc:
        # which check fires first can differ (llhttp refuses CL+TE inside the head, before the count
        # of fields is over): both twins refuse, with a 4xx; the fixed cases pin the statuses
        assert 400 <= exc.status < 500
        tail = ("error",)
    else:
        tail = ("partial" if p.partial else "idle", p.dead, p.continue_due is not None)
    reqs = [(r.method, r.uri, r.version, r.headers, r.body, r.keep_alive, r.over_limit, r.chunked,
             r.content_length, r.expect_continue) for r in p.ready]
    return reqs, tail


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    out, last = [], 0
    for point in points:
        out.append(data[last:point])
        last = point
    out.append(data[last:])
    return [c for c in out if c]


@pytest.fixture(params=["pure", "compiled"])
def twin(request):
    return PureParser if request.param == "pure" else _c_parser()


# --- the two twins on fixed cases ---------------------------------------------------------------------------
def test_pipelined_requests_and_bodies(twin):
    data = (b"POST /a?b=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
            b"POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2;e=1\r\nde\r\n1\r\nf\r\n0\r\nT: 1\r\n\r\n"
            b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    reqs, tail = outcome(twin, [data])
    assert [(r[0], r[1], r[4], r[5]) for r in reqs] == [("POST", "/a?b=1", b"abc", True), ("POST", "/c", b"def", True),
                                                        ("GET", "/", b"", True)]
    assert reqs[0][3] == [("HOST", "x"), ("CONTENT-LENGTH", "3")]
    assert tail == ("idle", False, False)


@pytest.mark.parametrize("data,status", [
    (b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc", 400),
    (b"POST / HTTP/1.1\r\nContent-Length: -3\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n", 400),
    (b"GET / HTTP/1.2\r\n\r\n", 400), (b"GET / HTTP/2.0\r\n\r\n", 400), (b"get / HTTP/1.1\r\n\r\n", 400),
    (b"GET /a\x00 HTTP/1.1\r\n\r\n", 400), (b"GET / HTTP/1.1\r\nX: a\r\n b\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nX : a\r\n\r\n", 400), (b"GET / HTTP/1.1\r\nX: a\x00\r\n\r\n", 400),
    (b"GET /" + b"a" * 300 + b" HTTP/1.1\r\n\r\n", 400),    # 414
    (b"GET / HTTP/1.1\r\nX: " + b"a" * 200 + b"\r\n\r\n", 431),
    (b"GET / HTTP/1.1\r\n" + b"X: 1\r\n" * 9 + b"\r\n", 431),
    (b"GET / HTTP/1.1\r\nExpect: nope\r\n\r\n", 400),        # 417
    (b"CONNECT a:1 HTTP/1.1\r\n\r\n", 400),
])
def test_refusals(twin, data, status):
    reqs, tail = outcome(twin, [data])
    assert reqs == [] and tail == ("error",)


def test_statuses_of_limits(twin):
    for data, status in [(b"GET /" + b"a" * 300 + b" HTTP/1.1\r\n\r\n", 414),
                         (b"GET / HTTP/1.1\r\nX: " + b"a" * 200 + b"\r\n\r\n", 431),
                         (b"GET / HTTP/1.1\r\nExpect: nope\r\n\r\n", 417)]:
        p = twin(LIMITS)
        with pytest.raises(HttpError) as info:
            p.feed(data)
        assert info.value.status == status


@pytest.mark.parametrize("field", [b"Content-Length: 5", b"content-length: 0", b"Transfer-Encoding: chunked",
                                   b"TRANSFER-ENCODING: x"])
def test_a_framing_field_in_a_trailer_is_refused_with_what_follows(twin, field):
    # llhttp's verdict: a trailer can't reframe the message, and a request smuggled after it is never read
    data = (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n" + field + b"\r\n\r\n"
            b"GET /smuggled HTTP/1.1\r\n\r\n")
    reqs, tail = outcome(twin, [data])
    assert (reqs, tail) == ([], ("error",)) == outcome(twin, split(data, [60, 70]))
    if twin is not PureParser:
        assert outcome(twin, [data], simple=False) == (reqs, tail)


def test_body_over_limit_is_not_buffered(twin):
    reqs, tail = outcome(twin, [b"POST / HTTP/1.1\r\nContent-Length: 100000\r\n\r\n" + b"x" * 1000])
    assert reqs[0][4] == b"" and reqs[0][6] is True and reqs[0][5] is False and tail[1] is True
    chunked = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + b"20\r\n" + b"y" * 32 + b"\r\n"
    reqs, tail = outcome(twin, [chunked * 1 + b"20\r\n" + b"y" * 32 + b"\r\n" + b"20\r\n" + b"y" * 32 + b"\r\n"])
    assert len(reqs[0][4]) == LIMITS.body + 1 and reqs[0][6] is True and tail[1] is True


def test_expect_continue_is_due_until_the_body_arrives(twin):
    p = twin(LIMITS)
    p.feed(b"POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
    assert p.continue_due is not None and not p.ready and p.partial
    p.continue_due = None
    p.feed(b"{}")
    assert p.ready[0].body == b"{}" and p.ready[0].expect_continue


def test_slow_head_is_bounded(twin):
    p = twin(LIMITS)
    with pytest.raises(HttpError):
        for _ in range(100):
            p.feed(b"GET / HTTP/1.1\r\nX: " + b"a" * 50)


# --- differential: generated requests, split anywhere ---------------------------------------------------------
_tchar = st.sampled_from(list("abcXYZ-_0189!#$%&'*+.^`|~"))
_name = st.text(_tchar, min_size=1, max_size=12).filter(
    lambda n: n.lower() not in ("content-length", "transfer-encoding", "connection", "upgrade", "expect"))
_value = st.binary(max_size=30).map(lambda b: bytes(c for c in b if c == 9 or 32 <= c < 127 or c >= 128))
_path = st.text(st.sampled_from(list("abc/%?=&-._~:@!$'()*+,;[]{}\"<>|\\^`")), max_size=40).map(lambda p: "/" + p)


@st.composite
def requests(draw):
    method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "get", "FOO"]))
    version = draw(st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/1.1", "HTTP/2.0", "HTTP/0.9"]))
    headers = draw(st.lists(st.tuples(_name, _value), max_size=10))
    lines = [f"{method} {draw(_path)} {version}".encode()]
    lines += [n.encode() + b": " + v for n, v in headers]
    conn = draw(st.sampled_from([None, "close", "keep-alive", "Keep-Alive, foo"]))
    if conn:
        lines.append(b"Connection: " + conn.encode())
    if draw(st.booleans()):
        lines.append(b"Expect: 100-continue")
    framing = draw(st.sampled_from(["none", "cl", "chunked", "both", "cl-bad", "te-bad"]))
    body = draw(st.binary(max_size=100))
    payload = b""
    if framing in ("cl", "both"):
        lines.append(b"Content-Length: %d" % len(body))
        payload = body
    if framing == "cl-bad":
        lines.append(b"Content-Length: " + draw(st.sampled_from([b"1 2", b"x", b"", b"0x1", b"+1"])))
    if framing in ("chunked", "both"):
        lines.append(b"Transfer-Encoding: chunked")
        sizes = draw(st.lists(st.integers(1, 40), max_size=4))
        pos, payload = 0, b""
        for size in sizes:
            part = body[pos:pos + size]
            pos += size
            if part:
                payload += b"%x\r\n" % len(part) + part + b"\r\n"
        payload += b"0\r\n\r\n"
    if framing == "te-bad":
        lines.append(b"Transfer-Encoding: " + draw(st.sampled_from([b"gzip", b"chunked, gzip", b"identity"])))
    head = b"\r\n".join(lines) + b"\r\n\r\n"
    if draw(st.integers(0, 9)) == 0:   # one mutation: a byte changed somewhere
        data = bytearray(head + payload)
        at = draw(st.integers(0, len(data) - 1))
        data[at] = draw(st.sampled_from([0, 10, 13, 32, 58, 127, 255]))
        return bytes(data)
    return head + payload


@pytest.mark.parametrize("data", [
    # a CR followed by something other than LF, in an unterminated line: llhttp refuses it at once (found by the
    # property below), so the pure twin must not wait for the line's end
    b"DELETE / HTTP/1.1\r\n0: \r\nConnection: close\r\nContent-Length: 0\r\n\r\x00",
    b"GET / HTTP/1.1\r\nX: a\rb",
    b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r;",
])
def test_twins_refuse_a_bare_cr_at_once(data):
    assert outcome(PureParser, [data]) == outcome(_c_parser(), [data]) == ([], ("error",))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(requests(), min_size=1, max_size=3), st.lists(st.integers(0, 10_000), max_size=6))
def test_twins_agree(reqs, cuts):
    c_parser = _c_parser()
    data = b"".join(reqs)
    whole_pure = outcome(PureParser, [data])
    assert outcome(c_parser, [data]) == whole_pure
    assert outcome(PureParser, split(data, cuts)) == whole_pure
    assert outcome(c_parser, split(data, cuts)) == whole_pure


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.lists(st.integers(0, 1000), max_size=4))
def test_arbitrary_bytes_never_crash(data, cuts):
    for cls in (PureParser, _c_parser()):
        p = cls(LIMITS)
        try:
            for chunk in split(data, cuts):
                p.feed(chunk)
        except HttpError:
            pass


# --- the httptools twin with and without the simple-head twins (qag/_speedups/httphead.py) --------------------
class _NotFed:
    """Stands in for llhttp: what the simple-head twin passed on."""

    def __init__(self):
        self.fed = b""

    def feed_data(self, data):
        self.fed += data


def test_simple_heads_do_not_reach_llhttp():
    p = _c_parser()(LIMITS)
    p._p = stand_in = _NotFed()
    p.feed(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nHEAD /b HTTP/1.1\r\n\r\nPOST /c HTTP/1.1\r\n")
    assert [(r.method, r.uri, r.headers) for r in p.ready] == [("GET", "/a", [("HOST", "x")]), ("HEAD", "/b", [])]
    assert stand_in.fed == b"POST /c HTTP/1.1\r\n"


def test_a_closing_simple_head_ends_the_connection():
    p = _c_parser()(LIMITS)
    p._p = stand_in = _NotFed()
    p.feed(b"GET /a HTTP/1.0\r\n\r\nGET /b HTTP/1.1\r\n\r\n")
    assert [r.uri for r in p.ready] == ["/a"] and p.dead and stand_in.fed == b""


@st.composite
def near_simple(draw):
    """Plain GET and HEAD heads, and ones a byte or a field away from plain."""
    name = st.sampled_from(["Host", "X-API-Key", "Accept", "Connection", "Content-Length", "Upgrade", "Expect",
                            "Transfer-Encoding", "X_Y"])
    value = st.text(st.sampled_from(list("az09 \t-_.:/?=&%~!#$()*+,;<>@[]^`{|}")), max_size=40)
    method = draw(st.sampled_from(["GET", "GET", "HEAD", "POST", "get"]))
    version = draw(st.sampled_from(["HTTP/1.1", "HTTP/1.1", "HTTP/1.0", "HTTP/1.2"]))
    fields = draw(st.lists(st.tuples(name, st.sampled_from([":", ": ", ":\t", " :"]), value), max_size=9))
    head = bytearray(f"{method} {draw(_path)} {version}\r\n".encode()
                     + b"".join(f"{n}{sep}{v}\r\n".encode() for n, sep, v in fields) + b"\r\n")
    if draw(st.integers(0, 3)) == 0:
        head[draw(st.integers(0, len(head) - 1))] = draw(st.sampled_from([0, 9, 10, 13, 32, 35, 58, 127, 200]))
    return bytes(head)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(near_simple(), requests()), min_size=1, max_size=3),
       st.lists(st.integers(0, 10_000), max_size=4))
def test_simple_head_twins_change_nothing_llhttp_would_decide(reqs, cuts):
    c_parser = _c_parser()
    data = b"".join(reqs)
    for chunks in ([data], split(data, cuts)):
        assert outcome(c_parser, chunks) == outcome(c_parser, chunks, simple=False)


@pytest.mark.parametrize("data", [
    b"\x00", b"g", b"GX", b"1", b"\r", b"G", b"DES", b"M-SEA", b"GET_PARAM", b"\r\n\r", b"GET / HTTP/1.1\r\n\r\n\x00",
    b"GET / HTTP/1.1\r\nExpect: 100-continue\r\nC:ntent-Length: 1\r\n\r\n\x00",
])
def test_twins_agree_on_an_unterminated_request_line(data):
    """A line that can't begin any method llhttp reads is refused at once by both twins; one that can waits for
    more; a lone CR before any request keeps the connection idle (found by hypothesis: the pure twin waited)."""
    assert outcome(PureParser, [data]) == outcome(_c_parser(), [data])


def test_every_short_method_prefix_is_judged_as_llhttp_judges_it():
    import itertools
    import string
    for size in (1, 2):
        for letters in itertools.product(string.ascii_uppercase + "_-", repeat=size):
            data = "".join(letters).encode()
            assert outcome(PureParser, [data]) == outcome(_c_parser(), [data]), data
