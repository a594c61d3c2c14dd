"""The libpq pipeline twins (qag._speedups pgpipe) on real PostgreSQL connections: same results, same errors.

Each scenario runs once through the pure twin and once through the compiled one, on two connections of the same
server, and what they return (results by status, rows, SQLSTATE) or raise is compared."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

psycopg = pytest.importorskip("psycopg")

from qag import _speedups  # noqa: E402
from tests.speedups.conftest import (call_outcome, other_thread_steps, required, speedups,  # noqa: E402, F401
                                     twin_pair)  # (fixtures)

_FATAL = psycopg.pq.ExecStatus.FATAL_ERROR
_SQLSTATE = psycopg.pq.DiagnosticField.SQLSTATE


def _open(fields: dict):
    """A psycopg connection as qag's backend makes them: autocommit, its PGconn in pipeline mode."""
    conn = psycopg.Connection.connect(host=fields["host"], port=fields["port"], user=fields["user"],
                                      password=fields["password"], dbname=fields["database"], autocommit=True)
    conn.pgconn.enter_pipeline_mode()
    return conn


@pytest.fixture
def connect(pg_db):
    made = []

    def make():
        conn = _open(pg_db)
        made.append(conn)
        return conn

    yield make
    for conn in made:
        conn.close()


@pytest.fixture
def pipes(twin_pair, connect):
    """(pure Pipe, compiled Pipe), each on a connection of its own, and those connections."""
    pure, compiled = twin_pair("pgpipe")
    a, b = connect(), connect()
    return (pure.Pipe(a.pgconn), compiled.Pipe(b.pgconn)), (a, b)


def summary(results: list) -> list:
    """What a segment's results say: status, rows as text, and a failure's SQLSTATE and message."""
    out = []
    for r in results:
        if r.status == _FATAL:
            out.append(("error", r.error_field(_SQLSTATE), (r.error_message or b"").split(b"\n")[0]))
        else:
            out.append((r.status, [[r.get_value(i, j) for j in range(r.nfields)] for i in range(r.ntuples)]))
    return out


def run_steps(pipe, steps: list, deadline: float | None = None) -> int:
    """Queue `steps` (("send", sql, values, types, formats) or ("sync",)) and flush; how many Syncs."""
    for step in steps:
        if step[0] == "sync":
            pipe.sync()
        else:
            pipe.send(*step[1:])
    pipe.flush(deadline)
    return sum(1 for step in steps if step[0] == "sync")


def run(pipe, steps: list, deadline: float | None = None) -> list:
    """Queue and flush `steps`, read a segment per Sync."""
    return [summary(pipe.segment(deadline)) for _ in range(run_steps(pipe, steps, deadline))]


def both(pair, steps, deadline_in: float | None = 30.0):
    outcomes = []
    for pipe in pair:
        deadline = None if deadline_in is None else time.monotonic() + deadline_in
        outcomes.append(call_outcome(run, pipe, steps, deadline))
    return outcomes


def test_libpq_is_the_one_psycopg_loaded(twin_pair, connect):
    _, compiled = twin_pair("pgpipe")
    connect()
    with open("/proc/self/maps") as fh:
        mapped = {os.path.realpath(line.split()[-1]) for line in fh if len(line.split()) >= 6}
    assert os.path.realpath(compiled.LIBPQ) in mapped         # not a copy of its own: one already in the process
    if psycopg.pq.__impl__ == "binary":                       # psycopg_binary's bundled libpq, not psycopg2's
        import psycopg_binary
        libs = os.path.join(os.path.dirname(os.path.dirname(psycopg_binary.__file__)), "psycopg_binary.libs")
        bundled = [os.path.realpath(os.path.join(libs, n)) for n in os.listdir(libs) if n.startswith("libpq")]
        assert [os.path.realpath(compiled.LIBPQ)] == bundled


def test_statements_values_and_segments(pipes):
    pair, _ = pipes
    steps = [("send", b"SELECT $1::text, $2::text, $3::int4, $4::bytea", [b"abc", bytearray(b"d\xc3\xa9f"), None,
                                                                       memoryview(b"\x00\x01")], None, None),
             ("send", b"SELECT n, md5(n::text) FROM generate_series(1, 50) n", None),
             ("sync",),
             ("send", b"SELECT $1::int8 + 1", [b"41"], [20], [0]),
             ("send", b"SELECT 1 WHERE false", None),
             ("sync",)]
    pure, compiled = both(pair, steps)
    assert pure == compiled
    assert pure[0] == "ok" and pure[1][1] == [(psycopg.pq.ExecStatus.TUPLES_OK, [[b"42"]]), (2, [])]


