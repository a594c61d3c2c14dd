"""Request ids: 12 hex digits, fresh per request, and a different sequence in every forked worker."""

from __future__ import annotations

import os
import re

from qag.http.request import Request, _new_request_id


def test_generated_ids_are_twelve_hex_digits_and_do_not_repeat():
    ids = [Request({"REQUEST_METHOD": "GET"}, 1024).request_id for _ in range(10_000)]
    assert all(re.fullmatch(r"[0-9a-f]{12}", i) for i in ids)
    assert len(set(ids)) == len(ids)


def test_a_supplied_id_is_kept_and_a_malformed_one_replaced():
    assert Request({"HTTP_X_REQUEST_ID": "trace-1.a:b"}, 1024).request_id == "trace-1.a:b"
    replaced = Request({"HTTP_X_REQUEST_ID": "bad id\n"}, 1024).request_id
    assert re.fullmatch(r"[0-9a-f]{12}", replaced)


def test_a_forked_worker_does_not_repeat_its_parents_ids():
    """gunicorn forks every worker from one master: without a reseed in the child, all would share one sequence."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: its next ids, then exit without running the test session's teardown
        os.close(read)
        os.write(write, ",".join(_new_request_id() for _ in range(5)).encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 1000).decode().split(",")
    os.close(read)
    os.waitpid(pid, 0)
    mine = [_new_request_id() for _ in range(5)]
    assert len(child) == 5 and not set(child) & set(mine)
