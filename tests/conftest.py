"""Shared fixtures: real qag servers (gunicorn, two workers) on ephemeral ports with seeded SQLite data."""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path

import pytest

from tests.server import Server
from tests.services import REDIS_URL

SEED = """
CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, action TEXT);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 25)
INSERT INTO t (id, name, action) SELECT i, 'row ' || i, CASE WHEN i % 2 THEN 'delete' ELSE 'keep' END FROM n;
CREATE TABLE secret (id INTEGER PRIMARY KEY, email TEXT);
INSERT INTO secret VALUES (1, 'jane@example.com');
CREATE TABLE types (i INTEGER, f REAL, s TEXT, b BLOB, n TEXT);
INSERT INTO types VALUES (42, 2.5, 'héllo "q", ok', x'616263', NULL);
CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT);
"""

_counter = itertools.count(1)


# `make wheel` sets QAG_TEST_INSTALLED=1 and runs a copy of tests/ with a wheel installed in a virtual
# environment: the run is only worth anything if that installed package, not a source tree, is imported.
INSTALLED = os.environ.get("QAG_TEST_INSTALLED") == "1"


def pytest_configure(config):
    config.addinivalue_line("markers", "e2e: talks HTTP to a real gunicorn-served qag")
    # QAG_SPEEDUPS is read once, when qag is imported (qag/_speedups): the run and every server it starts (they
    # inherit the environment) run compiled or pure by it. Under require, a build that can't run fails the run
    # now, in one line, rather than test by test.
    from qag import _speedups
    if _speedups.mode() == "require":
        try:
            _speedups.check()
        except _speedups.SpeedupsError as exc:
            raise pytest.UsageError(str(exc)) from None
    if INSTALLED:
        import qag
        where = Path(qag.__file__).resolve()
        prefix = Path(sys.prefix).resolve()
        if sys.prefix == sys.base_prefix or prefix not in where.parents:
            raise pytest.UsageError(f"QAG_TEST_INSTALLED=1 but qag was imported from {where}, not from the "
                                    f"virtual environment {prefix}: the tests would not test the installed wheel")


_UNIT_TIER = tuple(Path(__file__).parent / tier for tier in ("unit", "speedups"))


def pytest_collection_modifyitems(config, items):
    """A run of the unit tier alone (make test's first step) makes every warning an error: fix it, or ignore it on
    the test, saying why. Not in a run with the integration tier, whose servers and drivers warn in ways not all
    checked, and whose leftovers (a pipe, a socket) would be reported in whichever unit test is running then."""
    def unit(item) -> bool:
        return item.path.is_relative_to(_UNIT_TIER[0]) or item.path.is_relative_to(_UNIT_TIER[1])
    if all(unit(item) for item in items):
        for item in items:
            item.add_marker(pytest.mark.filterwarnings("error"), append=False)


@pytest.fixture
def uniq():
    """Unique names, so tests sharing a session server never collide."""
    return lambda prefix="x": f"{prefix}{os.getpid()}_{next(_counter)}"


def pytest_sessionfinish(session):
    """The shared Redis keeps no counters of this run: the quota and rate-limit keys named after uniq() names
    (they would otherwise stay until they expire, a day to 40 days later), the index of the max_concurrent
    sets this process held leases in (a server's workers' are swept by its master), and the tombstones of the
    quota reservations it gave back without knowing their outcome (they stay until the period ends)."""
    try:
        import redis
        from qag.policy.redislimits import holder_host, holder_index, reserved_index
        client = redis.Redis.from_url(REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
        keys = list(client.scan_iter(f"qag:*{os.getpid()}_*", count=1000))
        keys += client.scan_iter(reserved_index(holder_host(), os.getpid()) + ":gone:*", count=1000)
        keys.append(holder_index(holder_host(), os.getpid()))
        client.delete(*keys)
    except Exception:  # no Redis here, or no client: nothing was written there
        pass


def _seeded(server: Server) -> Server:
    server.sqlite_db("lite.db", SEED)
    server.connection("lite", "lite.db")
    return server


@pytest.fixture(scope="session")
def server():
    s = _seeded(Server())
    yield s
    s.close()


@pytest.fixture(scope="session")
def writes_server():
    s = _seeded(Server(env={"QAG_ALLOW_WRITES": "1"}))
    yield s
    s.close()


@pytest.fixture
def make_server():
    """Start servers with particular settings; each is stopped at the end of the test."""
    started: list[Server] = []

    def start(seed: bool = True, **kw) -> Server:
        s = Server(**kw)
        started.append(s)
        return _seeded(s) if seed else s

    yield start
    for s in started:
        s.close()


@pytest.fixture(scope="module")
def make_module_server():
    """make_server's servers, kept for the whole test module (seeded like `server`)."""
    started: list[Server] = []

    def start(**kw) -> Server:
        s = _seeded(Server(**kw))
        started.append(s)
        return s

    yield start
    for s in started:
        s.close()


@pytest.fixture(scope="session")
def mysql_db():
    """Fields of a fresh MySQL/MariaDB database and its owning user (dropped at the end of the session)."""
    from tests.services import make_mysql_database
    fields, cleanup = make_mysql_database()
    yield fields
    cleanup()


@pytest.fixture(scope="session")
def pg_db():
    """Fields of a fresh PostgreSQL database and its owning role (dropped at the end of the session)."""
    from tests.services import make_pg_database
    fields, cleanup = make_pg_database()
    yield fields
    cleanup()


@pytest.fixture(scope="session")
def pg_store_db():
    """A PostgreSQL database for qag stores (each test takes a schema of its own); dropped at the end."""
    from tests.services import make_pg_database
    fields, cleanup = make_pg_database()
    yield fields
    cleanup()


@pytest.fixture
def pg_store_url(pg_store_db):
    """A fresh, empty PostgreSQL store: a new schema in the session's store database, named by the URL."""
    from tests.services import pg_schema_url
    url, cleanup = pg_schema_url(pg_store_db)
    yield url
    cleanup()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_env(request):
    """Settings that select each store in turn: {} (SQLite in QAG_HOME) or QAG_DATABASE_URL (PostgreSQL)."""
    if request.param == "sqlite":
        return {}
    return {"QAG_DATABASE_URL": request.getfixturevalue("pg_store_url")}