def test_binary_parameters_and_many_of_them(pipes):
    pair, _ = pipes
    values = [str(i).encode() for i in range(40)]            # more than the stack arrays hold
    sql = ("SELECT " + " + ".join(f"${i + 1}::int4" for i in range(40))).encode()
    steps = [("send", sql, values, [23] * 40, [0] * 40),
             ("send", b"SELECT $1::int4", [(7).to_bytes(4, "big")], [23], [1]),
             ("sync",)]
    pure, compiled = both(pair, steps)
    assert pure == compiled and pure[1][0] == [(2, [[str(sum(range(40))).encode()]]), (2, [[b"7"]])]


def test_an_error_aborts_the_rest_of_its_segment_only(pipes):
    pair, _ = pipes
    steps = [("send", b"SELECT 1", None), ("send", b"SELECT 1/0", None), ("send", b"SELECT 2", None), ("sync",),
             ("send", b"SELECT 1; SELECT 2", None), ("sync",),
             ("send", b"SELECT 3", None), ("sync",)]
    pure, compiled = both(pair, steps)
    assert pure == compiled
    first, second, third = pure[1]
    assert [r[0] for r in first] == [2, "error"] and first[1][1] == b"22012"
    assert second[0][:2] == ("error", b"42601") and third == [(2, [[b"3"]])]


def test_refusals_before_anything_is_sent(pipes):
    pair, _ = pipes
    for steps in ([("send", b"SELECT $1::text", [b"a"], [25, 25], None)],
                  [("send", b"SELECT $1::text", [b"a"], None, [0, 0])]):
        pure, compiled = both(pair, steps)
        assert pure == compiled and pure[:2] == ("raised", ValueError), pure
    # A count the statement doesn't take is the server's refusal, and the connection goes on.
    steps = [("send", b"SELECT $1::text", [b"a", b"b"], None, None), ("sync",), ("send", b"SELECT 5", None), ("sync",)]
    pure, compiled = both(pair, steps)
    assert pure == compiled and pure[1][0][0][:2] == ("error", b"08P01") and pure[1][1] == [(2, [[b"5"]])]


# Pipelines drawn from a small vocabulary: values of any bytes (text the server may refuse as UTF-8 included),
# NULLs, failing statements and Syncs in any order.
STEP = st.one_of(
    st.tuples(st.just("send"), st.just(b"SELECT $1::text"), st.lists(st.one_of(st.none(), st.binary(max_size=40)),
                                                                     min_size=1, max_size=1)),
    st.tuples(st.just("send"), st.sampled_from([b"SELECT 1/0", b"SELECT 'x'::int", b"SELEC 1", b"SELECT 1; SELECT 2",
                                                b"SELECT n FROM generate_series(1, 3) n", b"ROLLBACK"])),
    st.just(("sync",)),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(STEP, max_size=8))
def test_any_pipeline_reads_the_same(pipes, steps):
    pair, _ = pipes
    pure, compiled = both(pair, steps + [("sync",)])
    assert pure == compiled


def run_put(pipe, steps: list, deadline: float | None = None) -> list:
    """`steps` queued by one put() (a send without values as bare bytes), a segment read per Sync."""
    items = [None if step[0] == "sync" else step[1] if len(step) == 2 else tuple(step[1:]) for step in steps]
    pipe.put(items, deadline)
    return [summary(pipe.segment(deadline)) for step in steps if step[0] == "sync"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(STEP, max_size=8))
def test_put_queues_as_send_and_sync_do(pipes, steps):
    pair, _ = pipes
    steps = steps + [("sync",)]
    by_put = []
    for pipe in pair:
        one_by_one = call_outcome(run, pipe, steps, time.monotonic() + 30)
        by_put.append(call_outcome(run_put, pipe, steps, time.monotonic() + 30))
        assert by_put[-1] == one_by_one
    assert by_put[0] == by_put[1]


def test_put_refuses_what_is_not_an_item(pipes):
    pair, _ = pipes
    for items in ([[b"SELECT 1"]], [(b"SELECT 1", None, None, None, None)], [()], [b"SELECT 1", "SELECT 2"]):
        pure, compiled = (call_outcome(pipe.put, items, None) for pipe in pair)
        assert pure[:2] == compiled[:2] == ("raised", TypeError), items
    # A refused item leaves the connection usable: what it queued before the refusal is read, and more after it.
    for pipe in pair:
        pipe.sync()
        pipe.flush(None)
        assert summary(pipe.segment(None))[-1] == (2, [[b"1"]])
        assert run_put(pipe, [("send", b"SELECT 5"), ("sync",)]) == [[(2, [[b"5"]])]]


