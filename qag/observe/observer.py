"""The Observer a gateway hands its requests and runs to: recording without slowing a call.

The hot path calls `request()` once per response and `begin()` + one of `done()`/`failed()`/`streamed()` per
executed run (`refused()` alone for a run refused at its connection). Each is a handful of dict and list
operations and deque appends: metrics count into per-thread shards (metrics.py), run records go to the history
writer's bounded buffer (events.py, history.py), log lines to the log writer's queue (logs.py). Background threads
per worker do the rest. `close()` flushes everything (gunicorn worker_exit, or process exit).
"""

from __future__ import annotations

import atexit
import time
import weakref

from .. import _speedups
from ..version import __version__
from .history import History, HistoryHandlers
from .live import LiveEvents
from .logs import LogWriter
from .metrics import Metrics

# A run's completion time orders history across workers (one clock per host) and instances (clocks kept in step).
_now_ns = time.time_ns
QUIET_ENDPOINTS = frozenset({"api.health", "api.metrics_endpoint", "api.livez", "api.readyz"})

_open: "weakref.WeakSet[Observer]" = weakref.WeakSet()


class Observer:
    """One per gateway (per worker)."""

    def __init__(self, gateway):
        settings = gateway.settings
        self.gateway = gateway
        self.history = History(gateway.store, settings)
        self.logs = LogWriter(settings)
        self.metrics = Metrics(self._more)
        self.handlers = HistoryHandlers(gateway, self.history)
        # The two queues a call feeds, held here: one attribute read each per call, not two and a call.
        self._runs = self.history.writer
        self._lines = self.logs.buffer
        relay = None
        if settings.redis_url:
            from .live_redis import Relay
            relay = Relay(settings.redis_url, gateway.redis.prefix)
        self.live = LiveEvents(settings.events_ring_bytes, settings.events_max_streams, relay)
        self.log_requests = settings.log_requests
        self.log_statements = settings.log_requests and settings.log_statements   # one line a request by default
        self.slow_ms = settings.slow_query_threshold * 1000.0 if settings.slow_query_threshold else None
        # OpenTelemetry (QAG_OTEL): its packages are imported here, in the worker, and only when tracing is on.
        self.tracing = None
        if settings.otel == "on":
            from .tracing import Tracing
            self.tracing = Tracing(gateway)
        self._closed = False
        _open.add(self)

    def register(self, router) -> None:
        self.handlers.register(router)

    # --- hot path -----------------------------------------------------------------------------------------
    def request(self, method: str, endpoint: str, status: int, key: str, seconds: float, request_id: str,
                path: str, at: float, trace_id: str | None = None) -> None:
        self.metrics.request(method, endpoint, status, key, seconds)
        if self.log_requests and self.logs.enabled and endpoint not in QUIET_ENDPOINTS:
            self._lines.put(("req", at, request_id, key, method, path, status, seconds * 1000.0, trace_id))

    def begin(self) -> None:
        self.metrics.begin()

    def done(self, plan, at: float, rows: int, duration_ms: float, encode_seconds: float) -> None:
        conn = plan.connection
        self.metrics.run(conn["name"], conn["db"], True, plan.key, rows, duration_ms / 1000.0, plan.fmt,
                         encode_seconds)
        # serialization_ms is a saved query's (contract 8.1): QueryAPIGate records none for an ad-hoc run.
        record = (plan, at, True, rows, duration_ms, None if plan.query is None else encode_seconds * 1000.0, None,
                  None, _now_ns())
        self._runs.put(record)
        if self.tracing is not None and plan.timing is not None:
            plan.timing.ran(plan, rows, None)   # the database span's attributes
        if self.live.listening():
            self._publish(record)
        self._log_run(plan, at, duration_ms)

    def failed(self, plan, at: float, error, rows: int | None = None) -> None:
        conn = plan.connection
        self.metrics.run(conn["name"], conn["db"], False, plan.key, rows or 0, None)
        if plan.stream:
            self.metrics.stream(conn["name"], conn["db"], "error", plan.key)
        record = (plan, at, False, rows, None, None, error.code, error.message, _now_ns())
        self._runs.put(record)
        if self.tracing is not None and plan.timing is not None:
            plan.timing.ran(plan, rows, error)
        if self.live.listening():
            self._publish(record)
        self._log_run(plan, at, None)

    def refused(self, plan, at: float, error) -> None:
        """A run refused at its connection (api/run.py _refused): its history entry and event only. No database
        was reached: no run metrics (their labels name the connection's engine), no span, no log line."""
        record = (plan, at, False, None, None, None, error.code, error.message, _now_ns())
        self._runs.put(record)
        if self.live.listening():
            self._publish(record)

    def streamed(self, plan, at: float, rows: int, truncated: bool) -> None:
        conn = plan.connection
        self.metrics.run(conn["name"], conn["db"], True, plan.key, rows, None)
        self.metrics.stream(conn["name"], conn["db"], "truncated" if truncated else "success", plan.key)
        record = (plan, at, True, rows, None, None, None, None, _now_ns())
        self._runs.put(record)
        if self.live.listening():
            self._publish(record)
        self._log_run(plan, at, None)

    def _publish(self, record) -> None:
        """A run's live event, for the host's /events streams (only while one is open: listening())."""
        self.live.publish(*self.history.live_event(record))

    def _log_run(self, plan, at: float, duration_ms: float | None) -> None:
        if not self.logs.enabled:
            return
        if self.log_statements:
            self._lines.put(("exec", at, plan, self._logged_sql(plan)))
        if duration_ms is not None and self.slow_ms is not None and duration_ms >= self.slow_ms:
            self._lines.put(("slow", at, plan, duration_ms))

    def _logged_sql(self, plan) -> str:
        if plan.query is None and self.history.adhoc_sql != "text":
            import hashlib
            return f"(text not logged; sha256 {hashlib.sha256(plan.sql.encode('utf-8', 'surrogatepass')).hexdigest()})"
        return plan.sql

    # --- metrics of the other parts -----------------------------------------------------------------------
    def _more(self) -> tuple[dict, dict]:
        history = self.history
        writer = history.writer
        counters = {"history": {"recorded": history.recorded, "sampled_out": history.sampled_out,
                                "dropped": writer.dropped, "failed": writer.failed},
                    "log_dropped": self.logs.buffer.dropped, "pool_waits": {}}
        stats = getattr(self.gateway, "limit_stats", None)
        if stats is not None:
            counters["rate_limit"] = {"rejections": stats.rejections, "fallbacks": stats.fallbacks}
        pools: dict = {}
        waiting: dict = {}
        # The backends this worker has loaded (a driver is imported on first use only).
        for db, backend in list(getattr(self.gateway.backends, "_backends", {}).items()):
            pool = getattr(backend, "pool", None)
            if pool is None:
                continue
            stats = pool.stats()
            pools[db] = [stats["idle"], stats["active"]]
            counters["pool_waits"][db] = stats["waits"]
            for name, n in stats["waiting"].items():
                waiting[name] = waiting.get(name, 0) + n
        gauges = {"history_pending": writer.pending, "history_capacity": writer.capacity, "pools": pools,
                  "pool_waiting": waiting}
        metadata = getattr(self.gateway, "metadata", None)
        if metadata is not None:
            more_c, more_g = metadata.cache_stats()
            counters.update(more_c)
            gauges.update(more_g)
        cache = getattr(self.gateway, "response_cache", None)
        if cache is not None:
            gauges["cache_entries"] = cache.local_count
        live = self.live
        counters["events"] = {"delivered": live.delivered, "dropped_streams": live.dropped_streams}
        gauges["events_streams"] = live.open_streams
        return counters, gauges

    def scrape(self) -> bytes:
        from . import metrics, process
        settings = self.gateway.settings
        build = {"version": __version__, "speedups": _speedups.mode(),
                 "worker_class": settings.worker_class if metrics.SHARED_DIR is not None else "none"}
        figures = process.figures(process.instance_pids(metrics.SHARED_DIR is not None))
        return metrics.render(self.metrics.instance(), _speedups.choices(), build, figures)

    # --- shutdown -----------------------------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.live.stop()
        self.history.writer.close()
        self.metrics.close()
        if self.tracing is not None:
            self.tracing.close()   # before the log writer: what the SDK says while it exports goes to qag's lines
        self.logs.close()


@atexit.register
def _close_all() -> None:
    """Process exit without gunicorn's worker_exit (in-process use): flush what is queued."""
    for observer in list(_open):
        try:
            observer.close()
        except Exception:
            pass
