"""A small WSGI app for the worker-class tests: sleeps, streams, large bodies, echoes, uses write() and exc_info."""

from __future__ import annotations

import json
import os
import sys
import time
from urllib.parse import parse_qs

LOG = os.environ.get("WORKER_APP_LOG")


def _note(text: str) -> None:
    if LOG:
        with open(LOG, "a") as f:
            f.write(text + "\n")


class _Stream:
    def __init__(self, n: int, pause: float):
        self.n, self.pause, self.sent = n, pause, 0

    def __iter__(self):
        for i in range(self.n):
            self.sent += 1
            yield b"chunk %d\n" % i
            time.sleep(self.pause)

    def close(self):
        _note(f"closed sent={self.sent}")


def big_body(tag: str, n: int) -> bytes:
    unit = (tag + "|").encode()
    return (unit * (n // len(unit) + 1))[:n]


def app(environ, start_response):
    path = environ["PATH_INFO"]
    args = {k: v[0] for k, v in parse_qs(environ["QUERY_STRING"]).items()}
    if path == "/sleep":
        time.sleep(float(args.get("s", "1")))
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"slept"]
    if path == "/pid":
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [str(os.getpid()).encode()]
    if path == "/big":   # a whole body of n bytes, the tag repeated: a reader can check every byte
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [big_body(args.get("tag", "x"), int(args.get("n", "1000000")))]
    if path == "/stream":
        start_response("200 OK", [("Content-Type", "text/plain")])
        return _Stream(int(args.get("n", "5")), float(args.get("pause", "0.05")))
    if path == "/write":
        write = start_response("200 OK", [("Content-Type", "text/plain")])
        write(b"one ")
        write(b"two ")
        return [b"three"]
    if path == "/refused-mid-stream":   # the app's own refusal once the body began (a database failing mid-stream)
        def body():
            yield b"first\n"
            from qag.errors import QagError
            raise QagError("connection_failed", "lost the database")
        start_response("200 OK", [("Content-Type", "text/plain")])
        return body()
    if path == "/raise":   # fails before its status line: the worker answers for it
        raise RuntimeError("internal text a client must not see")
    if path == "/exc":
        try:
            raise ValueError("boom")
        except ValueError:
            start_response("500 Internal Server Error", [("Content-Type", "text/plain")], sys.exc_info())
        return [b"handled"]
    body = environ["wsgi.input"].read()
    keys = ("REQUEST_METHOD", "PATH_INFO", "QUERY_STRING", "RAW_URI", "SERVER_NAME", "SERVER_PORT", "REMOTE_ADDR",
            "SERVER_PROTOCOL", "CONTENT_TYPE", "CONTENT_LENGTH", "HTTP_X_A", "HTTP_HOST", "SCRIPT_NAME",
            "wsgi.url_scheme")
    out = {k: environ.get(k) for k in keys}
    out["body"] = body.decode("latin-1")
    out["errors"] = hasattr(environ["wsgi.errors"], "write")
    data = json.dumps(out).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return [data]


def _selector_worker():
    from qag.worker import QagWorker
    from qag.worker.poller import SelectorPoller

    class SelectorWorker(QagWorker):
        """qag's worker on its selectors fallback (platforms without epoll)."""
        make_poller = SelectorPoller
    return SelectorWorker


SelectorWorker = _selector_worker()