def test_the_compiled_pipe_reads_the_libpq_pointer_from_its_field(twin_pair, connect):
    """psycopg's PGconn keeps its pointer where _pointer_field looks: the method calls read it without the
    property (a closed connection is refused all the same: test_a_closed_connection_is_refused_by_every_method)."""
    _, compiled = twin_pair("pgpipe")
    assert compiled.Pipe(connect().pgconn).pointer_at > 0


def read_outcomes(pipe, steps: list, wants: list, deadline: float | None = None) -> list:
    """Queue `steps` as run() does, then read each segment with outcome(deadline, want) (its wants in order; a
    None want is read with settle()), the result summarised so that twins compare."""
    run_steps(pipe, steps, deadline)
    out = []
    for want in wants:
        if want is None:
            out.append(pipe.settle(deadline))
            continue
        result, names, error = pipe.outcome(deadline, want)
        out.append((None if result is None else summary([result]), names, error))
    return out


def expected_outcome(results: list, want: int):
    """What outcome() must say of a segment whose results segment() read as `results` (psycopg PGresults)."""
    error = next(((r.error_field(_SQLSTATE).decode(), (r.error_message or b"").decode("utf-8", "replace").strip())
                  for r in results if r.status == _FATAL), None)
    chosen = results[want] if want < len(results) else None
    if chosen is None or chosen.status != psycopg.pq.ExecStatus.TUPLES_OK:
        return None, None, error
    names = [(chosen.fname(i) or b"?column?").decode("utf-8", "replace") for i in range(chosen.nfields)]
    return summary([chosen]), names, error


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(STEP, max_size=8), st.lists(st.one_of(st.none(), st.integers(0, 6)), min_size=8, max_size=8))
def test_outcome_and_settle_read_as_segment_does(pipes, steps, picks):
    """outcome() (the wanted result only, its names, the first failure) and settle() (all succeeded?) say what
    segment()'s results say, in both twins, for any pipeline; the connection is in step for the next segment."""
    pair, _ = pipes
    steps = steps + [("sync",)]
    segments = run_steps(pair[0], steps)
    wants = picks[:segments] + [0] * (segments - len(picks))
    reference = [pair[0].segment(None) for _ in range(segments)]
    expected = [settled(results) if want is None else expected_outcome(results, want)
                for results, want in zip(reference, wants)]
    for pipe in pair:
        got = call_outcome(read_outcomes, pipe, steps, wants, time.monotonic() + 30)
        assert got == ("ok", expected), type(pipe).__module__


def settled(results: list) -> bool:
    return all(r.status in (psycopg.pq.ExecStatus.COMMAND_OK, psycopg.pq.ExecStatus.TUPLES_OK) for r in results)


def test_outcome_names_and_an_unnamed_column(pipes):
    pair, _ = pipes
    steps = [("send", b"BEGIN READ ONLY", None), ("send", b'SELECT 1 AS "\xc3\xa9t\xc3\xa9", 2, $1::text AS v',
                                                      [b"x"]),
             ("send", b"ROLLBACK", None), ("sync",), ("send", b"DISCARD ALL", None), ("sync",)]
    for pipe in pair:
        got = read_outcomes(pipe, steps, [1, None], time.monotonic() + 30)
        assert got == [([(psycopg.pq.ExecStatus.TUPLES_OK, [[b"1", b"2", b"x"]])], ["\xe9t\xe9", "?column?", "v"],
                         None), True], type(pipe).__module__


def test_outcome_reports_the_first_failure_and_settle_a_failed_reset(pipes):
    pair, _ = pipes
    steps = [("send", b"SELECT 1", None), ("send", b"SELECT 1/0", None), ("send", b"SELECT 2", None), ("sync",),
             ("send", b"SELECT 1", None), ("send", b"SELECT 'x'::int", None), ("sync",), ("send", b"SELECT 3", None),
             ("sync",)]
    for pipe in pair:
        got = read_outcomes(pipe, steps, [2, None, 0], time.monotonic() + 30)
        assert got[0] == (None, None, ("22012", "ERROR:  division by zero")), type(pipe).__module__
        assert got[1] is False        # one statement of the segment failed
        assert got[2] == ([(psycopg.pq.ExecStatus.TUPLES_OK, [[b"3"]])], ["?column?"], None)


def test_a_large_call_waits_for_the_socket_and_arrives_whole(pipes):
    pair, _ = pipes
    big = b"x" * (24 << 20)      # larger than any socket buffer: the flush has to wait for the server to read
    pure, compiled = both(pair, [("send", b"SELECT length($1::text)", [big]), ("sync",)])
    assert pure == compiled == ("ok", [[(2, [[str(len(big)).encode()]])]])


