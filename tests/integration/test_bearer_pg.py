"""Row security passthrough (issue 23.4): signed-in users' claims and database role on a real PostgreSQL."""

from __future__ import annotations

import json
import time

import jwt
import psycopg2
import pytest

from qag.backends import postgres as pg
from tests.server import q
from tests.services import pg_admin

pytestmark = pytest.mark.e2e

SECRET = "r" * 40


def _owner(fields):
    conn = psycopg2.connect(host=fields["host"], port=fields["port"], user=fields["user"],
                            password=fields["password"], dbname=fields["database"], connect_timeout=5)
    conn.autocommit = True
    return conn


@pytest.fixture(scope="module")
def rls(pg_db):
    """A table whose policy shows each user their own rows, and a NOLOGIN role qag's login may act as."""
    role = f"qag_rls_{int(time.time() * 1000) % 10**9}"
    admin = pg_admin()
    admin.cursor().execute(f'CREATE ROLE "{role}" NOLOGIN')
    admin.cursor().execute(f'GRANT "{role}" TO "{pg_db["user"]}"')
    conn = _owner(pg_db)
    conn.cursor().execute(f"""
        CREATE TABLE rls_docs (id int PRIMARY KEY, owner text NOT NULL, title text NOT NULL);
        INSERT INTO rls_docs VALUES (1, 'alice', 'alice one'), (2, 'alice', 'alice two'), (3, 'bob', 'bob one');
        ALTER TABLE rls_docs ENABLE ROW LEVEL SECURITY;
        CREATE POLICY own_rows ON rls_docs FOR SELECT
            USING (owner = current_setting('request.jwt.claims', true)::json ->> 'sub');
        GRANT SELECT ON rls_docs TO "{role}";
    """)
    yield pg_db, role
    conn.cursor().execute("DROP TABLE rls_docs")
    conn.close()
    admin.cursor().execute(f'DROP ROLE IF EXISTS "{role}"')
    admin.close()


@pytest.fixture(scope="module")
def s(rls, make_module_server):
    fields, role = rls
    server = make_module_server(workers=1, env={"QAG_JWT_SECRET": SECRET, "QAG_JWT_ROLE_CLAIM": "role"})
    r = server.post("/api/v1/connections", {"name": "pgrls", "db": "postgres", **fields,
                                            "options": {"row_security": True,
                                                        "db_roles": {"reader": role, "adhoc": role}}})
    assert r.status == 201, r
    server.query("rls_all", "SELECT title FROM rls_docs ORDER BY id", "pgrls", cache_ttl=60)
    server.query("whoami", "SELECT current_user AS u, current_setting('request.jwt.claims', true) AS c", "pgrls")
    for body in ({"name": "reader", "connections": [], "queries": ["rls_all", "whoami"]},
                 {"name": "adhoc", "connections": ["pgrls"]},
                 {"name": "unmapped", "connections": [], "queries": ["rls_all"]}):
        assert server.post("/api/v1/roles", body).status == 201
    return server


def token(sub, role="reader"):
    return jwt.encode({"sub": sub, "role": role, "exp": int(time.time()) + 300}, SECRET, algorithm="HS256")


def as_user(s, sub, path, role="reader"):
    return s.get(path, key=None, headers={"Authorization": f"Bearer {token(sub, role)}"})


def test_two_subjects_see_their_own_rows_through_the_same_saved_query(s):
    # Twice each, alternating: a per-user response must never come from the response cache (cache_ttl is set).
    for _ in range(2):
        r = as_user(s, "alice", q("rls_all"))
        assert r.status == 200 and [x["title"] for x in r.json] == ["alice one", "alice two"]
        r = as_user(s, "bob", q("rls_all"))
        assert r.status == 200 and [x["title"] for x in r.json] == ["bob one"]
    r = as_user(s, "mallory", q("rls_all"))
    assert r.status == 200 and r.json == {"message": "No results returned"}   # qag's empty result


def test_claims_and_role_hold_for_the_call_only(s, rls):
    fields, role = rls
    r = as_user(s, "alice", q("whoami"))
    assert r.status == 200
    assert r.json[0]["u"] == role
    assert json.loads(r.json[0]["c"])["sub"] == "alice"
    # The admin key on the same worker's pooled connection: nothing of the signed-in call is left.
    r = s.get(q("whoami"))
    assert r.json[0]["u"] == fields["user"] and r.json[0]["c"] in (None, "")


def test_signed_in_ad_hoc_sql_and_unmapped_roles_are_refused(s):
    r = s.post("/execute_sql", {"sql": "SELECT 1", "connection_name": "pgrls"}, key=None,
               headers={"Authorization": f"Bearer {token('alice', 'adhoc')}"})
    assert r.status == 403 and r.json["code"] == "row_security_saved_only"
    r = as_user(s, "alice", q("rls_all"), role="unmapped")
    assert r.status == 403 and r.json["code"] == "row_security_unmapped"


def test_row_security_options_are_postgresql_only_and_checked(s):
    r = s.post("/api/v1/connections", {"name": "lite_rls", "db": "sqlite", "database": "lite.db",
                                       "options": {"row_security": True}})
    assert r.status == 400 and r.json["code"] == "invalid_body"
    r = s.request("PATCH", "/api/v1/connections/pgrls", body={"options": {"db_roles": {"reader": "x; DROP"}}})
    assert r.status == 400 and r.json["code"] == "invalid_body"


def test_the_identity_rides_in_the_calls_first_statement():
    # One statement, bound values: the claims and the role are never SQL text, and no extra round trip.
    sql, values = pg.settings_statement(1.0, None, (), (b'{"sub":"a\'b"}', b"app_user"))
    assert sql.count(b"SELECT") == 1
    assert b"set_config('request.jwt.claims', $2, true)" in sql and b"set_config('role', $3, true)" in sql
    assert values[1:3] == [b'{"sub":"a\'b"}', b"app_user"]
    plain, _ = pg.settings_statement(1.0, None)
    assert b"request.jwt.claims" not in plain
