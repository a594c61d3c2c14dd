"""A worker started into a store outage: it answers at once (/livez 200, everything else 503) and becomes the
gateway when the store opens."""

from __future__ import annotations

import logging
import os
import threading
import time

from .errors import QagError
from .http.request import Request
from .http.response import HeaderPolicy, error_response, json_response

log = logging.getLogger("qag")

RETRY_FIRST, RETRY_MOST = 1.0, 30.0   # seconds between attempts to open the store: doubling
RETRY_ASKED = 1.0                     # ... but a request asks for one after at most this long: back with traffic
RETRY_AFTER = 2                       # what a refused caller is told to wait (the store timeout's scale)


class _Stopped(Exception):
    """The worker was told to stop while the store opened."""


class StoreWaiting:
    """The WSGI app of a worker whose store could not be opened when it started (a worker restarted, or a reload,
    during an outage of a PostgreSQL store). Waiting inside gunicorn's load() held every request the worker's
    sockets took (a reload replaces every worker, so the whole instance, /livez included, answered nothing until
    the store came back); this answers meanwhile: `/livez` 200 (the process is alive), `/readyz` and everything
    else `503 unavailable` with Retry-After, as the gateway answers while its store is down. A thread opens the
    store (a warning each failed attempt, waits doubling up to RETRY_MOST s, cut short by a request RETRY_ASKED s
    after the last attempt, so the worker serves within about a second of the store's return when it is asked),
    builds the gateway and hands every later request to it; `on_ready(gateway)` then starts what a worker starts
    once its gateway is built."""

    def __init__(self, settings, open_store, build, on_ready=None, sleep=None):
        self.settings = settings
        self._open_store, self._build, self._on_ready = open_store, build, on_ready
        self._headers = HeaderPolicy(settings.cors_origins, settings.hsts_max_age)
        self._stop = threading.Event()
        self._asked = threading.Event()       # a request came in a while after the last attempt: try again now
        self._sleep = sleep if sleep is not None else self._asked.wait
        self._attempted = time.monotonic()
        self.gateway = None
        self._thread = threading.Thread(target=self._wait_for_store, name="qag-store-wait", daemon=True)
        self._thread.start()

    def __getattr__(self, name):
        # What the worker's hooks ask of the gateway (observe, close, serve_admin_on): its own once it is built.
        gateway = self.__dict__.get("gateway")
        if gateway is None:
            raise AttributeError(name)
        return getattr(gateway, name)

    def __call__(self, environ: dict, start_response):
        gateway = self.gateway
        if gateway is not None:
            return gateway(environ, start_response)
        if time.monotonic() - self._attempted >= RETRY_ASKED:
            self._asked.set()
        request = Request(environ, 0, self.settings.trust_proxy)
        try:
            request.parse_target()
            path = request.path
        except QagError:
            path = ""
        if path == "/livez" and request.method == "GET":
            response = json_response({"status": "ok"})
        else:
            message = "Not ready: store" if path == "/readyz" else "The store is unavailable; try again shortly"
            extras = {"failed": {"store": "unavailable"}} if path == "/readyz" else {}
            error = QagError("unavailable", message, retry_after=RETRY_AFTER, **extras)
            response = error_response(error, request.request_id, environ.get("HTTP_ACCEPT"))
        headers = self._headers.finish(response, request.request_id, environ.get("HTTP_ORIGIN"), request.https)
        start_response(response.status_line, headers)
        return [response.body]

    def _wait_for_store(self) -> None:
        wait = RETRY_FIRST
        while not self._stop.is_set():
            self._attempted = time.monotonic()
            gateway = self._attempt(wait)
            if gateway is not None:
                self.gateway = gateway
                log.warning("worker %s: the store is open; serving", os.getpid())
                return
            self._sleep(wait)
            self._asked.clear()
            wait = min(wait * 2, RETRY_MOST)

    def _attempt(self, wait: float):
        """The gateway on a newly opened store, or None (logged) when the store can't be opened or the gateway
        can't be built on it yet (a store that drops again right after it opened): anything but a stop is tried
        again, so the thread never ends with the worker answering 503 for good while /livez says it is alive."""
        from .store import StoreOpenError
        try:
            store = self._open_store()
        except StoreOpenError as exc:
            # A store found wrong meanwhile (a newer schema, a database gone) is waited out too, louder: a failed
            # boot here would halt gunicorn's master and the workers still serving with it.
            (log.warning if exc.transient else log.error)(
                "worker %s: the store can't be opened (%s); answering 503 meanwhile, trying again in %g s",
                os.getpid(), exc, wait)
            return None
        except Exception as exc:   # the driver's own text may name the store's host and user: its kind only
            log.warning("worker %s: the store can't be opened (%s); answering 503 meanwhile, trying again in %g s",
                        os.getpid(), type(exc).__name__, wait)
            return None
        try:
            if self._stop.is_set():
                raise _Stopped
            gateway = self._build(store)
        except Exception as exc:
            try:
                store.close()
            except Exception:
                pass                 # closing what failed: nothing more to lose
            if not isinstance(exc, _Stopped):
                log.warning("worker %s: the gateway could not start on the store (%s); answering 503 meanwhile, "
                            "trying again in %g s", os.getpid(), type(exc).__name__, wait)
            return None
        if self._on_ready is not None:
            try:
                self._on_ready(gateway)
            except Exception:        # its admin listener or log routing: the gateway serves without them
                log.exception("worker %s: starting the gateway's listeners failed", os.getpid())
        return gateway

    def close(self) -> None:
        """The worker ends: stop waiting, and close the gateway if it was built."""
        self._stop.set()
        self._asked.set()
        self._thread.join(5.0)
        gateway = self.gateway
        if gateway is not None:
            gateway.close()

