"""Counters and histograms, recorded without locks and summed across every worker of the instance.

Each request thread counts into its own shard (a few dict and list operations, no lock: only that thread writes
its shard). A worker's snapshot thread sums its shards a few times a second and writes the totals to a file of
its own (`w<pid>-<start>.m`) in a folder the gunicorn master creates before forking (`start_instance()`,
gunicorn_conf.on_starting); the file is replaced atomically (write, then rename), so a reader never sees half of
one. The master folds the counters of each worker that exits into `retired.m` and lists the file it absorbed
there before removing it (`retire_worker()`, gunicorn_conf.child_exit), so totals survive worker recycling.

Summed counters never go back, whichever worker answers: GET /metrics first publishes the answering worker's
own snapshot, then reads only published figures (every worker's file, then `retired.m`, skipping files it says
it absorbed). Each file only grows, and whatever one reply showed of a worker is in its file for every later
reply. A worker killed with SIGKILL keeps what it last published (at most a quarter second is lost, never
shown). Gauges are summed over live workers only. Without the master's folder (in-process use) the figures are
this process's own.

The management API's usage counters per connection and API key (api/_usage.py) are counted into the same
shards, published in the same files and folded into retired.m with the rest, so they too are the instance's.

Labels are bounded: method (known verbs, else OTHER), endpoint (route names), status, key and connection names
(objects an administrator creates), dialect, format.
"""

from __future__ import annotations

import logging
import marshal
import os
import shutil
import tempfile
import threading
import time
import weakref

BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_NB = len(BOUNDS) + 1
_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})
_SNAPSHOT_EVERY = 0.25
_RETIRED = "retired.m"
_ABSORBED_KEPT = 256    # names of absorbed worker files retired.m lists
_FOLDER_PREFIX = "qag-metrics-"
# The counter tables of a shard, in the snapshot's "c" under the same names; usage_conn and usage_key are
# api/_usage.py's (connection name -> [queries, errors, rows, total_ms], key name -> [queries, errors, rows]).
_COUNTERS = ("req", "qry", "ser", "exp", "cache", "usage_conn", "usage_key")

SHARED_DIR: str | None = None   # set in the gunicorn master before fork; workers inherit it

_all: "weakref.WeakSet[Metrics]" = weakref.WeakSet()


def _after_fork() -> None:
    for m in list(_all):
        m._started = False   # the snapshot thread did not come along: start one on the child's first request
        m._start_lock = threading.Lock()
        m._write_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


# --- the master's side (gunicorn_conf hooks) ----------------------------------------------------------------
def start_instance(base: str | None = None) -> str:
    """Create the folder the workers write their snapshots to (tmpfs when there is one), named after this
    master's pid, after removing the folders of masters that are gone without cleaning up (SIGKILL skips on_exit)."""
    global SHARED_DIR
    if base is None:
        base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    _sweep_abandoned(base)
    SHARED_DIR = tempfile.mkdtemp(prefix=f"{_FOLDER_PREFIX}{os.getpid()}-", dir=base)
    return SHARED_DIR


def _sweep_abandoned(base: str) -> None:
    """Remove this user's metrics folders whose master no longer runs. A folder whose pid is alive (even if the
    pid was reused) or whose name carries no pid is left alone: only what certainly has no owner goes."""
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        pid_text = name[len(_FOLDER_PREFIX):].split("-", 1)[0] if name.startswith(_FOLDER_PREFIX) else ""
        if not pid_text.isdigit():
            continue
        path = os.path.join(base, name)
        try:
            if os.stat(path).st_uid != os.getuid():
                continue
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except OSError:  # alive but another user's, or the folder went meanwhile
            continue


def retire_worker(pid: int) -> None:
    """Fold an exited worker's counters into retired.m (its gauges die with it): retired.m, naming the file it
    absorbed, is replaced before the file goes, so a reader counts the worker once, in one or the other."""
    if SHARED_DIR is None:
        return
    prefix = f"w{pid}-"
    try:
        names = [n for n in os.listdir(SHARED_DIR) if n.startswith(prefix) and n.endswith(".m")]
    except OSError:
        return
    for name in names:
        path = os.path.join(SHARED_DIR, name)
        snapshot = _load(path)
        if snapshot is None:
            continue
        retired = _load(os.path.join(SHARED_DIR, _RETIRED)) or {"c": {}, "g": {}}
        _merge(retired["c"], snapshot.get("c", {}))
        # Only a reader that loaded the file before it went can still hold it: a short list is enough.
        retired["a"] = (list(retired.get("a", ())) + [name])[-_ABSORBED_KEPT:]
        _dump(os.path.join(SHARED_DIR, _RETIRED), retired)
        try:
            os.unlink(path)
        except OSError:
            pass


