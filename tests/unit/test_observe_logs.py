"""Log lines: plain and JSON formats with the request id, escaped line breaks, the `qag` logger routed through
the writer thread, and request lines switched by QAG_LOG_REQUESTS."""

from __future__ import annotations

import io
import json
import logging
import time

from qag.observe.logs import LogWriter
from qag.settings import load
from tests.unit.test_observe_history import App


def _writer(**env) -> tuple[LogWriter, io.StringIO]:
    out = io.StringIO()
    w = LogWriter(load({"QAG_HOME": "/tmp", **env}))
    w.install(out)
    return w, out


def test_plain_request_line_names_request_and_key():
    w, out = _writer()
    w.put(("req", 0.0, "abc123", "admin", "GET", "/q/films", 200, 2.14, None))
    w.close()
    line = out.getvalue()
    assert line.endswith(" INFO qag [abc123 key=admin]: GET /q/films -> 200 in 2.1ms\n")


def test_plain_lines_carry_local_time_to_the_millisecond(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        w, out = _writer()
        for at in (1_700_000_000.0421, 1_700_000_000.999, 1_700_000_001.0, 1_700_000_061.5):
            w.put(("req", at, "r", "k", "GET", "/", 200, 1.0, None))
        w.close()
        stamps = [line.split(" INFO ")[0] for line in out.getvalue().splitlines()]
        assert stamps == ["2023-11-14 22:13:20,042", "2023-11-14 22:13:20,999", "2023-11-14 22:13:21,000",
                          "2023-11-14 22:14:21,500"]
    finally:
        monkeypatch.undo()   # the zone this process had, then read again
        time.tzset()


def test_json_lines_carry_structured_fields():
    w, out = _writer(QAG_JSON_LOGS="1")
    w.put(("req", 1_700_000_000.5, "rid-1", "partner", "POST", "/execute_sql", 500, 7.5, None))
    logging.getLogger("qag").warning("two\nlines", extra={"request_id": "rid-2", "key": "-"})
    w.close()
    first, second = [json.loads(line) for line in out.getvalue().splitlines()]
    assert (first["level"], first["logger"], first["request_id"], first["key"], first["method"], first["status"],
            first["duration_ms"], first["message"]) == ("INFO", "qag", "rid-1", "partner", "POST", 500, 7.5,
                                                        "POST /execute_sql -> 500 in 7.5ms")
    assert first["time"].startswith("2023-11-1")
    assert (second["level"], second["request_id"], second["message"]) == ("WARNING", "rid-2", "two\nlines")


def test_control_characters_in_a_message_are_escaped():
    """A decoded path can carry NUL, ESC or a Unicode line separator into the request line: one line, escaped."""
    w, out = _writer()
    logging.getLogger("qag").warning("GET /api/v1/api-keys/\x00\x1b[2J\u2028x\x7f\ty -> 404")
    w.close()
    text = out.getvalue()
    assert text.count("\n") == 1 and text.endswith("GET /api/v1/api-keys/\\u0000\\u001b[2J\\u2028x\\u007f\ty -> 404\n")


def test_plain_lines_escape_line_breaks_and_exceptions_are_one_line():
    w, out = _writer()
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("qag").exception("failed\nbadly")
    w.close()
    text = out.getvalue()
    assert text.count("\n") == 1 and "failed\\nbadly" in text and "RuntimeError: boom" in text


def test_a_request_is_one_line_by_default(tmp_path):
    app = App(str(tmp_path))
    out = io.StringIO()
    app.gateway.observe.logs.install(out)
    app.query("films")
    app.run("films", headers={"X-Request-Id": "one-line"})
    app.gateway.close()
    lines = [line for line in out.getvalue().splitlines() if "one-line" in line]
    assert len(lines) == 1 and "GET /q/films -> 200 in " in lines[0]


def test_requests_and_runs_are_logged_with_their_request_id(tmp_path):
    app = App(str(tmp_path), QAG_LOG_STATEMENTS="on")
    out = io.StringIO()
    app.gateway.observe.logs.install(out)
    app.query("films")
    app.run("films", headers={"X-Request-Id": "trace-me"})
    app.call("GET", "/health", key=None)
    app.gateway.close()
    lines = [line for line in out.getvalue().splitlines() if "trace-me" in line]
    assert any("GET /q/films -> 200 in " in line for line in lines)
    assert any("Executing on lite (sqlite), limit=10 offset=0 timeout=30.0: SELECT id, name FROM t" in line
               for line in lines)
    assert "/health" not in out.getvalue()


def test_log_requests_off_keeps_warnings(tmp_path):
    app = App(str(tmp_path), QAG_LOG_REQUESTS="off", QAG_SLOW_QUERY_THRESHOLD="0.000001")
    out = io.StringIO()
    app.gateway.observe.logs.install(out)
    app.query("films")
    app.run("films", headers={"X-Request-Id": "quiet"})
    app.gateway.close()
    text = out.getvalue()
    assert "Executing" not in text and "->" not in text
    assert "WARNING qag [quiet key=admin]: Slow query on lite (sqlite)" in text


def test_adhoc_sql_hash_mode_keeps_the_text_out_of_logs(tmp_path):
    app = App(str(tmp_path), QAG_HISTORY_ADHOC_SQL="hash", QAG_LOG_STATEMENTS="on")
    out = io.StringIO()
    app.gateway.observe.logs.install(out)
    app.call("POST", "/execute_sql", {"sql": "SELECT 'secret' AS s", "connection_name": "lite"})
    app.gateway.close()
    assert "secret" not in out.getvalue() and "(text not logged; sha256 " in out.getvalue()


def test_the_log_writer_pauses_for_request_threads_every_64_lines(monkeypatch):
    from qag.observe import logs
    pauses: list[int] = []
    monkeypatch.setattr(logs, "pause", lambda: pauses.append(1))
    w, out = _writer()
    w._write([("req", 0.0, "r", "k", "GET", f"/q/n{i}", 200, 1.0, None) for i in range(200)], "")
    assert len(pauses) == 3            # after lines 64, 128 and 192
    lines = out.getvalue().splitlines()
    assert [line.rsplit(" ", 5)[1] for line in lines] == [f"/q/n{i}" for i in range(200)]


def test_a_batch_is_written_in_whole_lines_of_at_most_pipe_buf_bytes():
    # Workers share stderr (a pipe): a write over PIPE_BUF (4096) bytes may be interleaved with another process's,
    # splicing one worker's line into another's. Each write is whole lines, at most 4096 bytes (one longer line alone).
    class Writes(io.StringIO):
        def __init__(self):
            super().__init__()
            self.chunks: list[str] = []

        def write(self, text):
            self.chunks.append(text)
            return super().write(text)

    out = Writes()
    w = LogWriter(load({"QAG_HOME": "/tmp"}))
    w.install(out)
    batch = [("req", 0.0, "r", "k", "GET", f"/q/n{i}/" + "é" * (i % 7), 200, 1.0, None) for i in range(300)]
    batch.append(("req", 0.0, "r", "k", "GET", "/q/" + "x" * 6000, 200, 1.0, None))
    w._write(batch, "")
    assert len(out.chunks) > 1 and all(chunk.endswith("\n") for chunk in out.chunks)
    sizes = [len(chunk.encode()) for chunk in out.chunks]
    assert all(size <= 4096 for size in sizes[:-1]) and sizes[-1] > 6000 and out.chunks[-1].count("\n") == 1
    lines = out.getvalue().splitlines()
    assert len(lines) == 301 and [line.rsplit(" ", 5)[1] for line in lines[:3]] == ["/q/n0/", "/q/n1/é", "/q/n2/éé"]
