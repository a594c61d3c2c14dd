"""OpenTelemetry tracing of a worker's requests (QAG_OTEL); imported only when tracing is on.

A request's root span (kind SERVER) starts when the request arrives, as the child of an incoming W3C
`traceparent` (with its `tracestate`) when there is one, so its trace id is known to the call's run history and
log lines. The stage spans (auth, bind, policy, cache, database, encode) are not instrumented a second time: they
are made once the response is complete, from the marks the pipeline already sets for Server-Timing
(environ["qag.timing"], a RecordedStages here), each a child of the root with the start and end those marks give. A
stage measured in parts (policy and bind are measured before and after the connection is known; cache before and
after the run) is one span per part, so no span covers another stage's time.

The SDK's BatchSpanProcessor exports the spans over OTLP/HTTP from a thread of its own. A Tracing is made by the
worker's Gateway, after gunicorn forked the worker: no span, processor or thread crosses a fork. Configuration is
the SDK's own OTEL_* variables (endpoint, headers, timeout, compression, sampler, batch sizes, service name,
resource attributes, propagators).

Never in a span: API keys, passwords, parameter values, the query string, driver error text. SQL as the log lines
carry it: a saved statement as written (placeholders, no values), ad-hoc SQL per QAG_HISTORY_ADHOC_SQL (the text,
its SHA-256, or nothing).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time

from opentelemetry import propagate
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.propagators.textmap import Getter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode

from ..version import __version__
from .observer import QUIET_ENDPOINTS
from .stages import Stages

log = logging.getLogger("qag")
SQL_KEEP = 4000   # characters of SQL in db.query.text, as history keeps of ad-hoc SQL
# Server-Timing's stage names -> span names ("query" is the database's time in the header).
_SPAN_NAMES = {"auth": "auth", "bind": "bind", "policy": "policy", "cache": "cache", "query": "database",
               "encode": "encode"}
_UNSET = Status(StatusCode.UNSET)
_DB_SYSTEMS = {"sqlite": "sqlite", "postgres": "postgresql", "postgresql": "postgresql", "mysql": "mysql",
               "mariadb": "mariadb"}


class _EnvironGetter(Getter):
    """W3C headers read from a WSGI environ (HTTP_TRACEPARENT, HTTP_TRACESTATE, ...)."""

    def get(self, carrier: dict, key: str):
        value = carrier.get("HTTP_" + key.upper().replace("-", "_"))
        return None if value is None else [value]

    def keys(self, carrier: dict) -> list[str]:
        return [k[5:].lower().replace("_", "-") for k in carrier if k.startswith("HTTP_")]


_ENVIRON = _EnvironGetter()


class TracedStages(Stages):
    """A traced request's Stages: its root span and trace id (for log lines and history). As such, an unsampled
    request's: its marks are plain dict stores, as with Server-Timing alone, since no span will be made of them."""

    __slots__ = ("root", "trace_id")

    def __init__(self, root, trace_id: str):
        super().__init__()
        self.root = root
        self.trace_id = trace_id

    def ran(self, plan, rows: int | None, error) -> None:
        """The observer's word that this request ran `plan`: only a sampled request's spans describe it."""


class RecordedStages(TracedStages):
    """A sampled request's Stages, which also keep when each mark was set (perf_counter) for the stage spans, and
    what the run was (set by the observer when the call ran a query)."""

    __slots__ = ("marks", "t0", "wall0", "plan", "rows", "error")

    def __init__(self, root, trace_id: str, t0: float, wall0: int):
        super().__init__(root, trace_id)
        self.t0 = t0          # perf_counter() and time_ns() read together, to place marks on the wall clock
        self.wall0 = wall0
        self.marks: list[tuple] = []   # (stage, ended at (perf_counter), seconds, error or None)
        self.plan = None
        self.rows = None
        self.error = None

    def __setitem__(self, name: str, value: float) -> None:
        # Every stage mark is `timing[name] = seconds` (or its running total): the part just measured ended now.
        delta = value - self.get(name, 0.0)
        dict.__setitem__(self, name, value)
        self.marks.append((name, time.perf_counter(), delta, None))

    def failed(self, name: str, mark: float, error) -> None:
        now = time.perf_counter()
        dict.__setitem__(self, name, self.get(name, 0.0) + now - mark)
        self.marks.append((name, now, now - mark, error))

    def ran(self, plan, rows: int | None, error) -> None:
        self.plan, self.rows, self.error = plan, rows, error

    def wall(self, at: float) -> int:
        return self.wall0 + int((at - self.t0) * 1e9)