def test_a_server_that_does_not_read_in_time_is_gone(pipes):
    pair, conns = pipes
    big = b"x" * (64 << 20)
    steps = [("send", b"SELECT pg_sleep(1)", None), ("send", b"SELECT length($1::text)", [big]), ("sync",)]
    pure, compiled = both(pair, steps, deadline_in=0.3)
    assert pure == compiled and pure[:2] == ("raised", _speedups.twin("pgpipe", "pure").Gone)


def test_a_reply_later_than_the_deadline_is_gone(pipes):
    pair, _ = pipes
    pure, compiled = both(pair, [("send", b"SELECT pg_sleep(0.5)", None), ("sync",)], deadline_in=0.1)
    assert pure == compiled and pure[:2] == ("raised", _speedups.twin("pgpipe", "pure").Gone)
    for pipe in pair:            # a deadline already past: Gone before any wait
        assert call_outcome(pipe.segment, time.monotonic() - 1)[:2] == ("raised", pure[1])


def test_the_wait_lets_other_threads_run(speedups, connect):
    """The interpreter lock is released while a segment waits for the server (pg_sleep keeps it waiting)."""
    pipe = speedups.pgpipe.Pipe(connect().pgconn)
    with other_thread_steps() as seen:
        pipe.send(b"SELECT pg_sleep(0.5)")
        pipe.sync()
        start = time.monotonic()
        pipe.flush(None)
        pipe.segment(None)
    # The reply can't come before the server slept 0.5 s, so a step of the other thread inside this window ran
    # during the wait.
    assert any(start + 0.05 < t < start + 0.45 for t in seen)


@pytest.mark.parametrize("spin", [0.0, 0.002, 1.0])
def test_a_spinning_wait_reads_the_same_and_keeps_the_deadline(twin_pair, connect, spin):
    """A Pipe made to spin (the compiled twin looks at the socket before it sleeps; the pure one ignores it) reads
    what the pure twin reads, and a spin longer than what is left of the deadline still ends at the deadline."""
    pure, compiled = twin_pair("pgpipe")
    pair = (pure.Pipe(connect().pgconn, spin), compiled.Pipe(connect().pgconn, spin))
    steps = [("send", b"SELECT n FROM generate_series(1, 3000) n", None), ("send", b"SELECT 1", None), ("sync",),
             ("send", b"SELECT pg_sleep(0.01)", None), ("sync",)]
    outcomes = both(pair, steps)
    assert outcomes[0] == outcomes[1] and outcomes[0][0] == "ok"
    for pipe in pair:
        started = time.monotonic()
        assert call_outcome(run, pipe, [("send", b"SELECT pg_sleep(2)", None), ("sync",)],
                            started + 0.1)[:2] == ("raised", pure.Gone)
        assert time.monotonic() - started < 0.9         # the 1 s spin stopped at the 0.1 s deadline


def test_after_a_spin_that_missed_slow_replies_are_slept_for(speedups, connect):
    """A reply slower than the spin (a write's, a long query's) makes the next waits sleep at once instead of
    spinning again; a reply that then comes within the spin turns spinning back on. Seen from outside as the
    process's CPU time over a wait of 0.3 s: a spin of 0.2 s would burn most of that, a sleep next to none."""
    pipe = speedups.pgpipe.Pipe(connect().pgconn, 0.2)
    slow = [("send", b"SELECT pg_sleep(0.3)", None), ("sync",)]
    assert run(pipe, slow, time.monotonic() + 30)[0][0][0] == psycopg.pq.ExecStatus.TUPLES_OK   # spun, missed
    cpu = time.process_time()
    assert run(pipe, slow, time.monotonic() + 30)[0][0][0] == psycopg.pq.ExecStatus.TUPLES_OK
    assert time.process_time() - cpu < 0.1                    # slept at once
    for _ in range(3):                                         # quick replies: spinning resumes, results unchanged
        assert run(pipe, [("send", b"SELECT 41 + 1", None), ("sync",)], time.monotonic() + 30) == \
            [[(psycopg.pq.ExecStatus.TUPLES_OK, [[b"42"]])]]


def test_readable_and_a_connection_the_server_ended(pipes):
    pair, conns = pipes
    from tests.services import pg_admin
    admin = pg_admin()
    try:
        for pipe, conn in zip(pair, conns):
            assert pipe.readable() is False
            admin.cursor().execute("SELECT pg_terminate_backend(%s)", (conn.pgconn.backend_pid,))
            assert select.select([conn.pgconn.socket], [], [], 10)[0]   # the FATAL and the EOF have arrived
            assert pipe.readable() is True
    finally:
        admin.close()
    pure, compiled = both(pair, [("send", b"SELECT 1", None), ("sync",)])
    assert pure == compiled and pure[:2] == ("raised", psycopg.OperationalError)


