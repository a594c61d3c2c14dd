"""Run history and the event log: run records to compact store rows (written in batches), and the read API.

A run record is `(plan, at, ok, rows, duration_ms, serialization_ms, code, error, done_ns)`, made by the data plane
(api/run.py, through observer.py) and handed to a BatchWriter; `done_ns` (the completion time, Unix nanoseconds)
orders history across workers and instances, and a read first has every worker of the host write its queue
(hostflush.py), so a run is readable from any worker once its response is complete; everything else — interning names, sampling, the ad-hoc SQL policy,
dropping history of a version deleted meanwhile — happens here, on the writer thread. Entries read back follow
contract 8.1 (key order as listed there), prefixed with query, version and kind (8.3).
"""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import json
import logging
from random import SystemRandom
import re
import time

from ..errors import QagError
from ..http.response import json_response
from ..store.schema import RUN_COLUMNS
from . import hostflush
from .events import PAUSE_EVERY, BatchWriter, pause

log = logging.getLogger("qag")

SQL_KEEP = 4000          # characters of ad-hoc SQL kept in history
_TRANSPORTS = {None: "rest", 1: "mcp", 2: "export"}
_CURSOR = re.compile(r"c2\.(\d{1,19})\.(\d{1,18})")  # (seq, id); "c2.": a cursor of completion order
_SEQ = RUN_COLUMNS.index("seq")
_PRUNE_BATCH = 500
# Which successful runs a sampling rate leaves out of history: from the system's generator, so no caller can
# tell which of its runs go unrecorded (Python's own generator makes the request ids every response shows).
_sample = SystemRandom().random
_PRUNE_EVERY = 600.0     # seconds between sweeps of a worker's writer (contract: every 10 minutes)
WRITES_KEPT = 3600       # seconds the store remembers an applied batch's id: a writer retries one for minutes at most