class _SdkLog(logging.Handler):
    """The SDK's own log records as qag's log lines (so JSON mode stays JSON), each message at most once a minute
    with how many were held back: a full queue logs a record per span it drops, on the request thread."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.last: dict[str, list] = {}   # message template -> [when last logged (monotonic), held back since]

    def handle(self, record: logging.LogRecord) -> bool:   # no handler lock: a race repeats a line, nothing worse
        if record.levelno < self.level:
            return False
        now = time.monotonic()
        seen = self.last.get(record.msg)
        if seen is not None and now - seen[0] < 60.0:
            seen[1] += 1
            return False
        held = seen[1] if seen is not None else 0
        self.last[record.msg] = [now, 0]
        log.log(record.levelno, "OpenTelemetry: %s%s", record.getMessage(),
                f" ({held} more like it since the last one)" if held else "", exc_info=record.exc_info)
        return True

    def emit(self, record: logging.LogRecord) -> None:
        self.handle(record)


def _route_sdk_log() -> None:
    sdk = logging.getLogger("opentelemetry")
    if not any(isinstance(h, _SdkLog) for h in sdk.handlers):   # once per process, however many gateways
        sdk.addHandler(_SdkLog())
        sdk.propagate = False


class Tracing:
    """One per worker (made by its Observer): the tracer provider, its exporter thread, and the request spans."""

    def __init__(self, gateway):
        settings = gateway.settings
        self.gateway = gateway
        self.adhoc_sql = settings.history_adhoc_sql
        _route_sdk_log()
        self.provider = TracerProvider(resource=_resource(), shutdown_on_exit=False)  # Observer.close() ends it
        self.processor = BatchSpanProcessor(OTLPSpanExporter())
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer("qag", __version__)
        self.new_span_id = self.provider.id_generator.generate_span_id
        # The environ keys of the headers the propagators read (OTEL_PROPAGATORS; W3C trace context and baggage by
        # default): a request with none of them starts a trace without asking them.
        self.carried = frozenset("HTTP_" + f.upper().replace("-", "_") for f in propagate.get_global_textmap().fields)

    # --- a request ----------------------------------------------------------------------------------------
    def begin(self, environ: dict) -> TracedStages:
        """The request's root span, continuing the caller's trace when its headers carry one."""
        parent = propagate.extract(environ, getter=_ENVIRON) if not self.carried.isdisjoint(environ) else None
        wall0 = time.time_ns()
        t0 = time.perf_counter()
        root = self.tracer.start_span(environ.get("REQUEST_METHOD", "GET"), context=parent, kind=SpanKind.SERVER,
                                      start_time=wall0)
        trace_id = format(root.get_span_context().trace_id, "032x")
        if not root.is_recording():   # not sampled: the trace id is all the request needs
            return TracedStages(root, trace_id)
        return RecordedStages(root, trace_id, t0, wall0)

    def end(self, stages: TracedStages | RecordedStages, request, response, environ: dict) -> None:
        """Name and describe the root span, make the stage spans from the marks, and end them all (the exporter
        thread sends them). A stream's rows leave after this: its root span ends when its response starts."""
        try:
            self._end(stages, request, response, environ)
        except Exception:   # a span never costs the caller the response already started
            log.exception("tracing: the spans of request %s could not be made", request.request_id)

    def _end(self, stages: TracedStages, request, response, environ: dict) -> None:
        if type(stages) is TracedStages:   # not sampled: nothing to describe, nothing exported
            return
        root = stages.root
        endpoint = environ.get("qag.endpoint")
        if endpoint in QUIET_ENDPOINTS:
            return   # health checks and scrapes make no spans, as they make no log lines: never ended, never sent
        status = response.status
        route = None
        if endpoint not in (None, "preflight") and request.path:
            found = self.gateway.router.lookup_public(request.segments)
            if found is not None:
                route = "/" + "/".join(f"{{{s[1:-1].rpartition(':')[2]}}}" if s.startswith("<") else s
                                       for s in found.template)
        root.update_name(f"{request.method} {route}" if route else request.method)
        attributes = {"http.request.method": request.method, "url.path": request.path or environ.get("PATH_INFO", ""),
                      "url.scheme": "https" if request.https else "http", "http.response.status_code": status,
                      "qag.request_id": request.request_id, "qag.caller": environ.get("qag.key", "-"),
                      "qag.endpoint": endpoint or "unmatched"}
        if route:
            attributes["http.route"] = route
        if request.peer:
            attributes["client.address"] = request.peer
        if status >= 400:
            code = _error_code(response)
            if code:
                attributes["qag.error.code"] = code
            if status >= 500:   # a 4xx is the caller's doing, not the server's failure (semantic conventions)
                attributes["error.type"] = code or str(status)
                root.set_status(Status(StatusCode.ERROR, code or str(status)))
        root.set_attributes(attributes)
        # The stage spans are finished spans from the start: made as the SDK's ReadableSpan and handed to the batch
        # processor, as Span.end() does, without the life cycle of a live span (sampler, locks, limits) that costs
        # ~10 µs a span on the request thread. They belong to the root's trace and share its sampling decision,
        # trace state, resource and scope, as the SDK's own children of a sampled span would.
        context = root.get_span_context()
        trace_id, flags, state = context.trace_id, context.trace_flags, context.trace_state
        resource, scope, new_span_id, emit = root.resource, root.instrumentation_scope, self.new_span_id, \
            self.processor.on_end
        plan = stages.plan
        for stage, ended, seconds, error in stages.marks:
            name = _SPAN_NAMES.get(stage)
            if name is None:
                continue
            attributes = None
            status = _UNSET
            if stage == "query" and plan is not None:
                attributes = self._database(plan, stages.rows if error is None else None)
            if error is not None:
                attributes = {**(attributes or {}), "error.type": error.code}
                status = Status(StatusCode.ERROR, error.code)
            emit(ReadableSpan(name, SpanContext(trace_id, new_span_id(), False, flags, state), context, resource,
                              attributes, kind=SpanKind.CLIENT if stage == "query" else SpanKind.INTERNAL,
                              status=status, start_time=stages.wall(ended - seconds), end_time=stages.wall(ended),
                              instrumentation_scope=scope))
        root.end()

    def _database(self, plan, rows: int | None) -> dict:
        conn = plan.connection
        out = {"db.system.name": _DB_SYSTEMS.get(conn["db"], conn["db"]), "qag.connection": conn["name"],
               "qag.run": "saved" if plan.query is not None else "adhoc"}
        if plan.query is not None:
            out["qag.query"] = plan.query
            out["qag.query.version"] = plan.version
            out["db.query.text"] = plan.sql[:SQL_KEEP]
        elif self.adhoc_sql == "text":
            out["db.query.text"] = plan.sql[:SQL_KEEP]
        elif self.adhoc_sql == "hash":
            out["qag.sql_sha256"] = hashlib.sha256(plan.sql.encode("utf-8", "surrogatepass")).hexdigest()
        if rows is not None:
            out["db.response.returned_rows"] = rows
        return out

    # --- the worker's end -----------------------------------------------------------------------------------
    def flush(self, timeout_ms: int = 30_000) -> bool:
        return self.provider.force_flush(timeout_ms)

    def close(self) -> None:
        """Export what is queued (bounded by OTEL_EXPORTER_OTLP_TIMEOUT) and stop the exporter thread."""
        self.provider.shutdown()


def _resource() -> Resource:
    """The SDK's resource (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES), named `qag` where those name nothing."""
    resource = Resource.create({})
    attributes = dict(resource.attributes)
    defaults = {"service.version": __version__}
    if str(attributes.get("service.name", "")).startswith("unknown_service"):   # the SDK's placeholder
        del attributes["service.name"]
        defaults["service.name"] = "qag"
    return Resource(defaults).merge(Resource(attributes, resource.schema_url))


def _error_code(response) -> str | None:
    """The `code` of an error body (the contract's envelope and RFC 9457's problem details both carry it)."""
    body = response.body
    if not isinstance(body, bytes) or not body.startswith(b"{"):
        return None
    try:
        code = json.loads(body).get("code")
    except ValueError:
        return None
    return code if isinstance(code, str) else None
