"""The WSGI callable: builds a Gateway from settings and runs every request through the contract's pipeline."""

from __future__ import annotations

import logging
from time import perf_counter, time as wall_time

from . import _speedups
from .api.catalog import CatalogHandlers
from .api.events import EventsHandlers
from .api.manage import ManageHandlers
from .api.mcp import McpHandlers
from .api.ops import OpsHandlers
from .api.run import RunHandlers
from .auth import FORWARDED_HEADER, RELAY_HEADERS, Authenticator, Caller, guard_open_mode, relayed_clients
from .backends.registry import Backends
from .cache.metadata import build as metadata_store
from .cache.response import ResponseCache
from .errors import QagError
from .http.request import Request
from .http.response import HeaderPolicy, Response, error_response
from .http.router import Router
from .observe import Observer
from .observe.outages import OutageLog
from .observe.stages import Stages
from .policy import hostlimits
from .policy.quotas import Quotas
from .policy.redislimits import LimitStats, RateLimiter, SlotPool
from .redisconn import from_settings as redis_from_settings, namespace_prefix
from .settings import Settings, load
from .store import open_store, server_secret
from .store.base import Store, StoreUnanswered
from .store.sqlite import store_paths

log = logging.getLogger("qag")
STORE_RETRY_AFTER = 2   # seconds a caller is told to wait while the store is unavailable

# Never counted by the server-wide rate limit (contract 6.6), besides every OPTIONS and the Console pages.
_RATE_EXEMPT = frozenset({"/health", "/livez", "/readyz", "/metrics"})
_OPERATOR_PATHS = _RATE_EXEMPT   # what the admin listener (QAG_ADMIN_BIND) serves
# Routes whose calls a quota checks before and counts after (contract 0.1 step 7, 6.8).
_DATA_ENDPOINTS = frozenset({"api.run_named_query", "api.execute_sql_endpoint"})
_MCP_SEGMENTS = ["mcp"]     # the router's reading of /mcp, however the path spelled it
_EVERY_ADDRESS = frozenset({"0.0.0.0", "::", ""})   # a listener bound to these takes its port on every address


