"""The table-corpus databases: customer, orders, secret (+ billing.customer) per dialect, and their fingerprints.

Each builder returns a Target: the fields of a qag connection, the names the case SQL's `{crm}`, `{billing}` and
`{db}` stand for, a snapshot() of everything a case could change (tables, rows, schemas, routines, sequences)
and a cleanup(). The corpus runner compares snapshots before and after every case of a dialect has run.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import sqlite3
from dataclasses import dataclass, field
from typing import Callable

from tests.services import MYSQL, make_mysql_database, make_pg_database, mysql_admin

CUSTOMERS = [(1, "Ada", "London"), (2, "Grace", "Arlington"), (3, "Edsger", "Nuenen")]
ORDERS = [(10, 1, "9.50"), (11, 2, "20.00"), (12, 1, "1.25"), (13, 3, "7.00")]
SECRETS = [(1, 1, "ada-ssn-0001"), (2, 2, "grace-ssn-0002")]
BILLING = [(1, "Ada (billing)", "London"), (2, "Grace (billing)", "Arlington")]

# Files a case may try to make the server write (VACUUM INTO, INTO OUTFILE): must never appear.
EVIL_FILES = ("corpus-vacuum.db", "corpus-out.txt")


@dataclass
class Target:
    """One dialect's database as the corpus sees it."""

    db: str                                  # qag connection `db`
    fields: dict                             # qag connection fields
    names: dict[str, str]                    # `{crm}` → default schema, `{billing}` → second schema, `{db}`
    snapshot: Callable[[], dict]
    cleanup: Callable[[], None]
    home_files: Callable[[], list[str]] = field(default=lambda: [])


def _digest(rows) -> str:
    return hashlib.sha256(repr([tuple(str(v) for v in r) for r in rows]).encode()).hexdigest()


# --------------------------------------------------------------------------------------------------- MySQL
def mysql_target() -> Target:
    """A fresh database (`{crm}`, the connection's default) and a second one (`{billing}`) the user may use."""
    fields, drop_main = make_mysql_database()
    crm = fields["database"]
    billing = f"qag_billing_{os.getpid()}_{secrets.token_hex(3)}"
    admin = mysql_admin()
    cur = admin.cursor()
    cur.execute(f"USE `{crm}`")
    cur.execute("CREATE TABLE customer (id INT PRIMARY KEY, name VARCHAR(50), city VARCHAR(50)) ENGINE=InnoDB")
    cur.execute("CREATE TABLE orders (id INT PRIMARY KEY, customer_id INT, total DECIMAL(10, 2)) ENGINE=InnoDB")
    cur.execute("CREATE TABLE secret (id INT PRIMARY KEY, customer_id INT, note VARCHAR(100)) ENGINE=InnoDB")
    cur.executemany("INSERT INTO customer VALUES (%s, %s, %s)", CUSTOMERS)
    cur.executemany("INSERT INTO orders VALUES (%s, %s, %s)", ORDERS)
    cur.executemany("INSERT INTO secret VALUES (%s, %s, %s)", SECRETS)
    # A stored function and procedure that read `secret` from inside: the reason routines need a grant.
    cur.execute("CREATE FUNCTION peek() RETURNS INT READS SQL DATA RETURN (SELECT COUNT(*) FROM secret)")
    cur.execute("CREATE FUNCTION shout(s VARCHAR(50)) RETURNS VARCHAR(60) DETERMINISTIC RETURN UPPER(s)")
    cur.execute("CREATE PROCEDURE show_secret() SELECT * FROM secret")
    cur.execute(f"CREATE DATABASE `{billing}`")
    cur.execute(f"CREATE TABLE `{billing}`.customer (id INT PRIMARY KEY, name VARCHAR(50), city VARCHAR(50))")
    cur.executemany(f"INSERT INTO `{billing}`.customer VALUES (%s, %s, %s)", BILLING)
    cur.execute(f"GRANT ALL ON `{billing}`.* TO '{fields['user']}'@'%'")
    schemas = (crm, billing)

    def snapshot() -> dict:
        c = admin.cursor()
        out: dict = {}
        c.execute("SELECT table_schema, table_name, table_type FROM information_schema.tables "
                  "WHERE table_schema IN (%s, %s) ORDER BY 1, 2", schemas)
        tables = c.fetchall()
        out["tables"] = tables
        for schema, table, _ in tables:
            c.execute(f"SELECT * FROM `{schema}`.`{table}` ORDER BY 1")
            rows = c.fetchall()
            out[f"{schema}.{table}"] = (len(rows), _digest(rows))
        c.execute("SELECT routine_schema, routine_name, routine_type FROM information_schema.routines "
                  "WHERE routine_schema IN (%s, %s) ORDER BY 1, 2", schemas)
        out["routines"] = c.fetchall()
        # Databases a case might create are named after {crm}; nothing else of the server is ours to compare.
        c.execute("SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE %s OR schema_name "
                  "LIKE %s ORDER BY 1", (crm.replace("_", "\\_") + "%", billing.replace("_", "\\_") + "%"))
        out["schemata"] = c.fetchall()
        return out

    def cleanup() -> None:
        c = admin.cursor()
        c.execute("SET SESSION lock_wait_timeout = 60")
        c.execute(f"DROP DATABASE IF EXISTS `{billing}`")
        admin.close()
        drop_main()

    return Target("mysql", dict(fields), {"{crm}": crm, "{billing}": billing, "{db}": crm}, snapshot, cleanup)


