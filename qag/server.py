"""`qag serve`: validate in the master, then run gunicorn with qag's config and a gateway per worker."""

from __future__ import annotations

import sys

from gunicorn.app.base import BaseApplication

from .settings import Settings

_CONFIG_NAMES = ("bind", "workers", "threads", "worker_class", "timeout", "graceful_timeout", "keepalive",
                 "preload_app", "accesslog", "access_log_format", "errorlog", "loglevel", "proc_name",
                 "on_starting", "post_worker_init", "worker_exit", "child_exit", "on_exit")


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
        from .app import create_app
        return create_app()


def check_startup(settings: Settings) -> None:
    """Fail in the master, once, with one line, rather than in every worker: speedups mode and store schema."""
    from . import _speedups
    from .store import open_store
    _speedups.load(settings.speedups)
    store = open_store(settings)  # migrated here, once, before any worker starts
    store.close()
    twins = ", ".join(f"{name}={kind}" for name, kind in sorted(_speedups.loaded().items()))
    print(f"qag: store {store.describe()}; speedups ({settings.speedups}): {twins}", file=sys.stderr, flush=True)


def serve(settings: Settings) -> int:
    try:
        check_startup(settings)
    except (ImportError, RuntimeError, ValueError) as exc:
        print(f"qag: {exc}", file=sys.stderr)
        return 2
    from . import gunicorn_conf
    options = {name: getattr(gunicorn_conf, name) for name in _CONFIG_NAMES}
    if settings.api_key is None and not settings.bind.startswith(("127.", "localhost", "[::1]", "unix:")):
        print("qag: warning: listening beyond this machine without QAG_API_KEY; open mode answers local callers "
              "only, and no one can administer the server once a scoped key exists", file=sys.stderr)
    _Server(options).run()
    return 0
