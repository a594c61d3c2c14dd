"""`qag serve`: validate in the master, then run gunicorn with qag's config and a gateway per worker."""

from __future__ import annotations

import errno
import os
import socket
import sys
import time

from gunicorn.app.base import BaseApplication

from .settings import Settings, unix_path

_CONFIG_NAMES = ("bind", "workers", "threads", "worker_class", "timeout", "graceful_timeout", "keepalive",
                 "preload_app", "accesslog", "access_log_format", "errorlog", "loglevel", "proc_name",
                 "on_starting", "on_reload", "when_ready", "pre_fork", "post_fork", "post_worker_init", "worker_exit",
                 "child_exit", "on_exit", "control_socket", "logger_class", "control_socket_disable")


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
        # worker waits for it (open_store_when_up) while the others serve. A reload replaces every worker, so
        # none would serve: its workers (and the first round's) answer meanwhile instead (/livez 200, the rest
        # 503: storewait.py).
        from . import gunicorn_conf
        from .app import create_app
        from .settings import load
        from .store import StoreError, StoreOpenError, open_store
        settings = load()
        worker = gunicorn_conf.this_worker
        if settings.database_url and worker is not None:
            if gunicorn_conf.respawned() and not gunicorn_conf.reload_round():
                return open_store_when_up(settings, worker, build=lambda store: create_app(settings, store))
            # A reload's worker, or one of the instance's first (the master opened the store just before it forked
            # them, so a transient failure now is an outage, not a wrong setting: failing the boot halted the
            # master and the workers already serving - a fault drill met it).
            store = None
            try:
                store = open_store(settings, create=False)
                return create_app(settings, store)
            except StoreError as exc:
                if isinstance(exc, StoreOpenError) and not exc.transient:
                    raise   # a store that is wrong (a newer schema, a missing database) isn't waited out
                _close_quietly(store)   # opened, then dropped as the gateway read it (its server secret)
                from .storewait import StoreWaiting
                worker.log.warning("worker %s: the store can't be opened (%s); answering 503 until it can",
                                   os.getpid(), exc)
                return StoreWaiting(settings, lambda: open_store(settings, create=False),
                                    lambda opened: create_app(settings, opened),
                                    lambda gateway: gunicorn_conf.gateway_started(worker, gateway))
        return create_app(settings, open_store(settings, create=False))


RETRY_FIRST, RETRY_MOST = 1.0, 30.0   # seconds between a restarted worker's attempts to open the store: doubling


def open_store_when_up(settings: Settings, worker, sleep=time.sleep, build=lambda store: store):
    """build(the store), opened as soon as it can be: a warning each failed attempt, then a wait (doubling up to
    RETRY_MOST s) during which the worker keeps its heartbeat (gunicorn's master would kill a silent worker and
    fork another into the same wait). A store that drops while `build` reads it (the gateway reads its server
    secret) is closed and tried again: raised, it was a failed boot, which halts the master and every worker with
    it (a fault drill's reload met it). Ends the worker (exit 0, not gunicorn's boot error) once it is told to
    stop."""
    from .store import StoreError, StoreOpenError, open_store
    wait = RETRY_FIRST
    while True:
        store = None
        try:
            store = open_store(settings, create=False)
            return build(store)
        except StoreError as exc:
            if isinstance(exc, StoreOpenError) and not exc.transient:
                raise   # a store that is wrong (a newer schema, a missing database) isn't waited out
            _close_quietly(store)
            worker.log.warning("worker %s: the store can't be opened (%s); trying again in %g s", os.getpid(),
                               exc, wait)
        until = time.monotonic() + wait
        while time.monotonic() < until:
            if not worker.alive:
                sys.exit(0)
            worker.notify()
            sleep(min(0.5, max(0.0, until - time.monotonic())))
        wait = min(wait * 2, RETRY_MOST)


def _close_quietly(store) -> None:
    if store is not None:
        try:
            store.close()
        except Exception:
            pass   # a store that already failed: closing it has nothing more to lose


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
    """One line when `bind` can't be listened on (its port taken, its address not this machine's, a Unix socket's
    folder missing or not writable, or its socket answering for another process), found by binding it as gunicorn
    will; None when it can (or port 0: any free port). gunicorn itself would try five times, 1 s apart, and print
    lines that name no setting."""
    if bind.startswith("unix:"):
        return _unix_problem(unix_path(bind), bind, setting)
    host, port = _host_port(bind)
    if port == 0:
        return None
    try:
        _probe(host, port).close()
    except OSError as exc:
        return _tcp_problem(exc, bind, host, port, command, setting)
    return None


