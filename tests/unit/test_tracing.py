"""Tracing (QAG_OTEL) in-process: how the switch resolves with the OTEL_* variables, the trace id in plain and JSON
log lines, and in run history on both stores (the run row's trace column), spans sent to a real OTLP/HTTP receiver
when the gateway closes; the SDK's warnings as rate-limited qag lines; the cache stage and a failed database call in
Server-Timing."""

from __future__ import annotations

import io
import json
import logging
import re
from importlib import metadata

import pytest

from qag.observe.logs import LogWriter
from qag.settings import SettingsError, load
from tests.unit.test_observe_history import App

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def _otel(**env) -> str:
    return load({"QAG_HOME": "/tmp", **env}).otel


def test_tracing_is_off_unless_an_otlp_endpoint_or_qag_otel_says_on():
    pytest.importorskip("opentelemetry.sdk", reason="on needs the otel extra (pip install 'qag[otel]')")
    assert _otel() == "off"
    assert _otel(OTEL_EXPORTER_OTLP_ENDPOINT="http://collector:4318") == "on"
    assert _otel(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="http://collector:4318/v1/traces") == "on"
    assert _otel(QAG_OTEL="on") == "on"
    assert _otel(QAG_OTEL="off", OTEL_EXPORTER_OTLP_ENDPOINT="http://collector:4318") == "off"
    # The SDK's own switches turn it off whatever QAG_OTEL says.
    assert _otel(QAG_OTEL="on", OTEL_SDK_DISABLED="true") == "off"
    assert _otel(QAG_OTEL="on", OTEL_TRACES_EXPORTER="none") == "off"
    assert _otel(QAG_OTEL="on", OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf") == "on"


@pytest.mark.parametrize("env, said", [
    ({"QAG_OTEL": "maybe"}, "QAG_OTEL must be one of auto, on or off"),
    ({"QAG_OTEL": "on", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "http/protobuf"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}, "port 4318"),
    ({"QAG_OTEL": "on", "OTEL_TRACES_EXPORTER": "zipkin"}, "OTLP/HTTP only"),
])
def test_what_qag_cannot_export_stops_startup_in_one_line(env, said):
    with pytest.raises(SettingsError) as caught:
        load({"QAG_HOME": "/tmp", **env})
    assert said in str(caught.value) and "\n" not in str(caught.value)


def test_a_missing_sdk_is_named_with_the_extra_to_install(monkeypatch):
    real = metadata.version

    def version(name):
        if name == "opentelemetry-sdk":
            raise metadata.PackageNotFoundError(name)
        return real(name)
    monkeypatch.setattr(metadata, "version", version)
    with pytest.raises(SettingsError, match=r"opentelemetry-sdk is not installed: pip install 'qag\[otel\]', or "
                                            r"set QAG_OTEL=off"):
        load({"QAG_HOME": "/tmp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert _otel() == "off"   # off, nothing is looked for


def test_log_lines_carry_the_trace_id_when_there_is_one():
    for json_logs in ("0", "1"):
        out = io.StringIO()
        w = LogWriter(load({"QAG_HOME": "/tmp", "QAG_JSON_LOGS": json_logs}))
        w.install(out)
        w.put(("req", 0.0, "abc123", "admin", "GET", "/q/films", 200, 2.14, TRACE))
        w.put(("req", 0.0, "abc124", "admin", "GET", "/q/films", 200, 2.14, None))
        w.close()
        traced, untraced = out.getvalue().splitlines()
        if json_logs == "1":
            traced, untraced = json.loads(traced), json.loads(untraced)
            assert list(traced)[:7] == ["time", "level", "logger", "request_id", "key", "trace_id", "message"]
            assert traced["trace_id"] == TRACE and "trace_id" not in untraced
        else:
            assert traced.endswith(f" INFO qag [abc123 key=admin trace={TRACE}]: GET /q/films -> 200 in 2.1ms")
            assert untraced.endswith(" INFO qag [abc124 key=admin]: GET /q/films -> 200 in 2.1ms")


@pytest.fixture
def receiver():
    pytest.importorskip("opentelemetry.proto", reason="the otel extra (pip install 'qag[otel]')")
    from tests.otlp import Receiver
    r = Receiver()
    yield r
    r.close()


def test_runs_keep_their_trace_id_on_both_stores_and_spans_reach_the_receiver(tmp_path, store_env, receiver,
                                                                              monkeypatch):
    # The SDK reads its OTEL_* variables from the process environment, as it does in a served worker.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "60000")   # nothing sent before close(): it flushes
    a = App(str(tmp_path), store_env, QAG_OTEL="on")
    try:
        a.query("traced")
        status, headers, _ = a.run("traced", headers={"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"})
        assert status == 200
        rid = headers["x-request-id"]
        _, _, untraced = a.run("traced")
        status, _, body = a.history(path="/api/v1/queries/traced/history")
        by_rid = {item["request_id"]: item for item in body["items"]}
        assert by_rid[rid]["trace_id"] == TRACE
        others = [item["trace_id"] for r, item in by_rid.items() if r != rid]
        assert len(others) == 1 and re.fullmatch(r"[0-9a-f]{32}", others[0]) and others[0] != TRACE
        assert receiver.spans() == []
    finally:
        a.gateway.close()
    spans = receiver.spans()   # sent by close(), which every worker's exit calls
    roots = [s for s in spans if s["attributes"].get("qag.request_id") == rid]
    assert len(roots) == 1 and roots[0]["trace"] == TRACE and roots[0]["parent"] == "00f067aa0ba902b7"
    assert {s["name"] for s in spans if s["parent"] == roots[0]["id"]} == {"auth", "policy", "bind", "database",
                                                                           "encode"}


def test_server_timing_names_the_cache_and_a_failed_database_call(tmp_path):
    a = App(str(tmp_path), QAG_SERVER_TIMING="1")
    try:
        a.query("cached", cache_ttl=60)
        stages = [re.findall(r"(\w+);dur=", a.run("cached")[1]["server-timing"]) for _ in range(2)]
        assert stages[0] == ["auth", "bind", "policy", "cache", "query", "encode"]   # the miss
        assert stages[1] == ["auth", "bind", "policy", "cache"]                      # the hit
        status, headers, _ = a.call("POST", "/execute_sql", {"sql": "SELECT * FROM nowhere", "connection_name": "lite"})
        assert status >= 400 and "query;dur=" in headers["server-timing"]
    finally:
        a.gateway.close()


def test_a_full_span_queue_is_one_qag_warning_not_one_per_span(tmp_path, receiver, monkeypatch, caplog):
    """The SDK logs each span it drops from a full queue; qag passes one line a minute on, as its own."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "60000")
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "4")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4")
    a = App(str(tmp_path), QAG_OTEL="on")
    try:
        a.query("busy")
        with caplog.at_level(logging.WARNING, logger="qag"):
            for _ in range(5):
                assert a.run("busy")[0] == 200   # 8 spans a call into a queue of 4
        said = [r.getMessage() for r in caplog.records if r.name == "qag" and "OpenTelemetry:" in r.getMessage()]
        assert len(said) == 1 and "Queue full" in said[0], said
    finally:
        a.gateway.close()