class History:
    """One per worker: the history writer and the reads (which first write what this worker has queued)."""

    def __init__(self, store, settings):
        self.store = store
        self.limit = settings.history_limit
        self.adhoc_limit = settings.history_adhoc_limit
        self.retention_days = settings.history_retention_days
        self.sample_rate = settings.history_sample_rate
        self.adhoc_sql = settings.history_adhoc_sql
        self.events_hours = settings.events_retention_hours
        self.tracing = settings.otel == "on"   # runs carry their request's trace id (contract 8.1 trace_id)
        self.recorded = 0
        self.sampled_out = 0
        self._ids: dict[str, int] = {}
        self.host = hostflush.shared()
        self.writer = BatchWriter("history", self._write, capacity=settings.history_buffer,
                                  interval=settings.history_flush_interval, tick=self.prune, tick_every=_PRUNE_EVERY,
                                  retry=store.unavailable, host=self.host)

    # --- writing (the writer thread) ----------------------------------------------------------------------
    def _write(self, batch: list, batch_id: str) -> None:
        ids = self._ids
        unknown: set[str] = set()
        versions: set[tuple[str, int]] = set()
        for record in batch:
            plan, code = record[0], record[6]
            for name in (plan.connection["name"], plan.key, plan.query, code):
                if name is not None and name not in ids:
                    unknown.add(name)
            if plan.query is not None:
                versions.add((plan.query, plan.version))
        if unknown:
            ids.update(self.store.name_ids(unknown))
        current = self.store.version_uuids(versions) if versions else {}
        rate = self.sample_rate
        tracing = self.tracing
        rows = []
        kept: dict[tuple, list[int]] = {}     # (q, v) -> indexes of rows entering history, oldest first
        sampled = 0
        since_pause = 0
        for plan, at, ok, n, ms, ser, code, err, done_ns in batch:
            since_pause += 1
            if since_pause == PAUSE_EVERY:
                since_pause = 0
                pause()
            query = plan.query
            if query is not None and current.get((query, plan.version)) != plan.uuid:
                keep = 0                      # the version was deleted meanwhile: an event, no history
            elif ok and rate < 1.0 and _sample() >= rate:
                keep = 0
                sampled += 1
            else:
                keep = 1
            rid = plan.request_id
            if rid is not None:
                rid = _packed_id(rid)
            q = None
            sql = extra = None
            if query is None:
                sql, extra = self._adhoc(plan)
            else:
                q = ids[query]
            if ok and plan.masked:
                extra = _with_masked(extra, plan.masked)
            if keep:
                kept.setdefault((q, plan.version), []).append(len(rows))
            trace = None
            if tracing:
                trace = getattr(plan.timing, "trace_id", None)   # 32 hex digits, kept as 16 bytes (text on PostgreSQL)
                if trace is not None:
                    trace = bytes.fromhex(trace)
            rows.append([int(at), keep, q, plan.version, ids[plan.connection["name"]], ids[plan.key], rid,
                         1 if ok else 0, plan.transport, n, None if ms is None else int(ms),
                         None if ser is None else int(ser * 10 + 0.5), None if code is None else ids[code], err,
                         sql, extra, done_ns, trace])
        by_count = self.retention_days is None
        if by_count:
            # Runs this batch already pushes out of history go in as events only: no index churn for them.
            for (q, _v), indexes in kept.items():
                keep_n = self.limit if q is not None else self.adhoc_limit
                if len(indexes) > keep_n:
                    indexes.sort(key=lambda i: rows[i][_SEQ])
                    for i in indexes[:-keep_n]:
                        rows[i][1] = 0
        now = int(time.time())
        self.store.add_runs(rows, limit=self.limit, adhoc_limit=self.adhoc_limit, by_count=by_count,
                            events_since=now - self.events_hours * 3600, pause=pause, batch_id=batch_id)
        self.recorded += sum(len(indexes) for indexes in kept.values())
        self.sampled_out += sampled

    def live_event(self, record) -> tuple[list, bytes]:
        """A queued run record as its live event (contract 8.4, the payload the event log keeps) and the fields
        /events filters on: [key name, status, kind, query, connection]."""
        plan, at, ok, n, ms, ser, code, err, _done = record
        sql = extra = None
        if plan.query is None:
            sql, extra = self._adhoc(plan)
        if ok and plan.masked:
            extra = _with_masked(extra, plan.masked)
        connection = plan.connection["name"]
        payload = event({"query": plan.query, "v": plan.version, "at": int(at), "connection": connection,
                         "rid": plan.request_id, "key_name": plan.key, "tr": plan.transport,
                         "trace": getattr(plan.timing, "trace_id", None) if self.tracing else None,
                         "x": extra, "ok": ok, "n": n,
                         "ms": None if ms is None else int(ms), "ser": None if ser is None else int(ser * 10 + 0.5),
                         "err": err, "code": code, "sql": sql})
        meta = [plan.key, "success" if ok else "error", payload["kind"], plan.query, connection]
        return meta, json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")

    def _adhoc(self, plan) -> tuple[str | None, str]:
        extra: dict = {"p": sorted(plan.values) if isinstance(plan.values, dict) else []}
        if plan.database is not None:
            extra["d"] = plan.database
        sql = None
        if self.adhoc_sql == "text":
            sql = plan.sql[:SQL_KEEP]
            if len(plan.sql) > SQL_KEEP:
                extra["t"] = 1
        elif self.adhoc_sql == "hash":
            sql = hashlib.sha256(plan.sql.encode("utf-8", "surrogatepass")).hexdigest()
            extra["h"] = 1
        return sql, json.dumps(extra, separators=(",", ":"), ensure_ascii=False)

    def prune(self) -> int:
        """Sweep events past their retention (and history past QAG_HISTORY_RETENTION_DAYS) in small batches."""
        now = int(time.time())
        since = now - self.retention_days * 86400 if self.retention_days is not None else None
        total = 0
        self.store.prune_writes(now - WRITES_KEPT)
        while True:
            changed = self.store.prune_runs(events_since=now - self.events_hours * 3600, history_since=since,
                                            batch=_PRUNE_BATCH)
            total += changed
            if changed < _PRUNE_BATCH:
                return total
            time.sleep(0.01)  # let request threads and other writers in between batches

    # --- reading ------------------------------------------------------------------------------------------
    def flush_host(self, block: bool = True) -> None:
        """Every run completed on this host so far is in the store: this worker's queue written here, every other
        worker's by its writer thread (waited for, at most hostflush.WAIT seconds). block=False: this worker's
        own queue only unless its writer is idle (see BatchWriter.flush)."""
        host = self.host
        number = host.request() if host is not None else 0
        self.writer.flush(block=block)
        if host is not None and not host.wait(number):
            log.warning("history: a read went ahead after %.0f s without every worker's queued runs", hostflush.WAIT)

    def stats(self, query: str | None = None) -> dict:
        """{query: (last_used_at text, {version: run_count})} from stored history, after every worker's queue."""
        self.flush_host(block=False)
        return {name: (local_text(last), counts) for name, (last, counts) in self.store.run_stats(query).items()}

    def read(self, args: dict, query: str | None, default_limit: int) -> dict:
        # An empty filter (`?status=`, a form's unset field) is no filter, as QueryAPIGate reads it: not a 400, and
        # not a match on "" either.
        args = {name: value for name, value in args.items() if value != ""}
        where = _filters(args, query)
        limit = _limit(args.get("limit"), default_limit)
        before = _cursor(args["cursor"]) if "cursor" in args else None
        self.flush_host()
        rows = self.store.history(where, before, limit + 1)
        more = len(rows) > limit
        rows = rows[:limit]
        cursor = _make_cursor(rows[-1]) if more and rows else None
        return {"items": [entry(r) for r in rows], "next_cursor": cursor}


