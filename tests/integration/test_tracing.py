"""OpenTelemetry tracing (QAG_OTEL) of a real `qag serve` (gunicorn, two workers), exporting to a real OTLP/HTTP
receiver in this process (POST /v1/traces, protobuf, decoded with opentelemetry-proto): an incoming traceparent
and tracestate continued, one span per pipeline stage under the request's span, errors' status, no secret in any
attribute, the trace id in the JSON log lines and in the run's history entry; and with tracing off, nothing
exported and no OpenTelemetry module imported by any process of the server."""

from __future__ import annotations

import json
import os

import pytest

from tests.otlp import Receiver
from tests.server import KeptConnection, Server, q, wait_for

pytestmark = pytest.mark.e2e

PROBE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "import_probe")
TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"
SECRET_VALUE = "Zanzibar-4417"   # a parameter value: it must reach no span
SQL = "SELECT id, name FROM t WHERE id <= :n OR name = :who ORDER BY id"


def _probe_env(log: str, prefixes: str) -> dict:
    path = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": PROBE + (os.pathsep + path if path else ""), "QAG_TEST_IMPORT_LOG": log,
            "QAG_TEST_IMPORT_PREFIXES": prefixes}


def _imports(log: str) -> list[tuple[int, int, str]]:
    if not os.path.exists(log):
        return []
    with open(log, encoding="utf-8") as f:
        return [(int(pid), int(ppid), module) for pid, ppid, module in (line.split() for line in f)]


def _json_lines(server: Server, request_id: str) -> list[dict]:
    return [json.loads(line) for line in list(server.log)
            if line.startswith("{") and f'"request_id":"{request_id}"' in line]


def _history_entry(server: Server, name: str, request_id: str) -> dict:
    items = server.get(f"/api/v1/queries/{name}/history").json["items"]
    return next(item for item in items if item["request_id"] == request_id)


@pytest.fixture(scope="module")
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture(scope="module")
def traced(receiver, make_module_server, tmp_path_factory):
    log = str(tmp_path_factory.mktemp("imports") / "imports.log")
    s = make_module_server(env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_SERVICE_NAME": "qag-under-test",
                                "OTEL_BSP_SCHEDULE_DELAY": "50", "QAG_JSON_LOGS": "1",
                                **_probe_env(log, "opentelemetry,qag.app")})
    s.imports_log = log
    return s


def test_an_incoming_traceparent_is_continued_with_a_span_per_stage(traced, receiver, uniq):
    name = uniq("traced")
    traced.query(name, SQL, "lite")
    key = traced.key(uniq("caller"), queries=[name])
    r = traced.get(q(name), key=key, params={"n": "3", "who": SECRET_VALUE},
                   headers={"traceparent": f"00-{TRACE}-{PARENT}-01", "tracestate": "vendor=opaque"})
    assert r.status == 200 and len(r.json) == 3, r
    rid = r.headers["x-request-id"]
    root, kids = receiver.trace_of(rid, 7)

    assert (root["trace"], root["parent"], root["kind"]) == (TRACE, PARENT, 2)   # 2: SERVER
    assert root["trace_state"] == "vendor=opaque"
    assert root["name"] == "GET /q/{name}" and root["scope"] == "qag"
    assert root["resource"]["service.name"] == "qag-under-test"
    a = root["attributes"]
    assert (a["http.request.method"], a["http.route"], a["http.response.status_code"], a["url.path"]) == \
        ("GET", "/q/{name}", 200, f"/q/{name}")
    assert root["status"] == 0   # unset: the call succeeded
    # The stages in the order the pipeline runs them (policy and bind are measured before and after the connection
    # is known), each a child of the request's span in the same trace, one after the other within it.
    assert [k["name"] for k in kids] == ["auth", "policy", "bind", "policy", "bind", "database", "encode"]
    assert all(k["trace"] == TRACE for k in kids)
    assert root["start"] <= kids[0]["start"] and kids[-1]["end"] <= root["end"]
    assert all(a["end"] <= b["start"] for a, b in zip(kids, kids[1:]))
    assert all(k["start"] <= k["end"] for k in kids)
    database = kids[5]
    assert database["kind"] == 3   # CLIENT
    d = database["attributes"]
    assert (d["db.system.name"], d["qag.connection"], d["qag.query"], d["qag.query.version"], d["qag.run"],
            d["db.response.returned_rows"], d["db.query.text"]) == ("sqlite", "lite", name, 1, "saved", 3, SQL)
    # Never a secret: not the API key, not a parameter value, not the query string.
    everything = json.dumps([root, kids])
    assert SECRET_VALUE not in everything and key not in everything and traced.admin_key not in everything
    assert "who=" not in everything

    # The same trace id in the request's log lines (JSON mode) and in its run history entry.
    def request_line():
        lines = _json_lines(traced, rid)
        return lines if any(line["message"].startswith(f"GET /q/{name} -> 200") for line in lines) else None
    lines = wait_for(request_line, "the request's log line")
    assert {line["trace_id"] for line in lines} == {TRACE}
    assert all(list(line)[:6] == ["time", "level", "logger", "request_id", "key", "trace_id"] for line in lines)
    entry = _history_entry(traced, name, rid)
    assert entry["trace_id"] == TRACE
    keys = list(entry)
    assert keys.index("trace_id") == keys.index("transport") + 1   # contract 8.1's order