def test_a_closed_connection_is_refused_by_every_method(pipes):
    pair, conns = pipes
    for conn in conns:
        conn.close()
    calls = [("send", (b"SELECT 1",)), ("put", ([b"SELECT 1", None], None)), ("sync", ()), ("flush", (None,)),
             ("segment", (None,)),
             ("outcome", (None, 0)), ("settle", (None,)), ("readable", ())]
    for name, args in calls:
        pure, compiled = (call_outcome(getattr(pipe, name), *args) for pipe in pair)
        assert pure == compiled and pure[:2] == ("raised", psycopg.OperationalError), name
        assert "the connection is closed" in pure[2]


_NOTHING_PENDING_CHILD = """
import json, os, psycopg
from qag import _speedups
f = json.loads(os.environ["QAG_TEST_PG"])
conn = psycopg.Connection.connect(host=f["host"], port=f["port"], user=f["user"], password=f["password"],
                                  dbname=f["database"], autocommit=True)
conn.pgconn.enter_pipeline_mode()
pipe = _speedups.twin("pgpipe", os.environ["QAG_TEST_TWIN"]).Pipe(conn.pgconn)
method = os.environ["QAG_TEST_METHOD"]
for step in ("first", "again"):           # a segment read whole, then nothing pending; then once more
    pipe.put([b"SELECT 1", None], None)
    pipe.segment(None)
    try:
        getattr(pipe, method)(*((None, 0) if method == "outcome" else (None,)))
    except psycopg.OperationalError as error:
        print(step, "raised", error)
    else:
        print(step, "returned")
"""


@pytest.mark.parametrize("method", ["segment", "outcome", "settle"])
def test_a_read_with_no_sync_pending_raises_instead_of_looping(twin_pair, pg_db, method):
    """With nothing sent since the last Sync was read, libpq answers "no result" for ever: both twins raise at
    once (and the connection still serves the next call), where they used to loop for ever, the compiled one
    holding the interpreter lock. A child process, so a loop fails the test by its timeout instead of hanging it."""
    twin_pair("pgpipe")
    for twin in ("pure", "compiled"):
        out = _in_child(_NOTHING_PENDING_CHILD, QAG_TEST_PG=json.dumps(pg_db), QAG_TEST_TWIN=twin,
                        QAG_TEST_METHOD=method)
        assert out.returncode == 0, out.stderr
        expected = "raised no reply is pending on the connection: nothing was sent since its last Sync"
        assert out.stdout.splitlines() == [f"first {expected}", f"again {expected}"], (twin, out.stdout)


def test_the_backend_runs_the_selected_twin(pg_db):
    from qag import settings as qag_settings
    from qag.backends import postgres

    backend = postgres.PostgresBackend(qag_settings.load({}))
    link = backend.connect(pg_db)
    try:
        assert type(link.pipe) is _speedups.get("pgpipe").Pipe
    finally:
        link.close()


