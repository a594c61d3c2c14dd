"""Real MariaDB/MySQL and PostgreSQL for tests: a fresh database and user each, dropped afterwards.

A server that can't be reached skips the tests that need it, naming the setting; with
QAG_TEST_REQUIRE_SERVICES=1 (CI) it fails them instead.
"""

from __future__ import annotations

import os
import secrets
import time

import pytest

MYSQL = {"host": os.environ.get("QAG_TEST_MYSQL_HOST", "127.0.0.1"),
         "port": int(os.environ.get("QAG_TEST_MYSQL_PORT", "3306")),
         "user": os.environ.get("QAG_TEST_MYSQL_USER", "root"),
         "password": os.environ.get("QAG_TEST_MYSQL_PASSWORD", "")}
POSTGRES = {"host": os.environ.get("QAG_TEST_PG_HOST", "127.0.0.1"),
            "port": int(os.environ.get("QAG_TEST_PG_PORT", "5432")),
            "user": os.environ.get("QAG_TEST_PG_USER", "postgres"),
            "password": os.environ.get("QAG_TEST_PG_PASSWORD", "")}


def unreachable(what: str, setting: str, exc: Exception):
    message = f"{what} is not reachable ({exc}); set {setting} or start it"
    if os.environ.get("QAG_TEST_REQUIRE_SERVICES") == "1":
        pytest.fail(message)
    pytest.skip(message)


def mysql_admin():
    """A root connection to the MySQL/MariaDB server, autocommit."""
    try:
        import MySQLdb
        conn = MySQLdb.connect(host=MYSQL["host"], port=MYSQL["port"], user=MYSQL["user"], passwd=MYSQL["password"],
                               connect_timeout=5)
    except Exception as exc:  # ImportError or any driver error: the service isn't usable here
        unreachable("MySQL/MariaDB", "QAG_TEST_MYSQL_HOST/PORT/USER/PASSWORD", exc)
    conn.autocommit(True)
    return conn


def pg_admin(database: str = "postgres"):
    """A superuser connection to the PostgreSQL server, autocommit."""
    try:
        import psycopg2
        conn = psycopg2.connect(host=POSTGRES["host"], port=POSTGRES["port"], user=POSTGRES["user"],
                                password=POSTGRES["password"] or None, dbname=database, connect_timeout=5)
    except Exception as exc:
        unreachable("PostgreSQL", "QAG_TEST_PG_HOST/PORT/USER/PASSWORD", exc)
    conn.autocommit = True
    return conn


def _name(prefix: str) -> str:
    return f"{prefix}_{os.getpid()}_{secrets.token_hex(3)}"


def make_mysql_database():
    """(fields for a qag connection, cleanup): a database and a user that owns it, with a password."""
    admin = mysql_admin()
    database, user, password = _name("qag_t"), _name("qag_u"), secrets.token_urlsafe(12)
    cur = admin.cursor()
    cur.execute(f"CREATE DATABASE `{database}`")
    cur.execute(f"CREATE USER '{user}'@'%%' IDENTIFIED BY %s", (password,))
    cur.execute(f"GRANT ALL ON `{database}`.* TO '{user}'@'%'")
    fields = {"host": MYSQL["host"], "port": MYSQL["port"], "user": user, "password": password, "database": database}

    def cleanup():
        c = admin.cursor()
        c.execute(f"DROP DATABASE IF EXISTS `{database}`")
        c.execute(f"DROP USER IF EXISTS '{user}'@'%'")
        admin.close()

    return fields, cleanup


def make_pg_database():
    """(fields for a qag connection, cleanup): a database owned by a new login role with a password."""
    admin = pg_admin()
    database, user, password = _name("qag_t"), _name("qag_u"), secrets.token_urlsafe(12)
    cur = admin.cursor()
    cur.execute(f'CREATE ROLE "{user}" LOGIN PASSWORD %s', (password,))
    cur.execute(f'CREATE DATABASE "{database}" OWNER "{user}"')
    fields = {"host": POSTGRES["host"], "port": POSTGRES["port"], "user": user, "password": password,
              "database": database}

    def cleanup():
        c = admin.cursor()
        c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (database,))
        c.execute(f'DROP DATABASE IF EXISTS "{database}"')
        c.execute(f'DROP ROLE IF EXISTS "{user}"')
        admin.close()

    return fields, cleanup


REDIS_URL = os.environ.get("QAG_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def redis_url() -> str:
    """The test Redis's URL, once it answers PING. Tests share it: they use key names of their own and never
    flush it."""
    try:
        import redis
        redis.Redis.from_url(REDIS_URL, socket_timeout=2, socket_connect_timeout=2).ping()
    except Exception as exc:  # ImportError or any client error: the service isn't usable here
        unreachable("Redis", "QAG_TEST_REDIS_URL", exc)
    return REDIS_URL


def dead_redis_url() -> str:
    """A Redis URL where nothing listens (a port that was free a moment ago): connections are refused at once."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"


def pg_url(fields: dict, schema: str | None = None) -> str:
    """A postgresql:// URL for the fields of make_pg_database(), optionally with a search_path schema."""
    from urllib.parse import quote
    url = (f"postgresql://{quote(fields['user'])}:{quote(fields['password'], safe='')}@{fields['host']}:"
           f"{fields['port']}/{quote(fields['database'])}")
    return url + (f"?options=-csearch_path%3D{schema}" if schema else "")


def pg_schema_url(fields: dict):
    """(URL, cleanup): a new schema owned by the database's role, in the database of make_pg_database()."""
    schema = _name("qag_s")
    admin = pg_admin(fields["database"])
    admin.cursor().execute(f'CREATE SCHEMA "{schema}" AUTHORIZATION "{fields["user"]}"')

    def cleanup():
        import psycopg2
        # A server of the test may still be writing to the schema (fixtures are torn down before make_server's
        # servers when the test names them first): the DROP can then deadlock with its writer. Once more, then.
        for attempt in range(20):
            try:
                admin.cursor().execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
                break
            except psycopg2.errors.DeadlockDetected:
                if attempt == 19:
                    raise
                time.sleep(0.25)
        admin.close()

    return pg_url(fields, schema), cleanup


_STORE_DB: list = []


def pg_store_fields() -> dict:
    """One PostgreSQL database for the stores of this test process (QAG_TEST_STORE=postgresql), dropped at exit."""
    if not _STORE_DB:
        import atexit
        fields, cleanup = make_pg_database()
        atexit.register(cleanup)
        _STORE_DB.append(fields)
    return _STORE_DB[0]