def binds_problem(settings: Settings, command: str = "qag serve") -> str | None:
    """bind_problem for QAG_BIND and QAG_ADMIN_BIND, then whether the two can be listened on together: the same
    address, or the same port on addresses that overlap (0.0.0.0 and 127.0.0.1, [::] and 0.0.0.0, a name and its
    address), would fail only once gunicorn binds the second."""
    problem = bind_problem(settings.bind, command)
    admin = settings.admin_bind
    if problem is not None or admin is None:
        return problem
    problem = bind_problem(admin, command, "QAG_ADMIN_BIND")
    if problem is not None:
        return problem
    clash = f"QAG_ADMIN_BIND {admin} overlaps QAG_BIND {settings.bind}: the admin listener needs an address of its own"
    if settings.bind.startswith("unix:") or admin.startswith("unix:"):
        if settings.bind.startswith("unix:") and admin.startswith("unix:") and (
                os.path.abspath(unix_path(settings.bind)) == os.path.abspath(unix_path(admin))):
            return f"{clash} (another socket path)"
        return None
    host, port = _host_port(settings.bind)
    admin_host, admin_port = _host_port(admin)
    if port == 0 or admin_port == 0:
        return None   # any free port: never the other's
    try:
        first = _probe(host, port)
    except OSError:
        return None   # free a moment ago: gunicorn will say
    try:
        first.listen(1)   # as gunicorn's: Linux lets two sockets share a port (SO_REUSEADDR) until one listens
        _probe(admin_host, admin_port).close()
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return f"{clash} (another port, e.g. QAG_ADMIN_BIND={admin.rpartition(':')[0]}:{admin_port + 1})"
    finally:
        first.close()
    return None


def _host_port(bind: str) -> tuple[str, int]:
    host, _, port = bind.rpartition(":")
    return host.strip("[]"), int(port)


def _probe(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port) as gunicorn binds it (its family from the address, SO_REUSEADDR)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    probe = socket.socket(family, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as gunicorn binds: TIME_WAIT is no reason
        probe.bind((host, port))
    except BaseException:
        probe.close()
        raise
    return probe


def _tcp_problem(exc: OSError, bind: str, host: str, port: int, command: str, setting: str) -> str:
    shown = f"[{host}]" if ":" in host else host
    pick = f"--bind {shown}" if setting == "QAG_BIND" else f"{setting}={shown}"
    if exc.errno == errno.EADDRINUSE:
        return (f"{setting} {bind}: the port is in use by another process; pick another, e.g. "
                f"{command} {pick}:{port + 1} (or {pick}:0 for any free port)")
    if exc.errno == errno.EACCES:
        return f"{setting} {bind}: ports below 1024 need privileges; pick a port from 1024 up"
    return f"{setting} {bind}: can't listen there ({exc.strerror or exc}); use an address of this machine"


_UNIX_PATH_MAX = 107   # sun_path holds 108 bytes, the last a NUL


def _unix_problem(path: str, bind: str, setting: str) -> str | None:
    import stat
    if len(os.fsencode(path)) > _UNIX_PATH_MAX:
        return f"{setting} {bind}: a Unix socket's path is at most {_UNIX_PATH_MAX} bytes; pick a shorter one"
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        return f"{setting} {bind}: the folder {folder} does not exist; create it, or pick a path in a folder that does"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{setting} {bind}: this user can't create a socket in {folder}; pick a folder it can write"
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{setting} {bind}: can't use that path ({exc.strerror})"
    if not stat.S_ISSOCK(mode):
        return f"{setting} {bind}: {path} exists and is not a socket; pick another path"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except OSError:
            return None   # a socket left behind by a server that ended: gunicorn replaces it
    return (f"{setting} {bind}: another process is listening on that socket; stop it, or pick another path")


def home_server(home: str) -> int | None:
    """The pid of the qag server running on `home` (0 when it can't be asked) when its gunicorn control socket
    (home/gunicorn.ctl) answers, else None. A home too long for a control socket has none: not told."""
    path = os.path.join(home, "gunicorn.ctl")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(2.0)
            probe.connect(path)
    except OSError:
        return None
    try:
        from gunicorn.ctl.client import ControlClient
        with ControlClient(path, timeout=2.0) as client:
            pid = client.send_command("show stats").get("pid")
    except Exception:  # an older or busy master: that it answers is enough
        return 0
    return pid if isinstance(pid, int) and pid > 0 else 0


def _home_taken(home: str) -> str | None:
    """What to say when another server runs on this home: two instances may share a home (its store) on purpose,
    but the second must not take over the first's control socket (gunicornc, qag demo --reset's check would reach
    the newcomer, and the first would lose its socket when the second stops). Not for gunicorn's own re-exec of
    its master (USR2, GUNICORN_FD set), which replaces the old one on purpose."""
    if os.environ.get("GUNICORN_FD"):
        return None
    pid = home_server(home)
    if pid is None:
        return None
    return (f"a qag server{f' (pid {pid})' if pid else ''} already runs on {home}: this one opens no control socket "
            f"(gunicornc and qag demo --reset reach that one); give each instance a QAG_HOME of its own to control "
            f"both")


def serve(settings: Settings, banner=None, command: str = "qag serve") -> int:
    """Run the gateway; `banner(base_url)` is printed once it listens (the real port, also for port 0)."""
    problem = binds_problem(settings, command)
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
    taken = _home_taken(settings.home)
    if taken is not None:
        print(f"qag: {taken}", file=sys.stderr)
        options["control_socket_disable"] = True
    if settings.api_key is None:
        local = settings.bind.startswith(("127.", "localhost", "[::1]", "unix:"))
        print("qag: open mode (no QAG_API_KEY): " + (
            "only callers on this machine are answered; set QAG_API_KEY to serve others" if local else
            "listening beyond this machine, but only local callers are answered, and no one can administer the "
            "server once a scoped key exists; set QAG_API_KEY"), file=sys.stderr)
    _Server(options).run()
    return 0