def stop_instance() -> None:
    global SHARED_DIR
    if SHARED_DIR is not None:
        shutil.rmtree(SHARED_DIR, ignore_errors=True)
        SHARED_DIR = None


# --- files -----------------------------------------------------------------------------------------------
def _load(path: str):
    try:
        with open(path, "rb") as fh:
            return marshal.load(fh)
    except (OSError, EOFError, ValueError, TypeError):
        return None


def _dump(path: str, value) -> None:
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "wb") as fh:
        marshal.dump(value, fh)
    os.replace(tmp, path)


def _merge(into: dict, add: dict) -> None:
    """Sum nested dicts of numbers and lists of numbers."""
    for name, value in add.items():
        if isinstance(value, dict):
            _merge(into.setdefault(name, {}), value)
        elif isinstance(value, list):
            have = into.get(name)
            if have is None:
                into[name] = list(value)
            else:
                for i, v in enumerate(value):
                    have[i] += v
        else:
            into[name] = into.get(name, 0) + value


# --- a worker's side -----------------------------------------------------------------------------------------
def _bucket(seconds: float) -> int:
    """The histogram bucket of a duration: bisect.bisect_left(BOUNDS, seconds), as a loop that compiles to a few
    C comparisons (most durations stop at the first bound) instead of a call through the interpreter."""
    i = 0
    for bound in BOUNDS:
        if not bound < seconds:   # bisect_left's own test, so a NaN lands where bisect puts it (bucket 0)
            return i
        i += 1
    return i


class _Shard:
    __slots__ = ("req", "qry", "ser", "exp", "cache", "usage_conn", "usage_key", "active")

    def __init__(self):
        self.req: dict = {}
        self.qry: dict = {}
        self.ser: dict = {}
        self.exp: dict = {}
        self.cache: dict = {}   # response-cache lookups: "hit"/"miss" -> count
        self.usage_conn: dict = {}   # written by api/_usage.Usage.record only
        self.usage_key: dict = {}
        self.active = 0


class _Local(threading.local):
    def __init__(self, shards: list):
        self.shard = _Shard()
        shards.append(self.shard)  # list.append is atomic; the shard outlives its thread, and so do its counts