def _in_child(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


def test_the_compiled_twin_does_not_import_psycopg(twin_pair):
    twin_pair("pgpipe")
    out = _in_child("import sys, qag._speedups._pgpipe as m; print('psycopg' in sys.modules, bool(m.LIBPQ))")
    assert out.stdout.split() == ["False", "True"], out.stderr


def test_auto_falls_back_when_psycopg_runs_its_ctypes_implementation(twin_pair):
    twin_pair("pgpipe")
    code = ("from qag import _speedups; print(_speedups.kind()); "
            "print(_speedups.choices()['pgpipe']); print(_speedups.fallbacks().get('pgpipe'))")
    out = _in_child(code, PSYCOPG_IMPL="python", QAG_SPEEDUPS="auto")
    process, kind, reason = out.stdout.splitlines()
    if process != "compiled" and not required():
        pytest.skip("this tree's other builds can't run (rebuild): the process runs pure")
    assert kind == "pure" and "PSYCOPG_IMPL=python" in reason, out.stderr
    out = _in_child("from qag import _speedups; _speedups.check()", PSYCOPG_IMPL="python", QAG_SPEEDUPS="require")
    assert out.returncode != 0 and "QAG_SPEEDUPS=require" in out.stderr and "pgpipe" in out.stderr


def test_readable_sends_what_a_flush_made_due(pipes):
    """A flush's statements reach the server even when the next thing asked is readable(), not segment() (the
    compiled twin sends them inside the next segment's wait; readable() must send them first, never waiting)."""
    pair, _ = pipes
    for pipe in pair:
        pipe.send(b"SELECT 41 + 1")
        pipe.sync()
        pipe.flush(time.monotonic() + 30)
        give_up = time.monotonic() + 30
        while not pipe.readable():          # the reply can only come if the statement was sent
            assert time.monotonic() < give_up, type(pipe).__module__
            time.sleep(0.005)
        assert summary(pipe.segment(time.monotonic() + 30)) == [(psycopg.pq.ExecStatus.TUPLES_OK, [[b"42"]])]


# ---------------------------------------------------------------------------------------------
# Pipe.rows: the compiled twin reads integer, boolean and UTF-8 text columns itself; every row must be what
# psycopg's Transformer makes of the same result.


def _result(pipe, sql: bytes, values=None, types=None):
    pipe.send(sql, values, types)
    pipe.sync()
    pipe.flush(time.monotonic() + 30)
    results = pipe.segment(time.monotonic() + 30)
    assert results and results[-1].status == psycopg.pq.ExecStatus.TUPLES_OK, summary(results)
    return results[-1]


def _rows_of_each(twin_pair, connect, sql: bytes, values=None, types=None, encoding: str | None = None,
                  ranges=None, kept: dict | None = None):
    """For each twin: (what its Pipe.rows gives, what psycopg's Transformer gives) over `ranges` of the result,
    each as call_outcome (a value or the exception raised). `encoding` is set before the Transformer is made;
    `kept` keeps one connection per twin across calls (hypothesis examples)."""
    from psycopg.adapt import Transformer
    out = []
    for twin in twin_pair("pgpipe"):
        if kept is None:
            conn = connect()
        else:
            conn = kept.get(twin.__name__) or kept.setdefault(twin.__name__, connect())
        if encoding is not None:
            conn.pgconn.exit_pipeline_mode()
            conn.execute(f"SET client_encoding TO '{encoding}'")
            conn.pgconn.enter_pipeline_mode()
        pipe, tx = twin.Pipe(conn.pgconn), Transformer(conn)
        result = _result(pipe, sql, values, types)
        for start, end in ranges or [(0, result.ntuples)]:
            got = call_outcome(pipe.rows, result, tx, start, end)
            reference = call_outcome(twin.transformer_rows, result, Transformer(conn), start, end)
            out.append((got, reference))
    return out


def _assert_same(pairs):
    for got, reference in pairs:
        assert got == reference
        if got[0] == "ok":      # the same types as well (True == 1, 1 == 1.0 would pass the comparison above)
            assert [[type(v) for v in row] for row in got[1]] == [[type(v) for v in row] for row in reference[1]]


DIRECT_COLUMNS = """
SELECT i2, i4, i8, o, t, v, c, n, b FROM (VALUES
  (0::int2, 0::int4, 0::int8, 0::oid, ''::text, ''::varchar, ''::char(3), ''::name, true),
  (-32768, -2147483648, -9223372036854775808, 4294967295, 'plain', 'varchar', 'ab', 'name', false),
  (32767, 2147483647, 9223372036854775807, 1, 'é€😀 "quoted" \\ back', 'ünï', 'x', 'ñ', NULL),
  (NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, true),
  (-1, -999999999, 999999999999999999, 42, repeat('long ', 100), 'v', 'abc', 'n', true),
  (1, 1, -1000000000000000000, 7, E'tab\\tnew\\nline', '', '', '', false)
) AS x(i2, i4, i8, o, t, v, c, n, b)
""".encode()


def test_rows_direct_columns_match_the_transformer(twin_pair, connect):
    pairs = _rows_of_each(twin_pair, connect, DIRECT_COLUMNS, ranges=[(0, 6), (1, 4), (5, 6), (2, 2), (0, 0)])
    _assert_same(pairs)
    rows = pairs[-5][0][1]      # the compiled twin's full read
    assert rows[1][:4] == (-32768, -2147483648, -9223372036854775808, 4294967295) and rows[1][8] is False
    assert rows[2][4] == 'é€😀 "quoted" \\ back' and rows[3] == (None,) * 8 + (True,)


def test_rows_repeated_text_down_a_column_is_one_str(twin_pair, connect):
    """A join's parent columns and a padded column repeat their text row after row: the compiled twin decodes it
    once per run of equal texts (a str is immutable, so no caller can tell), and still matches the Transformer,
    across NULLs and texts that differ only in length or in one byte."""
    sql = ("SELECT t, p::char(4), i FROM (VALUES ('same', 'é', 1), ('same', 'é', 2), (NULL, 'é', 3), "
           "('same', 'e', 4), ('samex', 'e', 5), ('sama', NULL, 6), ('sama', 'e', 7)) AS x(t, p, i)").encode()
    pairs = _rows_of_each(twin_pair, connect, sql)
    _assert_same(pairs)
    rows = pairs[-1][0][1]      # the compiled twin's read
    assert rows[0][0] is rows[1][0] and rows[0][1] is rows[1][1] is rows[2][1] and rows[3][1] is rows[6][1]
    assert [r[0] for r in rows] == ["same", "same", None, "same", "samex", "sama", "sama"]
    assert [r[1] for r in rows] == ["é   ", "é   ", "é   ", "e   ", "e   ", None, "e   "]


def test_rows_ranges_psycopg_refuses_raise_the_same(twin_pair, connect):
    pairs = _rows_of_each(twin_pair, connect, DIRECT_COLUMNS, ranges=[(0, 7), (3, 2), (-1, 2), (7, 7)])
    _assert_same(pairs)
    assert all(got[0] == "raised" for got, _ in pairs)


@pytest.mark.parametrize("sql", [
    b"SELECT 1::int4 AS i, 1.5::numeric AS n, now()::date AS d",        # one column psycopg's own loader reads
    b"SELECT 't'::bool, '{1,2}'::int4[], '{\"a\": 1}'::jsonb, 'x'::bytea, 2.5::float8, 'x'::\"char\"",
    b"SELECT " + b", ".join(b"%d::int4" % i for i in range(70)),          # wider than the direct reader takes
])
def test_rows_other_columns_go_to_the_transformer(twin_pair, connect, sql):
    _assert_same(_rows_of_each(twin_pair, connect, sql))


@pytest.mark.parametrize("encoding", ["LATIN1", "SQL_ASCII", "UTF8"])
def test_rows_text_follows_the_encoding_the_transformer_decodes(twin_pair, connect, encoding):
    pairs = _rows_of_each(twin_pair, connect, b"SELECT convert_from('\\xc3a9'::bytea, 'UTF8'), 1::int4",
                          encoding=encoding)
    _assert_same(pairs)
    assert pairs[-1][0][1][0][0] == {"LATIN1": "é", "SQL_ASCII": b"\xc3\xa9", "UTF8": "é"}[encoding]


@pytest.fixture
def kept():
    """One connection per twin for all of a hypothesis test's examples (closed by `connect` at its end)."""
    return {}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(-2**63, 2**63 - 1),
                          st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                                  max_size=30),
                          st.booleans()), min_size=1, max_size=5))
