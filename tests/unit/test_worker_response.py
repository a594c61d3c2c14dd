"""qag's worker's response writer: the head it sends for an app's status and headers, and the headers it refuses."""

from __future__ import annotations

import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qag._speedups import respond
from qag.worker import wsgi
from qag.http11 import Request
from tests.speedups.test_respond import BAD_FIELDS

TOKEN = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _request(method: str = "GET") -> Request:
    return Request(method, "/x")


def _sent(headers, body: bytes = b"ok", method: str = "GET") -> bytes:
    """What the writer puts on a real socket for one response."""
    left, right = socket.socketpair()
    try:
        resp = wsgi.Response(left, _request(method), 5.0, True)
        resp.start_response("200 OK", headers)
        resp.write_whole(body)
        left.close()
        data = b""
        while chunk := right.recv(65536):
            data += chunk
        return data
    finally:
        left.close()
        right.close()


def _head_fields(data: bytes) -> list[tuple[str, str]]:
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")[1:]
    return [tuple(line.split(": ", 1)) for line in head if not line.startswith(("Date:", "Server:"))]


def test_head_keeps_the_apps_fields_in_order_and_writes_framing_itself():
    data = _sent([("X-A", "1"), ("Content-Type", "application/json"), ("Connection", "keep-alive"),
                  ("Date", "yesterday"), ("Transfer-Encoding", "chunked"), ("X-B", " padded \t"),
                  ("Content-Length", "2")])
    assert data.startswith(b"HTTP/1.1 200 OK\r\nServer: qag\r\nDate: ")
    assert _head_fields(data) == [("X-A", "1"), ("Content-Type", "application/json"), ("X-B", "padded"),
                                  ("Content-Length", "2")]
    assert data.endswith(b"\r\n\r\nok")


def _whole(headers, body: bytes) -> tuple[wsgi.Response, bytes]:
    """A response written whole on one end of a socket pair, and what the other end received."""
    left, right = socket.socketpair()
    with left, right:
        resp = wsgi.Response(left, _request(), 5.0, True)
        resp.start_response("200 OK", headers)
        resp.write_whole(body)
        return resp, right.recv(65536)


def test_connection_close_from_the_app_closes_and_says_so():
    resp, data = _whole([("Connection", "close")], b"")
    assert resp.close and b"Connection: close\r\n" in data


@pytest.mark.parametrize("headers, message", BAD_FIELDS)
def test_bad_fields_are_refused_naming_the_first_bad_one(headers, message):
    left, right = socket.socketpair()
    with left, right:
        resp = wsgi.Response(left, _request(), 5.0, True)
        with pytest.raises(ValueError, match=message):
            resp.start_response("200 OK", headers)
        assert resp.status is None


def test_headers_from_an_iterator_are_read_once():
    data = _sent(iter([("X-A", "1"), ("X-B", "2")]))
    assert _head_fields(data)[:2] == [("X-A", "1"), ("X-B", "2")]


def _accepts(headers) -> bool:
    left, right = socket.socketpair()
    with left, right:
        try:
            wsgi.Response(left, _request(), 5.0, True).start_response("200 OK", headers)
        except ValueError:
            return False
        return True


@given(st.lists(st.tuples(st.text(alphabet=TOKEN + " \n:", min_size=0, max_size=6),
                          st.text(alphabet=st.characters(max_codepoint=0x120), max_size=6)), max_size=5))
def test_the_fast_checks_agree_with_checking_each_field_by_pattern(headers):
    each = all(respond._NAME.fullmatch(n) and respond._VALUE.fullmatch(v) for n, v in headers)
    assert _accepts(headers) == bool(each)


@pytest.mark.parametrize("status", ["20 OK", "2000 OK", "200 OK\r\nX: 1", b"200 OK", ["200 OK"], None])
def test_bad_status_lines_are_refused_every_time(status):
    for _ in range(2):   # a valid status is remembered; a bad one never is
        left, right = socket.socketpair()
        with left, right:
            with pytest.raises(ValueError, match="invalid status"):
                wsgi.Response(left, _request(), 5.0, True).start_response(status, [])


def test_a_name_seen_valid_does_not_let_a_bad_value_through():
    assert _accepts([("X-Seen", "ok")])
    assert not _accepts([("X-Seen", "bad\r\nInjected: 1")])
    assert not _accepts([("X-Seen", "ok"), ("Bad Name", "ok")])
    assert not _accepts([("X-Seen", "ok"), (["X-Seen"], "ok")])   # unhashable


def test_a_refused_field_leaves_nothing_of_the_call_behind():
    left, right = socket.socketpair()
    with left, right:
        resp = wsgi.Response(left, _request(), 5.0, True)
        with pytest.raises(ValueError, match="invalid value for header 'X-B'"):
            resp.start_response("200 OK", [("Connection", "close"), ("X-B", "a\nb")])
        assert (resp.status, resp.close) == (None, False)


def test_environ_names_request_fields_as_gunicorn_does():
    req = _request()
    req.headers = [("HOST", "h:81"), ("X-A", "1"), ("X_A", "smuggled"), ("X-A", "2"), ("CONTENT-TYPE", "t/p"),
                   ("CONTENT-LENGTH", "0"), ("CONTENT-TYPE", "t/q")]
    for _ in range(2):   # the second time every name's key is remembered
        env = wsgi.environ(req, {"SCRIPT_NAME": ""}, b"peer", "/run/qag.sock")
        assert {k: v for k, v in env.items() if k.isupper() and k not in ("RAW_URI", "PATH_INFO")} == {
            "SCRIPT_NAME": "", "REQUEST_METHOD": "GET", "QUERY_STRING": "", "SERVER_PROTOCOL": "HTTP/1.1",
            "REMOTE_ADDR": "peer", "HTTP_HOST": "h:81", "HTTP_X_A": "1,2", "CONTENT_TYPE": "t/q",
            "CONTENT_LENGTH": "0", "SERVER_NAME": "h", "SERVER_PORT": "81"}


def test_a_short_body_closes_after_the_head_it_announced():
    resp, data = _whole([("Content-Length", "5")], b"abc")
    assert resp.close and b"Content-Length: 5\r\n" in data and data.endswith(b"\r\n\r\nabc")


def test_a_whole_answer_the_socket_cant_take_is_handed_back_unsent():
    left, right = socket.socketpair()
    with left, right:
        left.setblocking(False)
        answers = [wsgi.Response(left, _request(), 5.0, True) for _ in range(2)]
        for resp in answers:
            resp.start_response("200 OK", [])
        assert answers[0].write_whole(b"ok") is None   # taken whole: nothing handed back
        body = b"x" * 8_000_000
        rest = answers[1].write_whole(body)   # more than the socket's buffers hold: the rest, never waited for
        assert rest is not None and 0 < len(rest) < len(body)
        received = bytearray()
        while rest is not None:
            received += right.recv(1 << 20)
            rest = wsgi.send_now(left, rest)
        left.close()
        while chunk := right.recv(1 << 20):
            received += chunk
        assert received.endswith(b"\r\n\r\n" + body) and received.count(b"HTTP/1.1 200 OK") == 2