class Gateway:
    """One gateway per worker process: settings, store, authenticator, routes."""

    def __init__(self, settings: Settings, store: Store | None = None):
        _speedups.check()   # under QAG_SPEEDUPS=require, refuses a process that could not run compiled
        self.settings = settings
        self.store = store if store is not None else open_store(settings)
        self.store_unavailable = self.store.unavailable
        self.secret = self._server_secret()
        # None without QAG_REDIS_URL (qag/redisconn.py); its names are this store's: a deployment with a store of
        # its own on the same Redis shares nothing with this one.
        self.redis = redis_from_settings(settings, namespace_prefix(self.secret))
        # The per-call reads (key, saved query, connection) from the host's metadata cache; every change made
        # through either view is announced to every worker and instance (qag/cache/metadata.py).
        self.metadata = metadata_store(self.store, settings, self.redis)
        self.store = self.metadata.fresh()
        self.outages = OutageLog()
        self.store_files = store_paths(settings.home)
        self.backends = Backends(settings, self.store_files)
        self.auth = Authenticator(self.metadata, settings.api_key, settings)
        self.headers = HeaderPolicy(settings.cors_origins, settings.hsts_max_age)
        self.max_body = settings.max_body_bytes
        self.trust_proxy = settings.trust_proxy
        self.server_timing = settings.server_timing
        self.admin_listener = None   # with QAG_ADMIN_BIND: the admin listener's address (serve_admin_on)
        # Rate limits, max_concurrent slots and quotas: in Redis when configured (shared by every worker and
        # instance), else (and while Redis fails) in the host table every worker of this host counts in (the
        # gunicorn master's, or a private one in-process); see qag/policy/hostlimits.py, redislimits.py, quotas.py.
        self.rate_limit = settings.rate_limit
        self.limit_stats = LimitStats()
        self.limit_table = hostlimits.shared(settings.limits_table_entries)
        self.address_buckets = RateLimiter(hostlimits.CLIENT, self.redis, self.limit_stats, table=self.limit_table)
        self.key_buckets = RateLimiter("key", self.redis, self.limit_stats, table=self.limit_table)
        self.slots = SlotPool(self.redis, self.limit_stats, table=self.limit_table)
        self.quotas = Quotas(self.store, self.redis, self.limit_stats, interval=settings.history_flush_interval,
                             table=self.limit_table)
        self.router = Router()
        self.observe = Observer(self)
        self.tracing = self.observe.tracing   # None unless tracing is on (QAG_OTEL): a call then pays `is None` checks
        # Saved-query responses with a cache_ttl: in this process, or in Redis when set (qag/cache/response.py).
        self.response_cache = ResponseCache.from_settings(settings, self.redis, self.observe.metrics.cache)
        self.run = RunHandlers(self)
        self.manage = ManageHandlers(self)
        self.ops = OpsHandlers(self)
        self.catalog = CatalogHandlers(self)
        self.events = EventsHandlers(self)
        self.mcp = McpHandlers(self)
        self.mcp_target = self.mcp.resource.target   # what a bearer token must be issued for at /mcp (RFC 8707)
        for handlers in (self.run, self.manage, self.ops, self.catalog, self.events, self.mcp, self.observe):
            handlers.register(self.router)

    def close(self) -> None:
        """Graceful end of this worker: write what is queued (history, events, quota counts, log lines, metrics)."""
        self.quotas.close()
        self.observe.close()
        self.metadata.stop()

    def _server_secret(self) -> bytes:
        """A random key kept in the store, for digests of secrets (ETags); shared by every worker and instance."""
        return server_secret(self.store)

    def __call__(self, environ: dict, start_response):
        return self._call(environ, start_response)

    def _call(self, environ: dict, start_response):
        # Apart from __call__ so the compiled build can type it (app.pxd): the request and response as C fields.
        started = perf_counter()
        request = Request(environ, self.max_body, self.trust_proxy)
        origin = environ.get("HTTP_ORIGIN")
        if self.server_timing:
            environ["qag.timing"] = Stages()
        trace = None
        if self.tracing is not None:   # the root span, and stage marks that keep their times for the stage spans
            trace = environ["qag.timing"] = self.tracing.begin(environ)
        try:
            response = self.handle(request, origin)
        except QagError as error:
            if "qag.masked" in environ:
                # A caller with mask rules: no error of any route carries the driver's text (contract 0.3), which
                # could quote a masked value, whichever step raised it (handle sets the mark).
                error.extras.pop("detail", None)
            response = self._error_response(error, request)
        except Exception as exc:
            reason = self.store_unavailable(exc)
            if reason is None:
                log.exception("unexpected error on %s %s (request %s)", request.method, request.path,
                              request.request_id,
                              extra={"request_id": request.request_id, "key": environ.get("qag.key", "-")})
                error = QagError("internal_error")
            else:
                # The store is down, unreachable or locked: nothing was let in (an unknown key never is) and a
                # refused write was rolled back with its transaction; but a change whose reply never came (the
                # store's deadline passed, or its connection was lost after the COMMIT was sent) may have been
                # committed (a new key's secret, never shown): no Retry-After.
                if isinstance(exc, StoreUnanswered) and request.method not in ("GET", "HEAD"):
                    error = QagError("unavailable", "The metadata store's reply never came: the change may have "
                                                    "been applied - read it back before retrying",
                                     outcome="unknown")
                else:
                    error = QagError("unavailable", "The metadata store is unavailable - try again shortly",
                                     retry_after=STORE_RETRY_AFTER)
                self.outages.note("the store", error, reason)
            response = self._error_response(error, request)
        if response.status == 401 and not response.has_header("WWW-Authenticate"):
            # RFC 9110 11.6.1: a 401 names every scheme this server accepts (a bad token's names what failed).
            response.headers += self.auth.challenges
        limit_headers = environ.get("qag.limit_headers")
        if limit_headers:
            response.headers += limit_headers
        ticket = environ.get("qag.quota")
        if ticket is not None:
            self._settle_quota(ticket, response)
        headers = self.headers.finish(response, request.request_id, origin, request.https)
        if self.server_timing and environ["qag.timing"]:
            headers.append(("Server-Timing", server_timing(environ["qag.timing"])))
        body = response.body
        if isinstance(body, bytes):
            if response.status != 304:  # a 304's Content-Length would have to be the 200's (RFC 9110 8.6)
                headers.append(("Content-Length", str(len(body))))
            body = [body]
        start_response(response.status_line, headers)
        elapsed = perf_counter() - started
        # The request line is stamped when the request ends, as it is queued: a worker's lines (its runs' lines,
        # stamped as they happen) come out in time order.
        self.observe.request(request.method, environ.get("qag.endpoint", "unmatched"), response.status,
                             environ.get("qag.key", "-"), elapsed, request.request_id,
                             request.path or environ.get("PATH_INFO", ""), wall_time(),
                             None if trace is None else trace.trace_id)
        if trace is not None:
            self.tracing.end(trace, request, response, environ)
        if request.method == "HEAD":
            close = getattr(body, "close", None)
            if close is not None:  # a stream nobody will read: release its connection now
                close()
            return [b""]
        return body

    def _error_response(self, error: QagError, request: Request) -> Response:
        # An MCP client reads JSON-RPC, not the envelope: /mcp's refusals before its handler ran are JSON-RPC errors,
        # at every spelling of the path the router takes for /mcp (`//mcp`; a trailing slash is no route).
        if request.segments == _MCP_SEGMENTS or request.environ.get("PATH_INFO") == "/mcp":
            return self.mcp.refusal(error, request, self.auth.challenges)
        return error_response(error, request.request_id, request.environ.get("HTTP_ACCEPT"))

    def handle(self, request: Request, origin: str | None) -> Response:
        """Contract 0.1: preflight, authentication, route, open-access guard, admin check, handler."""
        environ = request.environ
        request.parse_target()
        if self.admin_listener is not None:
            self._check_listener(environ, request.segments)
        if (request.method == "OPTIONS" and self.headers.cors_enabled()
                and request.header("Access-Control-Request-Method")):
            environ["qag.endpoint"] = "preflight"
            return self.headers.preflight(origin)
        # Only a CORS preflight (answered above) is exempt among OPTIONS: a plain OPTIONS is authenticated, so it
        # must spend tokens like any request that can test a key. What is exempt is judged on the path the router
        # reads (request.path), never on the server's PATH_INFO: where the two read a target differently (a
        # fragment), a path exempt by one and routed by the other would test keys at any rate.
        path = request.path
        if (self.rate_limit is not None
                and path not in _RATE_EXEMPT
                and not path.startswith("/console")):
            self._limit_address(request)
        try:
            route, params = self.router.match(request.segments, request.method)
        except QagError:
            if path.startswith("/console") or (path in _RATE_EXEMPT and (
                    environ.get("HTTP_X_API_KEY") is not None or environ.get("HTTP_AUTHORIZATION") is not None)
                    and self.auth.auth_required()):
                # The contract's Console paths are public and never rate limited, and qag serves no Console: 404
                # for everyone, unauthenticated; a wrong method on a route exempt from the limit (POST /health) is
                # 405 for any credential, unread. Authenticating there would tell a right key from a wrong one at
                # any rate. Without a credential nothing is tested: the anonymous caller's 401 below; nor in open
                # mode, where there is no key to test and a remote peer must not learn which routes exist.
                raise
            # An unknown route is not public: without a credential the caller learns nothing about it.
            caller = self.auth.authenticate(request.header("X-API-Key"), request.peer,
                                            request.header("Authorization"))
            if caller is None:
                raise QagError("unauthorized", "Unauthorized", headers=list(self.auth.challenges)) from None
            environ["qag.key"] = caller.label
            self._limits(caller, environ, False)
            if caller.via == "open":
                self._guard_open_mode(request, origin)   # nor, from elsewhere in open mode, which routes exist
            raise
        environ["qag.endpoint"] = route.endpoint
        if route.public and not route.wants_caller:
            return route.handler(request, None, **params)
        timing = environ.get("qag.timing")
        if timing is not None:
            mark = perf_counter()
        try:
            # The two headers read from the environ as request.header() would (PEP 3333 names), without its calls.
            caller = self.auth.authenticate(environ.get("HTTP_X_API_KEY"), request.peer,
                                            environ.get("HTTP_AUTHORIZATION"),
                                            self.mcp_target if route.endpoint == "api.mcp" else None)
        except QagError:
            if not route.public:
                raise
            caller = None   # a public route answers a bad token as it answers a wrong key: as for anyone
        if timing is not None:
            timing["auth"] = perf_counter() - mark
        if caller is not None:
            environ["qag.key"] = caller.label
            if not caller.admin and caller.grants is not None and caller.grants.mask:
                environ["qag.masked"] = True   # _call drops `detail` from any error of this request
            if path not in _RATE_EXEMPT:
                # before the route: a 403 still counts. Not on the routes exempt from the address's limit
                # (/readyz, /metrics): a key's X-Quota-* and X-RateLimit-Key-* headers there would tell a right key
                # from a wrong one at any rate.
                self._limits(caller, environ, route.endpoint in _DATA_ENDPOINTS)
        if route.public:
            if caller is not None and caller.via == "open" and not self._open_to(request, origin):
                caller = None   # /openapi.json, /readyz: a remote caller of an open server is anyone, no admin
            return route.handler(request, caller, **params)
        if caller is None:
            raise QagError("unauthorized", "Unauthorized", headers=list(self.auth.challenges))
        if caller.via == "open":
            self._guard_open_mode(request, origin)
        if route.admin and not caller.admin:
            raise QagError("admin_only")
        return route.handler(request, caller, **params)

    def serve_admin_on(self, address) -> None:
        """QAG_ADMIN_BIND: requests accepted on `address` (the admin listener's) may reach the operator routes
        only, and /metrics only through it."""
        self.admin_listener = address

    def _check_listener(self, environ: dict, segments: list) -> None:
        # The accepted socket's local address names the listener (one getsockname, only with QAG_ADMIN_BIND): its
        # port where the admin listener is bound to every address (no other listener can then have that port), its
        # host and port where it is bound to one (another address may listen on the same port).
        local = environ["gunicorn.socket"].getsockname()
        admin = self.admin_listener
        if isinstance(admin, str):
            on_admin = local == admin
        elif admin[0] in _EVERY_ADDRESS:
            on_admin = local[1] == admin[1]
        else:
            on_admin = local[:2] == admin[:2]
        # The path as the router reads it: //metrics is /metrics too (/metrics/ is no route: a 404 either way).
        path = "/" + "/".join(segments)
        refused = path not in _OPERATOR_PATHS if on_admin else path == "/metrics"
        if refused:
            raise QagError("not_found")

    def _limit_address(self, request: Request) -> None:
        """Contract 6.6: one token of the client address's bucket (before authentication: 401s count too)."""
        count, period = self.rate_limit
        left, retry_after = self.address_buckets.take(request.peer or "", count, period)
        request.environ["qag.limit_headers"] = [("X-RateLimit-Limit", str(count)),
                                                ("X-RateLimit-Remaining", str(left))]
        if retry_after:
            raise QagError("rate_limited", "Rate limit exceeded", retry_after=retry_after)

    def _limit_key(self, caller: Caller, environ: dict) -> None:
        """Contract 6.6: the key's own rate_limit grant, one bucket per key name; administrators have none."""
        if caller.admin or caller.grants is None or caller.grants.rate_limit is None:
            return
        count, period = caller.grants.rate_limit
        left, retry_after = self.key_buckets.take(caller.name, count, period)
        headers = [("X-RateLimit-Key-Limit", str(count)), ("X-RateLimit-Key-Remaining", str(left))]
        environ["qag.limit_headers"] = environ.get("qag.limit_headers", []) + headers
        if retry_after:
            raise QagError("rate_limited", "Rate limit exceeded for this API key", retry_after=retry_after)

    def _limits(self, caller: Caller, environ: dict, data: bool) -> None:
        """The key's rate limit, then its quota (contract 0.1 steps 6-7); a rate-limited call reserves nothing
        but still carries the X-Quota-* headers."""
        grants = caller.grants
        if caller.admin or grants is None or (grants.rate_limit is None and grants.quota is None):
            return   # what _limit_key and _quota would find: nothing to count (most keys)
        if grants.rate_limit is not None and grants.quota is not None:
            # Both at once (one step of the host table when they are counted there), in the same order.
            count, period = grants.rate_limit
            ticket, (left, retry_after) = self.quotas.admit(caller.name, grants.quota, data, self.key_buckets,
                                                            count, period)
            headers = [("X-RateLimit-Key-Limit", str(count)), ("X-RateLimit-Key-Remaining", str(left))]
            environ["qag.limit_headers"] = environ.get("qag.limit_headers", []) + headers
            if ticket is not None:
                environ["qag.quota"] = ticket
            if retry_after:
                raise QagError("rate_limited", "Rate limit exceeded for this API key", retry_after=retry_after)
            if ticket is not None and ticket.refused:
                raise ticket.error()
            return
        try:
            self._limit_key(caller, environ)
        except QagError:
            self._quota(caller, environ, False)
            raise
        self._quota(caller, environ, data)

    def _quota(self, caller: Caller, environ: dict, data: bool) -> None:
        """Contract 6.8: a caller with a quota gets X-Quota-* headers on every response; a data call is checked
        (after the rate limits) and reserves its call, settled in _settle_quota once the response is known."""
        if caller.admin or caller.grants is None or caller.grants.quota is None:
            return
        ticket = self.quotas.begin(caller.name, caller.grants.quota, reserve=data)
        if ticket is None:
            return
        environ["qag.quota"] = ticket
        if ticket.refused:
            raise ticket.error()

    @staticmethod
    def _settle_quota(ticket, response: Response) -> None:
        """Count a data call's 200 (one call plus its X-Row-Count rows; a stream's rows as they leave), give any
        other outcome's call back, then add the headers (remaining after this call)."""
        if ticket.reserved:
            if response.status == 200:
                rows = 0
                for name, value in response.headers:
                    if name == "X-Row-Count":
                        rows = int(value)
                        break
                ticket.settle(True, rows)
                if hasattr(response.body, "meter"):
                    response.body.meter = ticket.add_rows
            else:
                ticket.settle(False)
        response.headers += ticket.headers()

    def _guard_open_mode(self, request: Request, origin: str | None) -> None:
        """Open mode serves this machine only (qag/auth.py guard_open_mode, shared with `qag events`)."""
        environ = request.environ
        guard_open_mode(environ.get("REMOTE_ADDR"), environ.get("HTTP_HOST"), origin, self.headers,
                        relayed_clients(environ.get(FORWARDED_HEADER), (environ.get(name) for name in RELAY_HEADERS)),
                        environ.get("HTTP_SEC_FETCH_SITE"))

    def _open_to(self, request: Request, origin: str | None) -> bool:
        """Whether open mode serves this request (a public route's caller is then the administrator)."""
        try:
            self._guard_open_mode(request, origin)
        except QagError:
            return False
        return True


def server_timing(timing: dict) -> str:
    """The Server-Timing header: the stages this request went through, in milliseconds."""
    return ", ".join(f"{name};dur={timing[name] * 1000:.3f}"
                     for name in ("auth", "bind", "policy", "cache", "query", "encode") if name in timing)


def create_app(settings: Settings | None = None, store: Store | None = None) -> Gateway:
    """The WSGI application (gunicorn: `qag.app:create_app()`); settings from the environment by default."""
    return Gateway(settings if settings is not None else load(), store)


__all__ = ["Gateway", "create_app", "Caller"]
