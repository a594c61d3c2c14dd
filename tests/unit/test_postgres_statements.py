"""The pieces of qag's PostgreSQL pipeline that need no server: settings, cursors, driver arguments, error mapping."""

from __future__ import annotations

import pytest

pytest.importorskip("psycopg")

from qag.backends import postgres as pg  # noqa: E402
from qag.errors import QagError  # noqa: E402
from qag.sql.prepare import prepare, render  # noqa: E402


def test_settings_are_transaction_local_and_travel_as_values():
    sql, values = pg.settings_statement(1.5, None)
    assert sql == (b"SELECT pg_catalog.set_config('statement_timeout', $1, true), "
                   b"pg_catalog.setseed($2::float8 / 4503599627370496)")
    assert values[0] == b"1500" and 0 <= int(values[1]) < 2 ** 52
    sql, values = pg.settings_statement(None, 'we"ird')
    assert sql == (b"SELECT pg_catalog.set_config('search_path', $1, true), "
                   b"pg_catalog.setseed($2::float8 / 4503599627370496)")
    assert values[0] == b'pg_catalog, "we""ird", pg_temp'
    sql, values = pg.settings_statement(0.0001, "s", (("DateStyle", b"ISO"), ("standard_conforming_strings", b"on")))
    assert values[:4] == [b"1", b'pg_catalog, "s", pg_temp', b"ISO", b"on"] and sql.count(b"set_config") == 4
    sql, values = pg.settings_statement(None, None)
    assert sql == b"SELECT pg_catalog.setseed($1::float8 / 4503599627370496)" and len(values) == 1


def test_every_call_seeds_random_anew():
    seeds = {pg.settings_statement(1.0, None)[1][-1] for _ in range(50)}
    assert len(seeds) == 50


def test_seeds_never_come_from_the_generator_request_ids_come_from():
    """Request ids (in every response) come from the random module: its state, recovered from them, must say
    nothing about a call's seed (two random() values give that seed back, and with it the caller's values)."""
    import random
    state = random.getstate()
    try:
        random.seed(7)
        expected = [random.getrandbits(52) for _ in range(20)]
        random.seed(7)
        seeds = [int(pg.settings_statement(None, None)[1][-1]) for _ in range(20)]
    finally:
        random.setstate(state)
    assert not set(seeds) & set(expected) and all(0 <= seed < 2 ** 52 for seed in seeds)
    assert max(seeds) >= 2 ** 48   # the 52 bits are all used (1 in 2**80 to fail by chance)


def test_a_schema_with_a_nul_is_refused():
    with pytest.raises(QagError) as info:
        pg.search_path("a\x00b")
    assert info.value.code == "table_check_failed"


def test_a_page_by_cursor_declares_moves_and_fetches():
    assert pg.page_statements("SELECT 1 UNION SELECT 2 -- c", 20, 11) == [
        "DECLARE qag_page NO SCROLL CURSOR FOR\nSELECT 1 UNION SELECT 2 -- c\n",
        "MOVE FORWARD 20 IN qag_page", "FETCH FORWARD 11 FROM qag_page"]
    assert pg.page_statements("VALUES (1)", 0, 6) == [
        "DECLARE qag_page NO SCROLL CURSOR FOR\nVALUES (1)\n", "FETCH FORWARD 6 FROM qag_page"]
    declare, fetch = pg.stream_statements("SELECT 1 -- trailing", 1000)
    assert declare.endswith("-- trailing\n") and fetch == "FETCH FORWARD 1000 FROM qag_stream"


def test_server_lines_are_numbered_as_the_callers_statement():
    text = 'ERROR:  syntax error at or near "x"\nLINE 2: FRM x\n            ^'
    assert pg._own_lines(text, 1) == 'syntax error at or near "x"\nLINE 1: FRM x\n            ^'
    assert pg._own_lines(text, 0) == text[len("ERROR:  "):]
    # The severity word as libpq writes it, in the server's language; a message without one is kept whole.
    assert pg._own_lines('FEHLER:  Relation »x« existiert nicht', 0) == 'Relation »x« existiert nicht'
    assert pg._own_lines("server closed the connection unexpectedly", 0) == "server closed the connection unexpectedly"
    assert pg._own_lines("Note:  x", 0) == "x" and pg._own_lines("a b:  x", 0) == "a b:  x"