def test_rows_any_values_match_the_transformer(twin_pair, connect, kept, values):
    params, selects = [], []
    for k, (number, text, flag) in enumerate(values):
        params += [str(number).encode(), text.encode(), b"t" if flag else b"f"]
        selects.append(f"SELECT ${3 * k + 1}::int8, ${3 * k + 2}::text, ${3 * k + 3}::bool")
    sql = " UNION ALL ".join(selects).encode()
    pairs = _rows_of_each(twin_pair, connect, sql, params, kept=kept)
    _assert_same(pairs)
    assert pairs[-1][0][1] == [tuple(v) for v in values]


# ---------------------------------------------------------------------------------------------
# Pipe.json: the compiled twin writes a page's JSON from libpq's text values when each value's JSON is its text;
# whenever it answers, the bytes must be rowjson's for the rows Pipe.rows makes of the same range.


def _json_of_each(twin_pair, connect, sql: bytes, values=None, ranges=None, kept: dict | None = None):
    """For each twin: [(Pipe.json's answer, rowjson.encode_json of Pipe.rows over the same range)] per range,
    the rows encoded by both rowjson twins (which must agree)."""
    from psycopg.adapt import Transformer
    pure_json, compiled_json = twin_pair("rowjson")
    out = {}
    for twin in twin_pair("pgpipe"):
        if kept is None:
            conn = connect()
        else:
            conn = kept.get(twin.__name__) or kept.setdefault(twin.__name__, connect())
        pipe, tx = twin.Pipe(conn.pgconn), Transformer(conn)
        result = _result(pipe, sql, values)
        names = [result.fname(i).decode() for i in range(result.nfields)]
        answers = []
        for start, end in ranges or [(0, result.ntuples)]:
            rows = pipe.rows(result, tx, start, end)
            expected = pure_json.encode_json(names, rows)
            assert compiled_json.encode_json(names, rows) == expected
            answers.append((pipe.json(result, tx, start, end, names), expected))
        out[twin.__name__.rsplit(".", 1)[-1]] = answers
    return out


