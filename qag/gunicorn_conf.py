"""gunicorn settings from qag's settings: `gunicorn -c python:qag.gunicorn_conf 'qag.app:create_app()'`."""

import gc
import os
import signal

from qag.observe import gunicorn_log as _gunicorn_log
from qag.settings import load as _load

_settings = _load()

# The admin listener second: post_worker_init finds it at that place among the worker's sockets.
bind = [_settings.bind] + ([_settings.admin_bind] if _settings.admin_bind else [])
workers = _settings.workers
threads = _settings.threads
worker_class = "qag.worker.QagWorker" if _settings.worker_class == "qag" else "qag.worker.gthread.QagThreadWorker"
timeout = _settings.timeout
graceful_timeout = _settings.graceful_timeout
keepalive = 5
# Each worker builds its own gateway after fork: store and data connections are never shared across it.
preload_app = False
accesslog = "-" if _settings.access_log else None
# The path without the query string unless QAG_ACCESS_LOG_QUERY: parameter values can be personal data.
# pid= names the worker that answered: with several workers, the one to look at for a request id.
access_log_format = ('%(h)s - %(t)s "%(r)s" %(s)s %(b)s %(L)ss rid=%({x-request-id}o)s pid=%(p)s "%(a)s"'
                     if _settings.access_log_query else
                     '%(h)s - %(t)s "%(m)s %(U)s %(H)s" %(s)s %(b)s %(L)ss rid=%({x-request-id}o)s pid=%(p)s "%(a)s"')
# gunicorn's control socket (gunicornc) is the instance's own, in its home: at gunicorn's default path
# ($HOME/.gunicorn/gunicorn.ctl) a second instance on the host would replace the first one's. A home whose path is
# too long for a Unix socket address gets none.
control_socket = os.path.join(_settings.home, "gunicorn.ctl")
control_socket_disable = len(control_socket.encode()) > 100
errorlog = "-"
# gunicorn's own lines in qag's shape (JSON under QAG_JSON_LOGS) and with UTF-8 paths (qag/observe/gunicorn_log.py).
logger_class = "qag.observe.gunicorn_log.Logger"
_gunicorn_log.JSON = _settings.json_logs
loglevel = _settings.log_level
proc_name = "qag"


# --- hooks: metrics summed across workers, and recording flushed when a worker ends -------------------------
def on_starting(server):
    """Master, before any fork: the folder every worker writes its metrics snapshots to, the segment history
    reads use to have every worker write its queued runs, and the host's shared-memory metadata cache that every
    worker (and every worker restarted later) inherits."""
    from qag.observe import hostflush, live, metrics
    metrics.start_instance()
    hostflush.start_instance()
    live.start_instance(_settings.events_ring_bytes)   # live run events from any worker to any worker's streams
    if _settings.metadata_cache_ttl > 0:
        from qag.cache import shm
        shm.start_instance(_settings.metadata_cache_bytes)
    from qag.policy import hostlimits  # rate limits, max_concurrent slots and quotas of every worker
    hostlimits.start_instance(_settings.limits_table_entries)
    from qag.policy import redislimits  # the tag naming this instance's workers' Redis leases
    redislimits.start_instance()
    if _settings.redis_url is None:  # the response cache's host segment (with Redis it is kept there instead)
        from qag.cache import hostentries
        hostentries.start_instance(_settings.response_cache_max_bytes)


# What the master prints once every listener is bound (qag.server.serve sets it: the demo's banner), given the
# base URL with the real port, also when the bind asked for port 0.
ready_banner = None


def when_ready(server):
    """Master, listening: say where, with the port the kernel gave."""
    import sys
    urls = [str(listener) for listener in server.LISTENERS]   # http://host:port, or unix:/path
    admin = f"; operator routes (QAG_ADMIN_BIND) on {urls[1]}" if len(urls) > 1 else ""
    print(f"qag: listening on {urls[0] if urls else '?'}{admin}", file=sys.stderr, flush=True)
    if ready_banner is not None and urls:
        print(ready_banner(urls[0]), file=sys.stderr, flush=True)


# Workers the master has forked so far, counted before each fork (so a worker sees itself counted). The first
# QAG_WORKERS are the instance's start; any later one (a worker that died or was recycled, a reload's) boots into
# an instance that is serving: qag.server waits for a store that can't be opened then, rather than fail to boot
# (gunicorn would halt the master, and with it the workers still serving from their metadata cache).
forked = 0
_reload_forks = 0   # forks left of the round a reload (SIGHUP) started: on_reload
# In a worker: gunicorn's worker object (its heartbeat and `alive` while the app is still being built).
this_worker = None