class Metrics:
    """One per worker. `request`, `run` and `stream` are the hot path: no lock, no I/O."""

    def __init__(self, gauges=None):
        self._shards: list[_Shard] = []
        self._local = _Local(self._shards)
        self._gauges = gauges          # callable -> ({counters}, {gauges}) of other parts (pools, buffers)
        self._started = False
        self._pid: int | None = None
        self._file = ""                # this worker's snapshot file, named when it starts
        self._written = b""
        self._write_lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._stop = threading.Event()
        _all.add(self)

    # --- hot path -------------------------------------------------------------------------------------------
    def request(self, method: str, endpoint: str, status: int, key: str, seconds: float) -> None:
        if not self._started:
            self._start()
        series = self._local.shard.req
        if str.startswith(key, "jwt:"):   # (not key.startswith: compiled, this is a C call, not a method lookup)
            key = "jwt"  # one series for every signed-in user (contract 9.2): subjects are unbounded
        k = (method if method in _METHODS else "OTHER", endpoint, status, key)
        v = series.get(k)
        if v is None:
            v = series[k] = [0, 0.0] + [0] * _NB
        v[0] += 1
        v[1] += seconds
        v[2 + _bucket(seconds)] += 1

    def begin(self) -> None:
        shard = self._local.shard
        shard.active += 1

    def run(self, connection: str, dialect: str, ok: bool, key: str, rows: int, seconds: float | None,
            fmt: str | None = None, encode_seconds: float | None = None) -> None:
        shard = self._local.shard
        shard.active -= 1
        if str.startswith(key, "jwt:"):
            key = "jwt"
        k = (connection, dialect, "success" if ok else "error", key)
        series = shard.qry
        v = series.get(k)
        if v is None:
            v = series[k] = [0, 0, 0, 0.0] + [0] * _NB
        v[0] += 1
        v[1] += rows
        if seconds is not None:
            v[2] += 1
            v[3] += seconds
            v[4 + _bucket(seconds)] += 1
        if encode_seconds is not None:
            series = shard.ser
            s = series.get(fmt)
            if s is None:
                s = series[fmt] = [0, 0.0] + [0] * _NB
            s[0] += 1
            s[1] += encode_seconds
            s[2 + _bucket(encode_seconds)] += 1

    def stream(self, connection: str, dialect: str, status: str, key: str) -> None:
        series = self._local.shard.exp
        if key.startswith("jwt:"):
            key = "jwt"
        k = (connection, dialect, status, key)
        series[k] = series.get(k, 0) + 1

    def cache(self, hit: bool) -> None:
        series = self._local.shard.cache
        k = "hit" if hit else "miss"
        series[k] = series.get(k, 0) + 1

    # --- snapshots ------------------------------------------------------------------------------------------
    def _start(self) -> None:
        with self._start_lock:
            if self._started:
                return
            self._started = True
            self._pid = os.getpid()
            # The start in the name: a later worker that gets the same pid never shares (or loses) this file.
            self._file = f"w{self._pid}-{time.monotonic_ns()}.m"
            self._stop = threading.Event()
            if SHARED_DIR is not None:
                threading.Thread(target=self._loop, name="qag-metrics", daemon=True).start()

    def _loop(self) -> None:
        while not self._stop.wait(_SNAPSHOT_EVERY):
            try:
                self.write_snapshot()
            except Exception:  # a full /dev/shm or a bad stat must not end the snapshots for good
                logging.getLogger("qag").exception("could not write this worker's metrics snapshot")

    def write_snapshot(self) -> bool:
        """Publish this worker's totals to its file; False when it could not be written."""
        if not self._started:
            self._start()
        if SHARED_DIR is None or self._pid != os.getpid():
            return False
        with self._write_lock:  # the snapshot thread, a scrape and close(): the later write has the later figures
            data = marshal.dumps(self.snapshot())
            if data == self._written:
                return True  # nothing changed: an idle worker writes nothing
            path = os.path.join(SHARED_DIR, self._file)
            tmp = f"{path}.tmp"
            try:
                with open(tmp, "wb") as fh:
                    fh.write(data)
                os.replace(tmp, path)
                self._written = data
                return True
            except OSError:  # the master removed the folder (shutting down), or the folder is full
                return False

    def snapshot(self) -> dict:
        """This worker's totals: {"c": counters, "g": gauges}; lists copied first, so no thread's update tears."""
        c: dict = {name: {} for name in _COUNTERS}
        active = 0
        for shard in list(self._shards):
            for name in _COUNTERS:
                target = c[name]
                for k, v in list(getattr(shard, name).items()):
                    if isinstance(v, list):
                        v = list(v)
                        have = target.get(k)
                        if have is None:
                            target[k] = v
                        else:
                            for i, x in enumerate(v):
                                have[i] += x
                    else:
                        target[k] = target.get(k, 0) + v
            active += shard.active
        g: dict = {"active": active, "workers": 1}
        if self._gauges is not None:
            more_c, more_g = self._gauges()
            c.update(more_c)
            g.update(more_g)
        return {"c": c, "g": g}

    def instance(self) -> dict:
        """Totals of every worker of the instance, from published figures only (see the module's docstring)."""
        total = {"c": {}, "g": {}}
        if SHARED_DIR is None or not self.write_snapshot():
            mine = self.snapshot()   # nothing published to read back: this worker's live figures
            _merge(total["c"], mine["c"])
            _merge(total["g"], mine["g"])
            if SHARED_DIR is None:
                return total
            skip = self._file
        else:
            skip = None
        try:
            names = os.listdir(SHARED_DIR)
        except OSError:
            names = []
        workers = {}
        for name in names:
            if name.startswith("w") and name.endswith(".m") and name != skip:
                snap = _load(os.path.join(SHARED_DIR, name))
                if snap is not None:
                    workers[name] = snap
        # retired.m last: a worker file missing from the listing or gone before it was read was absorbed into
        # this copy (or a newer one), and one read before it went is skipped when this copy says it absorbed it.
        retired = _load(os.path.join(SHARED_DIR, _RETIRED)) or {}
        absorbed = set(retired.get("a", ()))
        _merge(total["c"], retired.get("c", {}))
        for name, snap in workers.items():
            if name not in absorbed:
                _merge(total["c"], snap.get("c", {}))
                _merge(total["g"], snap.get("g", {}))
        return total

    def close(self) -> None:
        """A last snapshot (graceful exit), so the master folds in every count."""
        self._stop.set()
        self.write_snapshot()