# DIRECT_COLUMNS without its rows of text to escape (non-ASCII, a quote, a backslash, a tab): 4 rows left.
PLAIN_COLUMNS = (b"SELECT * FROM (" + DIRECT_COLUMNS + b") AS d "
                 b"WHERE coalesce(t || v || c || n, '') !~ '[^ -~]' AND coalesce(t, '') !~ '[\"\\\\]'")


def test_json_writes_rowjsons_bytes_for_plain_values(twin_pair, connect):
    answers = _json_of_each(twin_pair, connect, PLAIN_COLUMNS, ranges=[(0, 4), (1, 3), (3, 4), (0, 1)])
    assert all(got is None for got, _ in answers["pgpipe"])            # the pure twin leaves it to rowjson
    for got, expected in answers["_pgpipe"]:
        assert got is not None and got == expected
    assert answers["_pgpipe"][0][0].startswith(b'[{"i2":0,"i4":0,"i8":0,"o":0,"t":"","v":"","c":"   ","n":"",'
                                               b'"b":true},{"i2":-32768,')


@pytest.mark.parametrize("sql", [
    b"SELECT 'a \"quote\"'::text AS t, 1::int4 AS i",               # text JSON escapes
    b"SELECT 'back\\slash'::text AS t",
    b"SELECT E'line\\nbreak\\ttab\\rreturn\\bback\\fform'::text AS t",
    b"SELECT E'del\\x7f and \\x01'::text AS t",
    "SELECT 'café €, 😀'::text AS t, NULL::text AS u, ''::text AS e".encode(),   # non-ASCII: \u escapes, pairs
])
def test_json_writes_text_escaped_as_rowjson_escapes_it(twin_pair, connect, sql):
    for got, expected in _json_of_each(twin_pair, connect, sql)["_pgpipe"]:
        assert got is not None and got == expected


def test_json_writes_every_direct_column_with_its_text_to_escape(twin_pair, connect):
    answers = _json_of_each(twin_pair, connect, DIRECT_COLUMNS, ranges=[(0, 6), (2, 3), (5, 6)])
    for got, expected in answers["_pgpipe"]:
        assert got is not None and got == expected


@pytest.mark.parametrize("sql", [
    "SELECT 1::int4 AS \"é\"".encode(),                             # a column name that isn't plain
    b"SELECT 1::int4 AS \"a\"\"b\"",
    b"SELECT 1.5::numeric AS n, 1::int4 AS i",                       # a column of another kind
    b"SELECT 1::int4 AS i WHERE false",                               # no rows
])
def test_json_leaves_to_rowjson_what_is_not_its_text(twin_pair, connect, sql):
    for got, _ in _json_of_each(twin_pair, connect, sql)["_pgpipe"]:
        assert got is None


def test_json_writes_duplicate_names_as_rowjson_renames_them(twin_pair, connect):
    sql = b"SELECT 1::int4 AS i, 2::int4 AS i, 3::int4 AS i_2"
    (got, expected), = _json_of_each(twin_pair, connect, sql)["_pgpipe"]
    assert got == expected == b'[{"i":1,"i_3":2,"i_2":3}]\n'


_NAMES = st.lists(st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7f), min_size=1, max_size=6)
                  .filter(lambda n: '"' not in n), min_size=3, max_size=3)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_NAMES, st.lists(st.tuples(st.one_of(st.none(), st.integers(-2**63, 2**63 - 1)),
                                  st.one_of(st.none(), st.text(st.characters(blacklist_categories=("Cs",),
                                                                             blacklist_characters="\x00"),
                                                               max_size=30)),
                                  st.one_of(st.none(), st.booleans())), min_size=1, max_size=5))
def test_json_any_values_and_names_match_rowjson(twin_pair, connect, kept, names, values):
    params, selects = [], []
    for k, (number, text, flag) in enumerate(values):
        params += [None if number is None else str(number).encode(), None if text is None else text.encode(),
                   None if flag is None else (b"t" if flag else b"f")]
        columns = [f'${3 * k + 1}::int8', f'${3 * k + 2}::text', f'${3 * k + 3}::bool']
        if k == 0:
            columns = [f'{c} AS "{name}"' for c, name in zip(columns, names)]
        selects.append("SELECT " + ", ".join(columns))
    sql = " UNION ALL ".join(selects).encode()
    answers = _json_of_each(twin_pair, connect, sql, params, ranges=[(0, len(values)), (len(values) - 1, len(values))],
                            kept=kept)
    plain_names = all(0x20 <= ord(ch) < 0x7f and ch not in '"\\' for name in names for ch in name)
    for got, expected in answers["_pgpipe"]:
        assert got == expected if plain_names else got in (None, expected)   # any text is written, escaped