def entry(row: dict) -> dict:
    """A stored run as contract 8.1/8.3 shows it."""
    saved = row["query"] is not None
    out = {"query": row["query"], "version": row["v"], "kind": "saved" if saved else "adhoc",
           "executed_at": local_text(row["at"]), "connection_name": row["connection"],
           "request_id": row["rid"].hex() if isinstance(row["rid"], bytes) else row["rid"],
           "key_name": row["key_name"], "transport": _TRANSPORTS.get(row["tr"], "rest")}
    trace = row.get("trace")
    if trace is not None:
        out["trace_id"] = trace.hex() if isinstance(trace, bytes) else trace
    extra = json.loads(row["x"]) if row["x"] else {}
    if "d" in extra:
        out["database"] = extra["d"]
    out["status"] = "success" if row["ok"] else "error"
    if row["n"] is not None:
        out["rows"] = row["n"]
    if row["ms"] is not None:
        out["duration_ms"] = row["ms"]
    if row["ser"] is not None:
        out["serialization_ms"] = row["ser"] / 10
    if "m" in extra:
        out["masked"] = [{"column": c, "action": a, "source": s} for c, a, s in extra["m"]]
    if not row["ok"]:
        out["error"] = row["err"]
        out["code"] = row["code"]
    if row["sql"] is not None:
        if extra.get("h"):
            out["sql_sha256"] = row["sql"]
        else:
            out["sql"] = row["sql"]
            if extra.get("t"):
                out["sql_truncated"] = True
    if not saved:
        out["params"] = extra.get("p", [])
    return out


def _packed_id(rid: str):
    """A request id of 12 lowercase hex digits (qag's own) as its 6 bytes; any other as it is. Exactly those
    read back as themselves from the bytes (whitespace or capitals would not): cheaper than a regex match."""
    if len(rid) != 12:
        return rid
    try:
        packed = bytes.fromhex(rid)
    except ValueError:
        return rid
    return packed if packed.hex() == rid else rid