# --- Prometheus text ------------------------------------------------------------------------------------------
def _esc(value) -> str:
    return str(value).replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def _labels(names: tuple, values: tuple) -> str:
    return ",".join(f'{n}="{_esc(v)}"' for n, v in zip(names, values))


def _num(value) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


class _Text:
    def __init__(self):
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, labels: str, value) -> None:
        self.lines.append(f"{name}{{{labels}}} {_num(value)}" if labels else f"{name} {_num(value)}")

    def counter(self, name: str, help_text: str, names: tuple, series: dict) -> None:
        self.family(name, "counter", help_text)
        for values in sorted(series, key=lambda t: tuple(str(x) for x in t)):
            self.sample(name, _labels(names, values), series[values])

    def gauge(self, name: str, help_text: str, value, names: tuple = (), series: dict | None = None) -> None:
        self.family(name, "gauge", help_text)
        if series is None:
            self.sample(name, "", value)
            return
        for values in sorted(series, key=lambda t: tuple(str(x) for x in t)):
            self.sample(name, _labels(names, values), series[values])

    def histogram(self, name: str, help_text: str, names: tuple, series: dict) -> None:
        """series: label values -> [count, sum, bucket counts...] (non-cumulative buckets)."""
        self.family(name, "histogram", help_text)
        for values in sorted(series, key=lambda t: tuple(str(x) for x in t)):
            count, total, buckets = series[values]
            base = _labels(names, values)
            sep = "," if base else ""
            running = 0
            for bound, n in zip(BOUNDS + (None,), buckets):
                running += n
                le = "+Inf" if bound is None else repr(bound)
                self.lines.append(f'{name}_bucket{{{base}{sep}le="{le}"}} {running}')
            self.sample(f"{name}_sum", base, float(total))
            self.sample(f"{name}_count", base, count)


def _group(series: dict, pick, count_i: int, sum_i: int, first_bucket: int) -> dict:
    out: dict = {}
    for k, v in series.items():
        key = pick(k)
        have = out.get(key)
        if have is None:
            have = out[key] = [0, 0.0, [0] * _NB]
        have[0] += v[count_i]
        have[1] += v[sum_i]
        for i in range(_NB):
            have[2][i] += v[first_bucket + i]
    return out


