"""`qag serve`: validate in the master, then run gunicorn with qag's config and a gateway per worker."""

from __future__ import annotations

import errno
import os
import socket
import sys
import time

from gunicorn.app.base import BaseApplication

from .settings import Settings

_CONFIG_NAMES = ("bind", "workers", "threads", "worker_class", "timeout", "graceful_timeout", "keepalive",
                 "preload_app", "accesslog", "access_log_format", "errorlog", "loglevel", "proc_name",
                 "on_starting", "when_ready", "pre_fork", "post_fork", "post_worker_init", "worker_exit", "child_exit",
                 "on_exit", "control_socket", "logger_class",
                 "control_socket_disable")


class _Server(BaseApplication):
    """gunicorn's own master (signals, reloads, worker management) around qag's WSGI app."""

    def __init__(self, options: dict):
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        for name, value in self.options.items():
            self.cfg.set(name, value)

    def load(self):
        # Runs in each worker after fork: the gateway, its store connections and caches are the worker's own.
        # The master created the store (check_startup): a worker started later, after its file was moved or
        # deleted, fails to boot (and gunicorn stops) rather than serving from a new empty store of its own.
        # A PostgreSQL store that can't be reached when a worker restarts is an outage, not a wrong setting: that
        # worker waits for it (open_store_when_up) while the others serve.
        from . import gunicorn_conf
        from .app import create_app
        from .settings import load
        from .store import open_store
        settings = load()
        if settings.database_url and gunicorn_conf.respawned() and gunicorn_conf.this_worker is not None:
            store = open_store_when_up(settings, gunicorn_conf.this_worker)
        else:
            store = open_store(settings, create=False)
        return create_app(settings, store)


RETRY_FIRST, RETRY_MOST = 1.0, 30.0   # seconds between a restarted worker's attempts to open the store: doubling


def open_store_when_up(settings: Settings, worker, sleep=time.sleep):
    """The store, opened as soon as it can be: a warning each failed attempt, then a wait (doubling up to
    RETRY_MOST s) during which the worker keeps its heartbeat (gunicorn's master would kill a silent worker and
    fork another into the same wait). Ends the worker (exit 0, not gunicorn's boot error, which halts the master)
    once it is told to stop."""
    from .store import StoreOpenError, open_store
    wait = RETRY_FIRST
    while True:
        try:
            return open_store(settings, create=False)
        except StoreOpenError as exc:
            if not exc.transient:
                raise   # a store that is wrong (a newer schema, a missing database) isn't waited out
            worker.log.warning("worker %s: the store can't be opened (%s); trying again in %g s", os.getpid(),
                               exc, wait)
        until = time.monotonic() + wait
        while time.monotonic() < until:
            if not worker.alive:
                sys.exit(0)
            worker.notify()
            sleep(min(0.5, max(0.0, until - time.monotonic())))
        wait = min(wait * 2, RETRY_MOST)


def check_startup(settings: Settings) -> None:
    """Fail in the master, once, with one line, rather than in every worker: speedups mode and store schema."""
    from . import _speedups
    from .settings import unused_aliases
    from .store import open_store
    ignored = unused_aliases()
    if ignored:
        print(f"qag: warning: {', '.join(ignored)}: QueryAPIGate setting(s) qag does not implement, ignored "
              f"(docs/configuration.md)", file=sys.stderr, flush=True)
    warning = _speedups.check()   # refuses under QAG_SPEEDUPS=require, in one line, unless all is compiled
    if warning:
        print(f"qag: warning: {warning}", file=sys.stderr, flush=True)
    store = open_store(settings)  # migrated here, once, before any worker starts
    try:
        if settings.database_url and store.get_meta("server_secret") is None and _sqlite_store_in_use(settings.home):
            print(f"qag: warning: the PostgreSQL store is empty while {settings.home} holds a SQLite store with data; "
                  f"to move it, stop qag and run `qag store copy` (docs/deployment.md)", file=sys.stderr, flush=True)
        _warn_missing_drivers(store)
    finally:
        store.close()
    twins = ", ".join(f"{name}={kind}" for name, kind in _speedups.choices().items())
    print(f"qag: store {store.describe()}; speedups ({_speedups.mode()}): {twins}", file=sys.stderr, flush=True)


def _warn_missing_drivers(store) -> None:
    """One line per database type whose saved connections can't run here: the driver isn't installed."""
    from .backends.registry import missing_driver
    for db in sorted({row["db"] for row in store.list_connections()}):
        line = missing_driver(db)
        if line:
            print(f"qag: warning: {line}", file=sys.stderr, flush=True)


def _sqlite_store_in_use(home: str) -> bool:
    """Whether the home has a SQLite store holding connections, queries or keys (read-only look, never created)."""
    import os
    import sqlite3
    from urllib.parse import quote
    path = os.path.join(home, "qag.db")
    if not os.path.isfile(path):
        return False
    try:
        conn = sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True, timeout=1.0)
        try:
            return any(conn.execute(f"SELECT 1 FROM {t} LIMIT 1").fetchone()
                       for t in ("connections", "queries", "api_keys"))
        finally:
            conn.close()
    except sqlite3.Error:  # not a store qag can read: nothing to suggest
        return False


def bind_problem(bind: str, command: str = "qag serve", setting: str = "QAG_BIND") -> str | None:
    """One line when `bind` can't be listened on (its port taken, its address not this machine's), found by
    binding it as gunicorn will; None when it can (or names a Unix socket, or port 0: any free port)."""
    if bind.startswith("unix:"):
        return None
    host, _, port = bind.rpartition(":")
    host = host.strip("[]")
    if int(port) == 0:
        return None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as gunicorn binds: TIME_WAIT is no reason
        try:
            probe.bind((host, int(port)))
        except OSError as exc:
            pick = f"--bind {host}" if setting == "QAG_BIND" else f"{setting}={host}"
            if exc.errno == errno.EADDRINUSE:
                return (f"{setting} {bind}: the port is in use by another process; pick another, e.g. "
                        f"{command} {pick}:{int(port) + 1} (or {pick}:0 for any free port)")
            if exc.errno == errno.EACCES:
                return f"{setting} {bind}: ports below 1024 need privileges; pick a port from 1024 up"
            return f"{setting} {bind}: can't listen there ({exc.strerror}); use an address of this machine"
    return None


def serve(settings: Settings, banner=None, command: str = "qag serve") -> int:
    """Run the gateway; `banner(base_url)` is printed once it listens (the real port, also for port 0)."""
    problem = bind_problem(settings.bind, command) or (
        bind_problem(settings.admin_bind, command, "QAG_ADMIN_BIND") if settings.admin_bind else None)
    if problem is not None:
        print(f"qag: {problem}", file=sys.stderr)
        return 2
    try:
        check_startup(settings)
    except (ImportError, RuntimeError, ValueError) as exc:
        print(f"qag: {exc}", file=sys.stderr)
        return 2
    from . import gunicorn_conf
    gunicorn_conf.ready_banner = banner
    options = {name: getattr(gunicorn_conf, name) for name in _CONFIG_NAMES}
    if settings.api_key is None:
        local = settings.bind.startswith(("127.", "localhost", "[::1]", "unix:"))
        print("qag: open mode (no QAG_API_KEY): " + (
            "only callers on this machine are answered; set QAG_API_KEY to serve others" if local else
            "listening beyond this machine, but only local callers are answered, and no one can administer the "
            "server once a scoped key exists; set QAG_API_KEY"), file=sys.stderr)
    _Server(options).run()
    return 0