def pre_fork(server, worker):
    """Master, about to fork a worker."""
    global forked, _reload_forks
    forked += 1
    if _reload_forks > 0:
        _reload_forks -= 1
        worker.qag_reload_round = True   # set on the master's object before the fork: the worker sees it


def on_reload(server):
    """Master, on SIGHUP, before it forks a new round of workers (and then retires the old ones)."""
    global _reload_forks
    _reload_forks = server.cfg.workers


def reload_round() -> bool:
    """In a worker: whether a reload forked it (every worker of the instance is being replaced, so no other may
    be serving when this one can't open the store)."""
    return bool(getattr(this_worker, "qag_reload_round", False))


def respawned() -> bool:
    """In a worker: whether it was forked after the instance's first round of workers."""
    return forked > workers


def post_fork(server, worker):
    """Worker, just forked, before it builds the app or starts a thread (each inherits the policy)."""
    global this_worker
    this_worker = worker
    set_scheduling(_settings.worker_sched)


def set_scheduling(policy: str) -> None:
    """QAG_WORKER_SCHED for this process (its threads made from now on inherit it). SCHED_BATCH needs no
    privilege; where the system lacks it, the default stays."""
    if policy == "batch" and hasattr(os, "SCHED_BATCH"):
        try:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        except OSError:
            pass


def post_worker_init(worker):
    """Worker, its app loaded: the gateway's start (gateway_started; a worker waiting for its store calls it once
    the store opens: storewait.py), a graceful stop that ends /events streams, and the garbage collector set for
    a server's allocation pattern."""
    gateway = getattr(worker, "wsgi", None)
    if getattr(gateway, "observe", None) is not None:
        gateway_started(worker, gateway)
    _end_streams_on_term(worker)
    # What start-up built (modules, sqlglot's tables, the app) lives as long as the worker: out of the
    # collector's generations, full collections don't walk it again. A call allocates a few hundred containers
    # that die by reference count, so collecting young objects every 700 allocations (Python's default) ran
    # about every other call, for nothing: -1.2% instructions per call (docs/performance.md).
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 20, 20)


def gateway_started(worker, gateway) -> None:
    """Worker, its gateway built: the admin listener's requests, and qag's log lines through the worker's log
    writer thread."""
    if _settings.admin_bind and len(worker.sockets) > 1:
        gateway.serve_admin_on(worker.sockets[1].getsockname())
    gateway.observe.logs.install()


def _end_streams_on_term(worker):
    """A graceful stop (SIGTERM, and a reload's) ends the worker's /events streams at once: a stream has no end of
    its own, and the worker would otherwise wait the whole graceful timeout for it. The gateway is looked up when
    the signal comes (a worker waiting for its store has none yet)."""
    previous = signal.getsignal(signal.SIGTERM)

    def on_term(sig, frame):
        observe = getattr(getattr(worker, "wsgi", None), "observe", None)
        if observe is not None:
            observe.live.stop()
        if callable(previous):
            previous(sig, frame)

    signal.signal(signal.SIGTERM, on_term)


def worker_exit(server, worker):
    """Worker, ending (SIGTERM, reload, recycling): write the queued history, events, log lines, metrics."""
    close = getattr(getattr(worker, "wsgi", None), "close", None)
    if close is not None:
        close()


def child_exit(server, worker):
    """Master, a worker gone: fold its counters into the instance's retired totals, and give back the slots and
    quota reservations it held: in the host table, and its max_concurrent leases and quota reservations in Redis
    (bounded: at most two short waits on Redis, once per worker gone; a lease left behind runs out by itself, a
    reservation stays counted)."""
    from qag.observe import metrics
    from qag.policy import hostlimits
    metrics.retire_worker(worker.pid)
    hostlimits.sweep(worker.pid)
    if _settings.redis_url:
        from qag.policy import redislimits
        try:
            redislimits.sweep(_settings.redis_url, worker.pid)
        except Exception as exc:  # Redis down or not answering: the leases run out instead
            server.log.warning("Could not give back the Redis max_concurrent leases and quota reservations of "
                               "worker %s (%s); the leases run out by themselves, the reservations stay counted",
                               worker.pid, type(exc).__name__)


def on_exit(server):
    from qag.cache import hostentries, shm
    from qag.observe import hostflush, live, metrics
    metrics.stop_instance()
    hostflush.stop_instance()
    live.stop_instance()
    shm.stop_instance()
    from qag.policy import hostlimits
    hostlimits.stop_instance()
    hostentries.stop_instance()
