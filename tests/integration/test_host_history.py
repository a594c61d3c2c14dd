"""Run history on a host of four workers: a run is readable from every worker as soon as its response is
complete, in completion order, with the per-version retention exact, on both stores; a worker killed while
holding runs does not hold up the readers."""

from __future__ import annotations

import os
import signal

import pytest

from tests.server import Server, q

pytestmark = pytest.mark.e2e

WORKERS = 4
LIMIT = 8    # QAG_HISTORY_LIMIT: runs kept per version
# A call slow enough (a few tenths of a second) that concurrent ones spread over the workers.
_SLOW = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 150000) SELECT count(*) AS c FROM n"


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def host(request):
    """A server whose writers would wait a minute between writes (so only a read's request writes a run), and
    one kept-alive connection to each of its workers."""
    env = {"QAG_ACCESS_LOG": "on", "QAG_HISTORY_FLUSH_INTERVAL": "60", "QAG_HISTORY_LIMIT": str(LIMIT)}
    drop = None
    if request.param == "postgresql":
        from tests.services import pg_schema_url
        env["QAG_DATABASE_URL"], drop = pg_schema_url(request.getfixturevalue("pg_store_db"))
    s = Server(workers=WORKERS, threads=4, env=env)
    conns = {}
    try:
        s.sqlite_db("lite.db", "CREATE TABLE t (id INTEGER PRIMARY KEY); INSERT INTO t VALUES (1), (2);")
        s.connection("lite", "lite.db")
        s.query("slow", _SLOW, "lite")
        conns = s.connections_per_worker(WORKERS, q("slow"))
        yield s, conns
    finally:
        for conn in conns.values():
            conn.close()
        s.close()
        if drop is not None:
            drop()


def _ids(reply) -> list[str]:
    assert reply.status == 200, reply
    return [item["request_id"] for item in reply.json["items"]]


def test_a_run_is_in_every_workers_history_once_its_response_is_complete(host, uniq):
    s, conns = host
    name = uniq("ryw")
    s.query(name, "SELECT id FROM t WHERE id = 1", "lite")
    workers = list(conns.values())
    for i in range(3 * WORKERS):
        served = workers[i % WORKERS].get(q(name), headers={"X-Request-Id": f"{name}-{i}"})
        assert served.status == 200, served
        # Read on the next worker: the run just served by another one is there, and every run before it,
        # newest first in the order they completed, the newest LIMIT of them.
        expected = [f"{name}-{j}" for j in range(i, max(-1, i - LIMIT), -1)]
        assert _ids(workers[(i + 1) % WORKERS].get(f"/api/v1/queries/{name}/history?limit=100")) == expected
        assert _ids(workers[(i + 2) % WORKERS].get(f"/api/v1/history?query={name}&limit=100")) == expected
    detail = workers[0].get(f"/api/v1/queries/{name}")
    assert detail.status == 200 and detail.json["versions"][0]["run_count"] == LIMIT, detail
    assert detail.json["last_used_at"] is not None
    assert s.workers_of([served]) <= set(conns)


def test_paging_walks_the_completion_order_across_workers(host, uniq):
    s, conns = host
    name = uniq("page")
    s.query(name, "SELECT id FROM t WHERE id = 2", "lite")
    workers = list(conns.values())
    for i in range(LIMIT):
        assert workers[i % WORKERS].get(q(name), headers={"X-Request-Id": f"{name}-{i}"}).status == 200
    seen, cursor = [], None
    for page in range(LIMIT):
        path = f"/api/v1/queries/{name}/history?limit=3" + (f"&cursor={cursor}" if cursor else "")
        reply = workers[page % WORKERS].get(path)
        seen += _ids(reply)
        cursor = reply.json["next_cursor"]
        if cursor is None:
            break
    assert seen == [f"{name}-{j}" for j in range(LIMIT - 1, -1, -1)]


def test_a_killed_workers_slot_does_not_hold_up_readers(host, uniq):
    """SIGKILL a worker whose writer holds runs: its queued runs are lost with it (as its memory is), but the
    next read on another worker answers at once with everything the others served, and the master's new
    worker takes part from then on."""
    s, conns = host
    name = uniq("kill")
    s.query(name, "SELECT id FROM t", "lite")
    (victim, doomed), *others = conns.items()
    assert doomed.get(q(name), headers={"X-Request-Id": f"{name}-lost"}).status == 200
    os.kill(victim, signal.SIGKILL)
    doomed.close()
    del conns[victim]
    keep = others[0][1]
    assert keep.get(q(name), headers={"X-Request-Id": f"{name}-kept"}).status == 200
    ids = _ids(others[1][1].get(f"/api/v1/queries/{name}/history?limit=100"))
    assert ids[0] == f"{name}-kept" and set(ids) <= {f"{name}-kept", f"{name}-lost"}
    # The replacement worker (forked by the master) serves and is read like the others.
    new = s.connections_per_worker(WORKERS, q("slow"))
    try:
        fresh = next(conn for pid, conn in new.items() if pid not in conns)
        assert fresh.get(q(name), headers={"X-Request-Id": f"{name}-new"}).status == 200
        assert _ids(keep.get(f"/api/v1/queries/{name}/history?limit=100"))[0] == f"{name}-new"
    finally:
        for pid, conn in new.items():
            if pid in conns:
                conn.close()
            else:
                conns[pid] = conn
