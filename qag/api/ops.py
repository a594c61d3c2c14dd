"""Operations routes: /health, /livez, /readyz, /metrics, /openapi.json, /docs (api/docs), /, /favicon.ico, /ui."""

from __future__ import annotations

import datetime as _dt
import hmac
import logging
import math
import os
import threading
import time

from .. import encode
from ..version import __version__
from ..errors import QagError
from ..http.response import Response, json_response
from ..policy.grants import may_use_connection
from .docs import DocsPage
from .openapi import View, build_openapi

log = logging.getLogger("qag")

_READY_TIMEOUT = 2.0  # seconds each readiness check may take
_METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def local_zone() -> tuple[str | None, str]:
    """(IANA zone name when it agrees with the current offset, '+HH:MM') of the server-local clock."""
    offset = _dt.datetime.now().astimezone().utcoffset() or _dt.timedelta(0)
    minutes = int(offset.total_seconds() // 60)
    sign = "+" if minutes >= 0 else "-"
    text = f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"
    name = os.environ.get("TZ") or None
    if name is None:
        try:
            target = os.readlink("/etc/localtime")
            name = target.split("zoneinfo/", 1)[1] if "zoneinfo/" in target else None
        except OSError:
            name = None
    if name:
        try:
            from zoneinfo import ZoneInfo
            if _dt.datetime.now(ZoneInfo(name)).utcoffset() != offset:
                name = None
        except Exception:  # an unknown or malformed zone name: report the offset only
            name = None
    return name, text


_GUESSING_KEPT = 4096   # addresses a worker remembers as out of /metrics guesses


class OpsHandlers:
    """Public routes that never touch a data database."""

    def __init__(self, gateway):
        self.gateway = gateway
        token = gateway.settings.metrics_token
        self.metrics_token = token.encode("utf-8") if token is not None else None
        # Client address -> monotonic time until which its /metrics credentials are not looked at (see metrics).
        self._guessing: dict[str, float] = {}

    def register(self, router) -> None:
        router.add("GET", "/health", self.health, "api.health", public=True)
        router.add("GET", "/livez", self.livez, "api.livez", public=True)
        router.add("GET", "/readyz", self.readyz, "api.readyz", public=True, wants_caller=True)
        router.add("GET", "/metrics", self.metrics, "api.metrics_endpoint", public=True, wants_caller=True)
        router.add("GET", "/openapi.json", self.openapi, "api.openapi_spec", public=True, wants_caller=True)
        DocsPage().register(router)
        # Public, yet a key's X-Quota-* and X-RateLimit-Key-* headers ride on them (contract 6.8: any route); the
        # address's limit applies here, unlike on /health and /livez, which read no key.
        router.add("GET", "/", self.root, "api.index", public=True, wants_caller=True)
        router.add("GET", "/favicon.ico", self.favicon, "api.favicon", public=True, wants_caller=True)
        # Contract 0.1, 9.3: public, to the Console (qag serves none; clients and bookmarks may still follow it).
        router.add("GET", "/ui", self.console, "api.admin_ui", public=True, wants_caller=True)

    def health(self, request, caller):
        name, offset = local_zone()
        return json_response({"status": "ok", "version": __version__, "time_zone": name, "utc_offset": offset})

    def livez(self, request, caller):
        """The process answers; nothing else is touched."""
        return json_response({"status": "ok"})

    def readyz(self, request, caller):
        """Ready when the store answers within a short time; 503 naming what failed otherwise."""
        failed = {}
        problem = _within(_READY_TIMEOUT, self.gateway.store.ping)
        if problem is not None:
            # The driver's text names the store's host, user and database: the log and administrators get it,
            # an anonymous prober only what failed.
            log.warning("not ready: store: %s", problem)
            failed["store"] = problem if caller is not None and caller.admin else "unavailable"
        if failed:
            raise QagError("unavailable", "Not ready: " + ", ".join(sorted(failed)), failed=failed)
        return json_response({"status": "ok", "checks": {"store": "ok"}})

    def metrics(self, request, caller):
        """Prometheus text, summed over every worker of this instance (contract 9.2)."""
        if self.metrics_token is not None:
            limit = self.gateway.rate_limit
            if limit is not None:
                self._refuse_guessing(request.peer or "")
            if not self._may_scrape(request, caller):
                if limit is not None:
                    self._count_guess(request.peer or "", limit)
                raise QagError("unauthorized", "Unauthorized - /metrics needs its token (QUERYAPIGATE_METRICS_TOKEN)",
                               headers=[("WWW-Authenticate", 'Bearer realm="metrics"')])
        return Response(200, self.gateway.observe.scrape(), [], _METRICS_TYPE)

    # /metrics is exempt from the server-wide limit (contract 6.6, 9.2) and takes the admin key: unthrottled, a 401
    # or a 200 there would test admin keys at any rate. So a refused credential spends a token of its address's
    # bucket, and once that bucket is empty the address's /metrics credentials are not looked at, right or wrong,
    # until it refills (429): a scraper with its token spends nothing. The refusal is remembered by each worker
    # as it meets it, so at most one more guess per worker gets through per refill.
    def _refuse_guessing(self, address: str) -> None:
        until = self._guessing.get(address)
        if until is not None:
            left = until - time.monotonic()
            if left > 0:
                raise QagError("rate_limited", "Rate limit exceeded", retry_after=max(1, math.ceil(left)))
            self._guessing.pop(address, None)

    def _count_guess(self, address: str, limit: tuple) -> None:
        count, period = limit
        _, retry_after = self.gateway.address_buckets.take(address, count, period)
        if retry_after:
            if len(self._guessing) >= _GUESSING_KEPT:
                now = time.monotonic()
                # a copy of the items first: other request threads add and drop entries meanwhile
                self._guessing = {a: t for a, t in list(self._guessing.items()) if t > now}
                if len(self._guessing) >= _GUESSING_KEPT:
                    self._guessing.clear()   # a flood of addresses: each starts over at its bucket
            self._guessing[address] = time.monotonic() + retry_after
            raise QagError("rate_limited", "Rate limit exceeded", retry_after=retry_after)

    def _may_scrape(self, request, caller) -> bool:
        if caller is not None and caller.admin and caller.via != "open":
            return True
        scheme, _, presented = (request.header("Authorization") or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not presented.strip().isascii():
            return False
        return hmac.compare_digest(presented.strip().encode("ascii"), self.metrics_token)

    def openapi(self, request, caller):
        """The document of what this caller may call (issue 22.4): anonymous callers and wrong keys the public
        routes, a scoped key its data plane and queries, an administrator everything."""
        queries = self.gateway.run.listable_queries(caller) if caller is not None else []
        return json_response(build_openapi(__version__, queries, self.gateway.auth.tokens is not None,
                                           self.view(caller)))

    def view(self, caller) -> View:
        """What `caller` may call on this server, as the document lists it."""
        gateway = self.gateway
        settings = gateway.settings
        formats = tuple(f for f in encode.FORMATS if encode.writable(f))
        events = gateway.observe.live.max_streams != 0
        if caller is None:
            return View(admin=False, anonymous=True, adhoc=False, connections=(), ddl_connections=(),
                        formats=formats, page_size=settings.max_page_size, metrics=self.metrics_token is None,
                        events=False)
        # An inactive connection answers 403 connection_inactive on every route that uses it: not offered.
        rows = [r for r in gateway.store.list_connections() if r["active"]]
        if caller.admin:
            usable = rows
        else:
            usable = [r for r in rows if may_use_connection(caller.grants, r["name"])]
        names = tuple(sorted(r["name"] for r in usable))
        ddl = tuple(sorted(r["name"] for r in usable if self._has_ddl(r["db"])))
        switchable = tuple(sorted(r["name"] for r in usable if r["db"] != "sqlite"))
        if caller.admin:
            store = gateway.store
            return View(admin=True, adhoc=True, connections=names, ddl_connections=ddl, switchable=switchable,
                        collections=tuple(sorted(store.collections())),
                        roles=tuple(sorted(r["name"] for r in store.list_roles())), formats=formats,
                        page_size=settings.max_page_size, events=events)
        grants = caller.grants
        # Ad-hoc SQL needs a connection grant, and a claim-bound role runs saved queries only.
        adhoc = (grants.all_connections or bool(grants.connections)) and not caller.claim_binding
        return View(admin=False, adhoc=adhoc, connections=names, ddl_connections=ddl, formats=formats,
                    page_size=settings.max_page_size, metrics=self.metrics_token is None, events=events)

    def _has_ddl(self, db: str) -> bool:
        try:
            return self.gateway.backends.get(db).has_table_ddl
        except QagError:   # its driver is missing: the route answers 500, so it is not offered
            return False

    def root(self, request, caller):
        return Response(302, b"", [("Location", "/docs")])

    def favicon(self, request, caller):
        return Response(204)

    def console(self, request, caller):
        return Response(301, b"", [("Location", "/console/")])



def _within(seconds: float, check) -> str | None:
    """Run a check on a helper thread; its error text, 'timed out', or None when it passed in time."""
    outcome: list = []

    def run():
        try:
            check(seconds)
            outcome.append(None)
        except Exception as exc:  # what failed is the answer, not a 500
            outcome.append(f"{type(exc).__name__}: {exc}")

    thread = threading.Thread(target=run, name="qag-readyz", daemon=True)
    thread.start()
    thread.join(seconds)
    if not outcome:
        return f"no answer within {seconds:g} s"
    return outcome[0]
