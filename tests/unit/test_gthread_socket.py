"""qag/worker/gthread.py's client socket: a request's time in all, what already arrived still read after it, a
wait the caller set itself never stretched, non-blocking looks left as they are."""

from __future__ import annotations

import socket
import threading
import time

import pytest

pytest.importorskip("gunicorn")

from gunicorn.http.errors import NoMoreData  # noqa: E402

from qag.worker.gthread import _ClientSocket  # noqa: E402


@pytest.fixture
def pair(monkeypatch):
    monkeypatch.setattr(_ClientSocket, "timeout_seconds", 0.3)
    ours, theirs = socket.socketpair()
    client = _ClientSocket(ours.family, ours.type, ours.proto, fileno=ours.detach())
    yield client, theirs
    client.close()
    theirs.close()


def test_what_arrived_in_time_is_read_after_the_time_is_up(pair):
    client, peer = pair
    client.setblocking(True)              # gthread: a request is to be read; its time starts
    peer.sendall(b"a whole body, sent at once")
    time.sleep(0.4)                       # the app was slow to read it
    assert client.recv(100) == b"a whole body, sent at once"
    with pytest.raises(NoMoreData):       # but nothing more is waited for
        client.recv(100)
    peer.sendall(b"late")
    assert client.recv(100) == b"late"    # what is there is still read
    client.setblocking(True)              # the next request has its own time
    peer.sendall(b"next")
    assert client.recv(100) == b"next"


def test_a_trickle_is_cut_at_the_requests_time_in_all(pair):
    client, peer = pair
    stop = threading.Event()

    def trickle() -> None:
        while not stop.wait(0.05):
            peer.sendall(b"x")
    sender = threading.Thread(target=trickle, daemon=True)
    client.setblocking(True)
    started = time.monotonic()
    sender.start()
    got = b""
    try:
        with pytest.raises(NoMoreData):
            while time.monotonic() - started < 5:
                got += client.recv(100)   # each byte in time, but the request's time in all runs out
    finally:
        stop.set()
        sender.join()
    assert 0.25 <= time.monotonic() - started < 2.0 and got


def test_a_wait_the_caller_set_is_never_stretched(pair):
    client, peer = pair
    client.setblocking(True)
    client.settimeout(0.05)               # as gunicorn's lingering close sets its own
    started = time.monotonic()
    with pytest.raises(NoMoreData):
        client.recv(100)
    assert time.monotonic() - started < 0.25


def test_a_non_blocking_look_stays_one(pair):
    client, _ = pair
    client.setblocking(False)
    with pytest.raises(BlockingIOError):
        client.recv(1, socket.MSG_PEEK)