def test_connect_args_pass_only_driver_fields():
    fields = {"host": "h", "port": 5433, "user": "u", "password": "p", "database": "d", "schema": "s",
              "sslmode": "require", "unknown": "x", "sslcert": ""}
    assert pg.connect_args(fields) == {"host": "h", "port": "5433", "user": "u", "password": "p", "dbname": "d",
                                       "sslmode": "require", "connect_timeout": pg.CONNECT_TIMEOUT,
                                       "client_encoding": "UTF8", "keepalives": 1, "keepalives_idle": 30,
                                       "keepalives_interval": 10, "keepalives_count": 3, "tcp_user_timeout": 60000}


def test_pool_key_covers_every_field_and_the_access_mode():
    a = {"host": "h", "user": "u", "password": "one", "database": "d"}
    assert pg.pool_key(a, True) == pg.pool_key(dict(reversed(list(a.items()))), True)
    assert pg.pool_key(a, True) != pg.pool_key(a, False)
    assert pg.pool_key(a, True) != pg.pool_key(dict(a, password="two"), True)
    assert pg.pool_key(a, True) != pg.pool_key(dict(a, schema="s"), True)
    hash(pg.pool_key(dict(a, extra=["unhashable"]), True))
    # The same settings keep their key from call to call, whatever order their fields come in.
    assert pg.pool_key(dict(a), True) == pg.pool_key(a, True) == pg.pool_key(dict(reversed(list(a.items()))), True)



@pytest.mark.parametrize("state, text, timeout, code, status", [
    ("57014", "canceling statement due to statement timeout", 2.0, "query_timeout", 504),
    ("57014", "canceling statement due to user request", None, "query_failed", 500),
    ("08006", "connection failure", None, "connection_failed", 502),
    ("57P01", "terminating connection due to administrator command", None, "connection_failed", 502),
    ("25006", "cannot execute INSERT in a read-only transaction", None, "read_only", 403),
    ("42601", "cannot insert multiple commands into a prepared statement", None, "multiple_statements", 400),
    ("22P02", 'invalid input syntax for type integer: "abc"', None, "value_invalid", 400),
    ("22012", "division by zero", None, "value_invalid", 400),
    ("42P01", 'relation "nope" does not exist', None, "query_failed", 500),
])
def test_server_refusals_map_to_the_contracts_codes(state, text, timeout, code, status):
    err = pg.mapped(pg._ServerError(state, "ERROR:  " + text), timeout)
    assert (err.code, err.status) == (code, status)


def test_a_cancel_before_the_time_limit_is_someone_elses():
    """SQLSTATE 57014 is the time limit only once the call's time is up (the server times the statement from
    after the deadline was set); sooner, another session cancelled it (pg_cancel_backend): 500 with its text."""
    cancelled = pg._ServerError("57014", "ERROR:  canceling statement due to user request")
    err = pg.mapped(cancelled, 20.0, 0, pg.monotonic() + 19.4 + pg.NETWORK_MARGIN)
    assert (err.code, err.status) == ("query_failed", 500) and "user request" in err.extras["detail"]
    timed_out = pg._ServerError("57014", "ERROR:  canceling statement due to statement timeout")
    err = pg.mapped(timed_out, 20.0, 0, pg.monotonic() + pg.NETWORK_MARGIN)
    assert (err.code, err.status, err.extras["timeout"]) == ("query_timeout", 504, 20)


def test_a_statements_error_is_shown_as_the_server_wrote_it():
    """No substitution in an open connection's errors: the server never has the password to quote, so only the
    caller's own text could hold it, and replacing it there would tell the caller which guess it is."""
    for exc in (pg.psycopg.OperationalError("consuming input failed: guess_a|s3cret-pw|guess_c"),
                pg._ServerError("08001", "no route, guess_a|s3cret-pw|guess_c")):
        err = pg.mapped(exc, None)
        assert err.code == "connection_failed" and err.status == 502
        assert err.extras["detail"].endswith("guess_a|s3cret-pw|guess_c") and "********" not in str(err.extras)
    err = pg.mapped(pg._ServerError("22P02", 'invalid input syntax for type integer: "x|s3cret-pw|y"'), None)
    assert err.extras["detail"] == 'invalid input syntax for type integer: "x|s3cret-pw|y"'