def render(total: dict, speedups: dict[str, str], build: dict | None = None, process: dict | None = None) -> bytes:
    """Prometheus text format 0.0.4 of an instance's totals (see Metrics.instance); `build` is the build-info
    labels (version, speedups mode, worker class), `process` the instance's process figures (observe/process)."""
    c, g = total["c"], total["g"]
    req, qry, ser, exp = c.get("req", {}), c.get("qry", {}), c.get("ser", {}), c.get("exp", {})
    t = _Text()
    t.counter("queryapigate_requests_total", "HTTP requests by method, endpoint, status and key.",
              ("method", "endpoint", "status", "key"), {k: v[0] for k, v in req.items()})
    t.histogram("queryapigate_request_duration_seconds", "Time to the response's first byte, by method and endpoint.",
                ("method", "endpoint"), {k: tuple(v) for k, v in _group(req, lambda k: k[:2], 0, 1, 2).items()})
    t.counter("queryapigate_queries_total", "Executed runs (saved and ad-hoc, paged and streamed).",
              ("connection", "dialect", "status", "key"), {k: v[0] for k, v in qry.items()})
    t.histogram("queryapigate_query_duration_seconds", "Database time of paged runs.", ("connection", "dialect"),
                {k: tuple(v) for k, v in _group(qry, lambda k: k[:2], 2, 3, 4).items() if v[0]})
    t.counter("queryapigate_stream_exports_total", "Streamed exports by outcome (success, error, truncated).",
              ("connection", "dialect", "status", "key"), exp)
    rows: dict = {}
    for k, v in qry.items():
        rows[(k[0], k[1], k[3])] = rows.get((k[0], k[1], k[3]), 0) + v[1]
    t.counter("queryapigate_rows_returned_total", "Rows returned (page rows, or rows streamed).",
              ("connection", "dialect", "key"), rows)
    t.histogram("queryapigate_serialization_duration_seconds", "Time to encode a paged response body.",
                ("format",), {(k,): (v[0], v[1], v[2:]) for k, v in ser.items()})
    hist = c.get("history", {})
    t.counter("queryapigate_history_runs_total", "Runs by what became of their history entry.", ("outcome",),
              {(o,): hist.get(o, 0) for o in ("recorded", "sampled_out", "dropped", "failed")})
    t.gauge("queryapigate_history_pending", "Runs queued for the history writers, not yet written.",
            g.get("history_pending", 0))
    t.gauge("queryapigate_active_queries", "Runs executing now (paged, or streaming).", g.get("active", 0))
    limited = c.get("rate_limit", {})
    t.counter("queryapigate_rate_limit_rejections_total", "Requests refused with 429 rate_limited.", (),
              {(): limited.get("rejections", 0)})
    t.counter("queryapigate_rate_limit_fallbacks_total", "Limiter, slot and quota checks that counted in-process "
              "because Redis failed.", (), {(): limited.get("fallbacks", 0)})
    pools = g.get("pools", {})
    t.gauge("queryapigate_pool_idle_connections", "Idle pooled data connections.",
            sum(v[0] for v in pools.values()))
    t.gauge("queryapigate_pool_active_connections", "Pooled data connections in use.",
            sum(v[1] for v in pools.values()))
    cache = c.get("cache", {})
    t.counter("queryapigate_cache_hits_total", "Saved-query calls answered from the response cache.", (),
              {(): cache.get("hit", 0)})
    t.counter("queryapigate_cache_misses_total", "Response-cache lookups that found no live entry (the query ran).",
              (), {(): cache.get("miss", 0)})
    t.gauge("queryapigate_cache_entries", "Response-cache entries held in the workers' memory (0 when kept in Redis).",
            g.get("cache_entries", 0))
    events = c.get("events", {})
    t.gauge("queryapigate_events_streams", "Open GET /events streams.", g.get("events_streams", 0))
    t.counter("queryapigate_events_delivered_total", "Run events handed to GET /events streams.", (),
              {(): events.get("delivered", 0)})
    t.counter("qag_events_dropped_streams_total", "GET /events streams dropped because their client fell the "
              "host's whole event ring (QAG_EVENTS_RING_BYTES) behind.", (), {(): events.get("dropped_streams", 0)})
    t.counter("qag_pool_waits_total", "Callers that waited for a connection under QAG_POOL_MAX.", ("db",),
              {(db,): n for db, n in c.get("pool_waits", {}).items()})
    t.gauge("qag_pool_waiting_callers", "Callers waiting now for a data connection under QAG_POOL_MAX, by saved "
            "connection (a connection appears once a caller has waited for it).", None, ("connection",),
            {(name,): n for name, n in g.get("pool_waiting", {}).items()})
    t.gauge("qag_history_buffer_capacity", "Runs the workers may queue in all before the oldest are dropped.",
            g.get("history_capacity", 0))
    t.counter("qag_log_lines_dropped_total", "Log lines dropped because a worker's log queue was full.", (),
              {(): c.get("log_dropped", 0)})
    metadata = c.get("metadata", {})
    t.counter("qag_metadata_cache_hits_total", "Key, saved-query and connection rows served by the metadata cache.",
              (), {(): metadata.get("hits", 0)})
    t.counter("qag_metadata_cache_misses_total", "Rows the metadata cache did not have (read from the store).", (),
              {(): metadata.get("misses", 0)})
    # Every worker reports the host's one generation (keyed by pid so the sum across workers doesn't add them).
    t.gauge("qag_metadata_cache_generation", "Invalidations of the host's metadata cache so far (its generation).",
            max(g.get("metadata_generation", {}).values(), default=0))
    t.gauge("qag_workers", "Worker processes whose figures are in this scrape.", g.get("workers", 1))
    t.gauge("qag_speedups_loaded", "Which twin of each hot-path module runs (1 = loaded).", None,
            ("module", "twin"), {(m, twin): 1 for m, twin in speedups.items()})
    if build:
        names = tuple(sorted(build))
        t.gauge("qag_build_info", "The running qag: version, QAG_SPEEDUPS mode and worker class (always 1).", None,
                names, {tuple(build[n] for n in names): 1})
    if process:
        t.counter("process_cpu_seconds_total", "CPU time of the instance's running processes (master and workers).",
                  (), {(): round(process["cpu"], 2)})
        t.gauge("process_resident_memory_bytes", "Resident memory of the instance's processes.", process["rss"])
        t.gauge("process_open_fds", "Open file descriptors of the instance's processes.", process["fds"])
        t.gauge("process_start_time_seconds", "Start time of the instance (its master) since the Unix epoch.",
                round(process["start"], 2))
    return ("\n".join(t.lines) + "\n").encode("utf-8")