def _with_masked(extra: str | None, masked: list) -> str:
    """Rare-fields JSON plus `m`: what masking changed, as [column, action, source] triples (contract 8.1)."""
    fields = json.loads(extra) if extra else {}
    fields["m"] = [[m["column"], m["action"], m["source"]] for m in masked]
    return json.dumps(fields, separators=(",", ":"), ensure_ascii=False)


def event(row: dict) -> dict:
    """A stored run as the event log's payload (contract 8.4)."""
    e = entry(row)
    body = {k: v for k, v in e.items() if k not in ("query", "version", "kind")}
    return {"type": "query.run", "source": e["transport"], "occurred_at": e["executed_at"], "kind": e["kind"],
            "query": e["query"], "version": e["version"], "connection_name": e["connection_name"], "entry": body}


def local_text(at: int | None) -> str | None:
    return None if at is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def _when(text: str, name: str) -> int:
    for fmt in ("%Y-%m-%d", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S"):
        try:
            moment = _dt.datetime.strptime(text, fmt)
        except ValueError:
            continue
        try:
            return int(time.mktime(moment.timetuple()))
        except (OverflowError, ValueError):
            break
    raise QagError("invalid_filter", f"{name} must be YYYY-MM-DD or YYYY-MM-DD HH:MM:SS")


def _filters(args: dict, query: str | None) -> dict:
    where: dict = {}
    status = args.get("status")
    if status is not None:
        if status not in ("success", "error"):
            raise QagError("invalid_filter", "status must be success or error")
        where["ok"] = status == "success"
    if query is None:
        kind = args.get("kind")
        if kind is not None:
            if kind not in ("saved", "adhoc"):
                raise QagError("invalid_filter", "kind must be saved or adhoc")
            where["kind"] = kind
        if "query" in args:
            where["query"] = args["query"]
    else:
        where["query"] = query
    if "version" in args:
        text = args["version"]
        if not re.fullmatch(r"-?\d{1,18}", text.strip()):
            raise QagError("invalid_request", "version must be an integer")
        where["version"] = int(text)
    if "key" in args:
        where["key"] = args["key"]
    for name in ("since", "until"):
        if name in args:
            where[name] = _when(args[name], name)
    return where


def _limit(text: str | None, default: int) -> int:
    if text is None:
        return default
    if not re.fullmatch(r"\d{1,4}", text.strip()) or not 1 <= int(text) <= 1000:
        raise QagError("invalid_filter", "limit must be a whole number from 1 to 1000")
    return int(text)


def _make_cursor(row: dict) -> str:
    return base64.urlsafe_b64encode(f"c2.{row['seq']}.{row['id']}".encode("ascii")).decode("ascii").rstrip("=")


def _cursor(text: str) -> tuple[int, int]:
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode("ascii")
    except (ValueError, UnicodeDecodeError):
        raw = ""
    m = _CURSOR.fullmatch(raw)
    if m is None or int(m.group(1)) >= 1 << 63:   # beyond a 64-bit store integer: never one given out
        raise QagError("invalid_filter", "cursor is not one this server gave out")
    return int(m.group(1)), int(m.group(2))


class HistoryHandlers:
    """GET /api/v1/history and GET /api/v1/queries/<name>/history (contract 8.3), administrators only."""

    def __init__(self, gateway, history: History):
        self.store = gateway.store
        self.history = history

    def register(self, router) -> None:
        router.add("GET", "/api/v1/history", self.list_all, "v1.search_history", admin=True)
        router.add("GET", "/api/v1/queries/<name>/history", self.list_query, "v1.query_history", admin=True)

    def list_all(self, request, caller):
        return json_response(self.history.read(request.args, None, 100))

    def list_query(self, request, caller, name):
        if self.store.get_query_head(name) is None:
            raise QagError("query_not_found", f"Saved query '{name}' not found")
        return json_response(self.history.read(request.args, name, 50))