def test_a_connection_that_cant_be_opened_never_shows_the_password(monkeypatch):
    def refuse(**args):
        raise pg.psycopg.OperationalError(f'connection to server at "{args["host"]}", port {args["port"]} failed: '
                                          f'FATAL:  password authentication failed for user "{args["user"]}"')
    monkeypatch.setattr(pg.psycopg.Connection, "connect", staticmethod(refuse))
    shown = {}
    for user, password in (("alice", "alice"), ("alice", "hunter2")):
        with pytest.raises(QagError) as info:
            pg.PostgresBackend.connect({"host": "db.example", "port": 5432, "user": user, "password": password})
        err = info.value
        assert err.code == "connection_failed" and password not in str(err.extras) and "*" not in str(err.extras)
        shown[password] = err.extras["detail"]
    # A password equal to the user name reads as any other: the detail is the same.
    assert shown["alice"] == shown["hunter2"] == ('connection to server at "<host>", port <port> '
                                                  'failed: FATAL:  password authentication failed for user "<user>"')


def test_values_a_text_parameter_cannot_hold_are_param_invalid():
    for exc in (pg.psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes"),
                UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")):
        err = pg.mapped(exc, {}, None)
        assert err.code == "param_invalid" and err.status == 400


def test_a_result_value_the_driver_cant_read_is_not_blamed_on_a_parameter():
    """A loader's refusal while the rows are read (either twin's Pipe.rows) is 500 query_failed saying a value of
    the result can't be read: the statement ran and no parameter was sent (it was 400 param_invalid, 'A parameter
    value can't be sent to PostgreSQL')."""
    class Pipe:
        def __init__(self, exc):
            self.exc = exc

        def rows(self, result, tx, start, end):
            raise self.exc

    class Link:
        tx = None

    for exc in (pg.psycopg.DataError("date too small (before year 1): '4713-01-01 BC'"),
                UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"),
                NotImplementedError("can't parse interval with IntervalStyle iso_8601: 'P1Y'")):
        link = Link()
        link.pipe = Pipe(exc)
        with pytest.raises(pg._Unreadable) as raised:
            pg._read_rows(link, None, 0, 1)
        err = pg.mapped(raised.value, None)
        assert (err.code, err.status) == ("query_failed", 500)
        assert err.message.startswith("A value of the result can't be read") and "parameter" not in err.message
        assert err.extras["detail"] == str(exc)
    link = Link()
    link.pipe = Pipe(pg.psycopg.OperationalError("consuming input failed"))
    with pytest.raises(pg.psycopg.OperationalError):     # a lost connection is not a value: connection_failed
        pg._read_rows(link, None, 0, 1)


def test_numeric_style_numbers_every_slot_and_leaves_percent_alone():
    p = prepare("SELECT :a, '50%' AS p, :b, :a WHERE x LIKE '%' || :b", "postgres")
    r = render(p, {"a": 1, "b": "x"}, "numeric")
    assert r.sql == "SELECT $1, '50%' AS p, $2, $3 WHERE x LIKE '%' || $4" and r.args == (1, "x", 1, "x")
    r = render(prepare("SELECT '{t}'", "postgres"), {"t": "v"}, "numeric")
    assert r.sql == "SELECT $1" and r.args == ("v",)


@pytest.mark.parametrize("seconds,ms", [(None, None), (0, None), (0.0001, 1), (1.5, 1500), (2147483, 2147483000),
                                        (2147483.647, 2147483647), (3_000_000, 2147483647), (1e12, 2147483647),
                                        (1e308, 2147483647), (float("inf"), 2147483647)])
def test_statement_timeout_is_clamped_to_what_the_server_takes(seconds, ms):
    # statement_timeout is an int of milliseconds: 3000000 s was "Value exceeds integer range" (400 value_invalid)
    # on every call, 1e308 an OverflowError (500).
    assert pg.timeout_ms(seconds) == ms
    if ms is not None:
        sql, values = pg.settings_statement(seconds, None)
        assert values[0] == str(ms).encode()