# ---------------------------------------------------------------------------------------------- PostgreSQL
PG_SETUP = """
CREATE TABLE customer (id integer PRIMARY KEY, name text, city text);
CREATE TABLE orders (id integer PRIMARY KEY, customer_id integer, total numeric(10, 2));
CREATE TABLE secret (id integer PRIMARY KEY, customer_id integer, note text);
CREATE SCHEMA billing;
CREATE TABLE billing.customer (id integer PRIMARY KEY, name text, city text);
CREATE SEQUENCE ids;
-- Routines that read `secret` from inside: the reason user-defined functions need a grant.
CREATE FUNCTION peek() RETURNS bigint LANGUAGE sql STABLE AS 'SELECT count(*) FROM secret';
CREATE FUNCTION peek_rows() RETURNS SETOF secret LANGUAGE sql STABLE AS 'SELECT * FROM secret';
CREATE FUNCTION shout(s text) RETURNS text LANGUAGE sql IMMUTABLE AS 'SELECT upper(s)';
CREATE PROCEDURE wipe_secret() LANGUAGE sql AS 'DELETE FROM secret';
"""


def pg_target() -> Target:
    """A fresh database: public (the default) with the three tables, schema billing, a sequence, routines."""
    import psycopg2
    fields, drop = make_pg_database()
    conn = psycopg2.connect(host=fields["host"], port=fields["port"], user=fields["user"],
                            password=fields["password"], dbname=fields["database"], connect_timeout=5)
    conn.autocommit = True
    cur = conn.cursor()
    cur.execute(PG_SETUP)
    cur.executemany("INSERT INTO customer VALUES (%s, %s, %s)", CUSTOMERS)
    cur.executemany("INSERT INTO orders VALUES (%s, %s, %s)", ORDERS)
    cur.executemany("INSERT INTO secret VALUES (%s, %s, %s)", SECRETS)
    cur.executemany("INSERT INTO billing.customer VALUES (%s, %s, %s)", BILLING)

    def snapshot() -> dict:
        c = conn.cursor()
        out: dict = {}
        c.execute("SELECT nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_%' "
                  "AND nspname <> 'information_schema' ORDER BY 1")
        out["schemas"] = c.fetchall()
        c.execute("SELECT n.nspname, c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = "
                  "c.relnamespace WHERE n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema' "
                  "ORDER BY 1, 2")
        relations = c.fetchall()
        out["relations"] = relations
        for schema, name, kind in relations:
            if kind in ("r", "m", "p"):
                c.execute(f'SELECT * FROM "{schema}"."{name}" ORDER BY 1')
                rows = c.fetchall()
                out[f"{schema}.{name}"] = (len(rows), _digest(rows))
            elif kind == "S":
                c.execute(f'SELECT last_value, is_called FROM "{schema}"."{name}"')
                out[f"{schema}.{name}"] = c.fetchall()
        c.execute("SELECT n.nspname, p.proname, p.prokind FROM pg_proc p JOIN pg_namespace n ON n.oid = "
                  "p.pronamespace WHERE n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema' "
                  "ORDER BY 1, 2")
        out["routines"] = c.fetchall()
        return out

    def cleanup() -> None:
        conn.close()
        drop()

    return Target("postgres", dict(fields), {"{crm}": "public", "{billing}": "billing", "{db}": fields["database"]},
                  snapshot, cleanup)


# -------------------------------------------------------------------------------------------------- SQLite
def sqlite_target(home: str, filename: str = "corpus.db") -> Target:
    """A file in the server's home (SQLite can't ATTACH through qag): main holds the three tables."""
    path = os.path.join(home, filename)
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE customer (id INTEGER PRIMARY KEY, name TEXT, city TEXT);
        CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER, total REAL);
        CREATE TABLE secret (id INTEGER PRIMARY KEY, customer_id INTEGER, note TEXT);
    """)
    conn.executemany("INSERT INTO customer VALUES (?, ?, ?)", CUSTOMERS)
    conn.executemany("INSERT INTO orders VALUES (?, ?, ?)", [(a, b, float(c)) for a, b, c in ORDERS])
    conn.executemany("INSERT INTO secret VALUES (?, ?, ?)", SECRETS)
    conn.commit()
    conn.close()

    def snapshot() -> dict:
        c = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            out: dict = {"schema": c.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY 2").fetchall()}
            for (name,) in c.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY 1").fetchall():
                rows = c.execute(f'SELECT * FROM "{name}" ORDER BY 1').fetchall()
                out[name] = (len(rows), _digest(rows))
            out["user_version"] = c.execute("PRAGMA user_version").fetchall()
            out["journal_mode"] = c.execute("PRAGMA journal_mode").fetchall()
            return out
        finally:
            c.close()

    def home_files() -> list[str]:
        return sorted(f for f in os.listdir(home) if f.startswith("corpus") and f != filename
                      and not f.startswith(filename + "-"))

    return Target("sqlite", {"database": filename}, {"{crm}": "main", "{billing}": "billing", "{db}": "main"},
                  snapshot, lambda: None, home_files)


BUILDERS = {"mysql": mysql_target, "postgres": pg_target}
__all__ = ["Target", "BUILDERS", "sqlite_target", "EVIL_FILES", "MYSQL"]