def test_a_call_without_traceparent_starts_its_own_trace(traced, receiver, uniq):
    name = uniq("fresh")
    traced.query(name, "SELECT 1 AS one", "lite")
    conn = KeptConnection(traced)   # one worker: its exporter sends spans in the order they ended
    try:
        quiet = [conn.get(path, headers={"traceparent": f"00-{TRACE}-{PARENT}-01"}) for path in ("/health", "/livez")]
        r = conn.get(q(name))
    finally:
        conn.close()
    rid = r.headers["x-request-id"]
    root, kids = receiver.trace_of(rid, 7)
    # Health checks (like /metrics scrapes) make no spans, as they make no log lines.
    assert [x.status for x in quiet] == [200, 200]
    assert not [s for s in receiver.spans() if s["attributes"].get("url.path") in ("/health", "/livez")]
    assert root["parent"] == "" and len(root["trace"]) == 32 and root["trace"] not in (TRACE, "0" * 32)
    assert {k["trace"] for k in kids} == {root["trace"]}
    assert _history_entry(traced, name, rid)["trace_id"] == root["trace"]
    lines = wait_for(lambda: _json_lines(traced, rid), "the log line")
    assert lines[0]["trace_id"] == root["trace"]


def test_errors_set_the_status_of_the_span_that_failed(traced, receiver, uniq):
    # The database refuses the statement: the database span is an error, the request's span carries the code.
    r = traced.post("/execute_sql", {"sql": "SELECT * FROM no_such_table", "connection_name": "lite"})
    assert r.status >= 400, r
    code = r.json["code"]
    root, kids = receiver.trace_of(r.headers["x-request-id"], 1)
    failed = [k for k in kids if k["name"] == "database"]
    assert len(failed) == 1 and failed[0]["status"] == 2 and failed[0]["attributes"]["error.type"] == code
    assert failed[0]["attributes"]["qag.run"] == "adhoc"
    assert root["attributes"]["qag.error.code"] == code and root["attributes"]["http.route"] == "/execute_sql"
    assert root["status"] == (2 if r.status >= 500 else 0)   # a 4xx is the caller's error, not the server's
    # An unknown key: refused at authentication, no run; the request's span says so and holds no key.
    r = traced.get(q("anything"), key="not-a-key-0123456789")
    assert r.status == 401
    root, kids = receiver.trace_of(r.headers["x-request-id"], 1)
    assert [k["name"] for k in kids] == ["auth"]
    assert root["attributes"]["qag.error.code"] == "unauthorized" and root["status"] == 0
    assert "not-a-key-0123456789" not in json.dumps([root, kids])


def test_cached_calls_have_a_cache_span_and_a_hit_no_database_span(traced, receiver, uniq):
    name = uniq("cached")
    traced.query(name, "SELECT id FROM t WHERE id = :id", "lite", cache_ttl=60)
    miss = traced.get(q(name), params={"id": "4"})
    hit = traced.get(q(name), params={"id": "4"})
    assert (miss.headers["x-cache"], hit.headers["x-cache"]) == ("MISS", "HIT")
    _, kids = receiver.trace_of(miss.headers["x-request-id"], 8)
    names = [k["name"] for k in kids]
    assert names == ["auth", "policy", "bind", "cache", "policy", "bind", "database", "encode", "cache"]
    _, kids = receiver.trace_of(hit.headers["x-request-id"], 4)
    assert [k["name"] for k in kids] == ["auth", "policy", "bind", "cache"]


def test_opentelemetry_is_imported_in_the_workers_only(traced, receiver):
    """Spans, the batch processor and its thread are made after fork: the master never imports OpenTelemetry."""
    imports = _imports(traced.imports_log)
    master = traced.proc.pid
    otel = [(pid, ppid) for pid, ppid, module in imports if module.startswith("opentelemetry")]
    assert otel and all(ppid == master for _, ppid in otel), imports
    assert all(s["resource"]["service.name"] == "qag-under-test" for s in receiver.spans())
    assert all(path == "/v1/traces" and ctype == "application/x-protobuf" for path, ctype, _ in receiver.requests)


def test_tracing_off_exports_nothing_and_imports_no_opentelemetry(receiver, make_server, tmp_path, uniq):
    log = str(tmp_path / "imports.log")
    before = len(receiver.requests)
    # The endpoint is set, as a host's environment may set it for other programs; QAG_OTEL=off wins.
    s = make_server(env={"QAG_OTEL": "off", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
                         "OTEL_BSP_SCHEDULE_DELAY": "50", "QAG_JSON_LOGS": "1",
                         **_probe_env(log, "opentelemetry,qag.app")})
    name = uniq("untraced")
    s.query(name, "SELECT 1 AS one", "lite")
    r = s.get(q(name), headers={"traceparent": f"00-{TRACE}-{PARENT}-01"})
    rid = r.headers["x-request-id"]
    assert r.status == 200
    assert "trace_id" not in _history_entry(s, name, rid)
    lines = wait_for(lambda: _json_lines(s, rid), "the log line")
    assert all("trace_id" not in line for line in lines)
    s.stop()   # a graceful stop: anything queued anywhere would be exported now
    imports = _imports(log)
    # The probe works in the workers (they import the app after fork) and saw no OpenTelemetry module anywhere.
    assert any(module == "qag.app" and ppid == s.proc.pid for _, ppid, module in imports), imports
    assert not [module for _, _, module in imports if module.startswith("opentelemetry")], imports
    assert len(receiver.requests) == before
