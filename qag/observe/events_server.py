"""`qag events`: the standalone Server-Sent Events server for many clients (contract 8.6).

One asyncio process beside `qag serve`. It tails the event log in the store (every worker's and every instance's
runs) every QAG_EVENTS_POLL_INTERVAL seconds and hands each new event to the clients that may see it: an
administrator every run, a key its own runs since the key was created, narrowed by the stream's filters (the
same rule as the main server's GET /events, live.wanted). A client resumes with `Last-Event-ID` (or
`?last_event_id=`): first every later event it may see, read from the store in pages of 1,000, then live, with no
gap or repeat. A client more than 1,000 events behind is disconnected (it resumes), a key is checked again every
60 s (a revoked or expired key's stream is closed), and QAG_EVENTS_MAX_CONNECTIONS bounds the open streams.

A request is judged as the main server judges it: the client address from QAG_TRUST_PROXY's hop (a key's
allowed_ips), one token of that address's QAG_RATE_LIMIT bucket per connection attempt before authenticating (the
main server's buckets: in Redis when configured), open mode for this machine only (contract 1.4), and CORS from
QAG_CORS_ORIGINS (preflights answered).

On a PostgreSQL store ids are taken before their transaction commits, so a run can appear with an id lower than
one already sent: the tail reads from a little below its last id and sends what it has not sent yet, so a live
client gets it (late); a client resuming from an id above it does not.
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qs

from ..auth import guard_open_mode, relay_header_names, relayed_clients
from ..errors import QagError
from ..http.request import client_of
from ..http.response import HeaderPolicy
from ..policy import hostlimits
from ..policy.redislimits import LimitStats, RateLimiter
from ..redisconn import from_settings as redis_from_settings, namespace_prefix
from ..store import server_secret
from .history import event
from .live import read_filters, wanted

log = logging.getLogger("qag")

PAGE = 1000                # events per store read, and how far a client may fall behind before it is dropped
KEEPALIVE = 15.0           # seconds without an event before `: keepalive`
RECHECK = 60.0             # seconds between two checks of a stream's key
LOOKBACK = 2000            # ids below the last one the tail reads again (PostgreSQL commits out of id order)
HEAD_LIMIT = 16384         # bytes of a request head
_SECURITY = (b"X-Content-Type-Options: nosniff\r\nContent-Security-Policy: default-src 'none'; frame-ancestors "
             b"'none'\r\nReferrer-Policy: no-referrer\r\n")
# On every answer but a stream (no-cache there): /health's and /metrics' figures hold for the moment, a refusal for
# its request only (QueryAPIGate's events server says so too, as the gateway's answers do).
_NO_STORE = b"Cache-Control: no-store\r\n"
_RELAY_NAMES = relay_header_names()      # the headers a proxy names its client in (open mode refuses relayed calls)
# A 401 says how to authenticate (RFC 9110 11.6.1): on /events the gateway's challenges (Authenticator.challenges:
# the key's, and Bearer when tokens are configured), on /metrics the gateway's /metrics challenge (contract 9.2).
_METRICS_CHALLENGE = b'WWW-Authenticate: Bearer realm="metrics"\r\n'
_STATUS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
           405: "Method Not Allowed",
           429: "Too Many Requests", 503: "Service Unavailable"}


def _meta(row: dict) -> list:
    return [row["key_name"], "success" if row["ok"] else "error", "saved" if row["query"] is not None else "adhoc",
            row["query"], row["connection"]]


def _resume_id(value: str | None) -> int | None:
    """Last-Event-ID as an event id, or None (live only) for anything but ASCII digits of a 64-bit id: str.isdigit
    also takes other scripts' digits (int() refuses some, "²"), and the store holds no id beyond 2**63 - 1."""
    value = (value or "").strip()
    if value.isascii() and value.isdigit() and len(value) <= 19 and int(value) < 1 << 63:
        return int(value)
    return None


def _fields(headers) -> bytes:
    return b"".join(f"{name}: {value}\r\n".encode("latin-1", "replace") for name, value in headers)


def _since(created_at: str | None) -> int:
    """A key's created_at (the server's local time, as the store writes it) as Unix seconds. Unreadable: now, so
    a key whose age is unknown sees nothing from before this stream rather than another key's past."""
    try:
        return int(time.mktime(time.strptime(created_at[:19], "%Y-%m-%d %H:%M:%S")))
    except (TypeError, ValueError):
        return int(time.time())


class Client:
    """One stream: who it is, what it asked for, its queue and where it has read to."""

    __slots__ = ("key", "since", "filters", "queue", "floor", "live", "writer", "header", "peer", "authorization")

    def __init__(self, caller, since: int, filters: dict, floor: int, writer, header: str | None, peer,
                 authorization: str | None = None):
        self.key = None if caller.admin else caller.name
        self.since = since          # Unix seconds of the key's creation (0: an administrator)
        self.filters = filters
        self.queue: asyncio.Queue = asyncio.Queue(PAGE)
        self.floor = floor         # the highest id covered by the stream's start or its replay
        self.live = False
        self.writer = writer
        self.header, self.peer = header, peer
        self.authorization = authorization   # a signed-in user's bearer token, checked again like a key

    def may_see(self, row: dict) -> bool:
        return row["at"] >= self.since and wanted(_meta(row), self.key, self.filters)


class EventsServer:
    def __init__(self, settings, store, authenticator, metrics_token: bytes | None = None):
        self.settings = settings
        self.store = store
        self.auth = authenticator
        self.metrics_token = metrics_token
        self.max_connections = settings.events_max_connections
        self.interval = max(settings.events_poll_interval, 0.05)   # 0 means "as often as is sensible"
        self.clients: set[Client] = set()
        self.tail_last = 0
        self._sent: collections.OrderedDict = collections.OrderedDict()   # ids the tail has handed out lately
        self._pool = ThreadPoolExecutor(4, thread_name_prefix="qag-events-store")
        self.delivered = self.replayed = self.slow_disconnects = 0
        self.trust_proxy = settings.trust_proxy
        self.headers = HeaderPolicy(settings.cors_origins, settings.hsts_max_age)
        self.rate_limit = settings.rate_limit
        self.address_buckets = None
        if self.rate_limit is not None:
            # The main server's client-address buckets (app.py Gateway): with Redis under the deployment's names,
            # so attempts here and calls there spend one budget; without, this process's own table.
            redis = redis_from_settings(settings, namespace_prefix(server_secret(store)))
            self.address_buckets = RateLimiter(hostlimits.CLIENT, redis, LimitStats(),
                                               table=hostlimits.shared(settings.limits_table_entries))

    async def _store(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    # --- the tail -----------------------------------------------------------------------------------------
    async def tail(self) -> None:
        self.tail_last = await self._store(self.store.last_event_id)
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self._tail_once()
            except Exception:   # the store down or busy: try again next time, streams stay open
                log.warning("events server: reading the event log failed", exc_info=True)

    async def _tail_once(self) -> None:
        after = max(0, self.tail_last - LOOKBACK)
        while True:
            rows = await self._store(self.store.events_after, after, PAGE)
            for row in rows:
                rid = row["id"]
                after = rid
                if rid in self._sent:
                    continue
                self._sent[rid] = None
                if len(self._sent) > 4 * LOOKBACK:
                    self._sent.popitem(last=False)
                self.tail_last = max(self.tail_last, rid)
                self._hand_out(row)
            if len(rows) < PAGE:
                return

    def _hand_out(self, row: dict) -> None:
        frame = None
        for client in list(self.clients):
            if not client.live or row["id"] <= client.floor:
                continue   # before the client's stream began, or already sent by its replay
            if not client.may_see(row):
                continue
            if frame is None:
                frame = _frame(row)
            try:
                client.queue.put_nowait(frame)
            except asyncio.QueueFull:
                self.slow_disconnects += 1
                self.clients.discard(client)
                client.writer.close()

    # --- HTTP ---------------------------------------------------------------------------------------------
    async def handle(self, reader, writer) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ConnectionError):
            writer.close()
            return
        try:
            method, target, headers = _parse(head)
        except ValueError:
            await _answer(writer, 400, {"error": "Bad request", "code": "malformed_http"})
            return
        path, _, query = target.partition("?")
        args = {k: v[0] for k, v in parse_qs(query, keep_blank_values=True).items()}
        origin = headers.get("origin")
        cors = _fields(self.headers.cors_headers(origin)) if origin else b""
        if method == "OPTIONS" and self.headers.cors_enabled() and headers.get("access-control-request-method"):
            # A CORS preflight, as the gateway answers it (before routing, never authenticated or counted).
            writer.write(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n%s%s%s\r\n" % (
                _fields(self.headers.preflight(origin).headers), cors, _SECURITY))
            await _close(writer)
        elif path not in ("/events", "/health", "/metrics"):
            await _answer(writer, 404, {"error": "Not found", "code": "not_found"}, cors)
        elif method != "GET":
            await _answer(writer, 405, {"error": "Method not allowed", "code": "method_not_allowed"},
                          b"Allow: GET\r\n" + cors)
        elif path == "/health":
            await _answer(writer, 200, {"status": "ok", "connections": len(self.clients),
                                        "delivered": self.delivered}, cors)
        elif path == "/metrics":
            await self._metrics(writer, headers, cors)
        else:
            await self._events(writer, headers, args, cors)

    async def _metrics(self, writer, headers: dict, cors: bytes = b"") -> None:
        if self.metrics_token is not None:
            # It takes the admin key: each attempt spends a token of the address's bucket first, as /events does
            # (else a 401 or 200 here would test admin keys at any rate).
            extra = await self._spend(writer, self._peer(writer, headers), cors)
            if extra is None:
                return
            scheme, _, presented = headers.get("authorization", "").strip().partition(" ")
            caller = await self._store(self.auth.authenticate, headers.get("x-api-key"), None)
            ok = (caller is not None and caller.admin and caller.via != "open") or (
                scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode("utf-8", "replace"),
                                                                  self.metrics_token))
            if not ok:
                await _answer(writer, 401, {"error": "Unauthorized", "code": "unauthorized"},
                              _METRICS_CHALLENGE + extra)
                return
        lines = [
            "# HELP queryapigate_events_streams Open event streams.", "# TYPE queryapigate_events_streams gauge",
            f"queryapigate_events_streams {len(self.clients)}",
            "# HELP queryapigate_events_delivered_total Events sent live.",
            "# TYPE queryapigate_events_delivered_total counter",
            f"queryapigate_events_delivered_total {self.delivered}",
            "# HELP queryapigate_events_replayed_total Events sent on resume (Last-Event-ID).",
            "# TYPE queryapigate_events_replayed_total counter",
            f"queryapigate_events_replayed_total {self.replayed}",
            "# HELP queryapigate_events_slow_disconnects_total Clients disconnected for falling 1000 events behind.",
            "# TYPE queryapigate_events_slow_disconnects_total counter",
            f"queryapigate_events_slow_disconnects_total {self.slow_disconnects}",
        ]
        body = ("\n".join(lines) + "\n").encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n%s%s%s\r\n%s"
                     % (len(body), _NO_STORE, cors, _SECURITY, body))
        await _close(writer)

    def _peer(self, writer, headers: dict) -> str | None:
        """The client address as the main server reads it (request.py): X-Forwarded-For's hop QAG_TRUST_PROXY
        names, else the socket peer; what a key's allowed_ips and the address's rate-limit bucket are judged on."""
        socket_peer = (writer.get_extra_info("peername") or (None,))[0]
        return client_of({"REMOTE_ADDR": socket_peer, "HTTP_X_FORWARDED_FOR": headers.get("x-forwarded-for", ""),
                        "HTTP_X_FORWARDED_PROTO": headers.get("x-forwarded-proto", "")}, self.trust_proxy)[0]

    async def _spend(self, writer, peer: str | None, cors: bytes) -> bytes | None:
        """Contract 8.6/6.6: one token of the address's bucket per attempt, before authentication (401s count
        too). The headers to add to the answer, or None when it was refused here (429)."""
        extra = cors
        if self.address_buckets is not None:
            count, period = self.rate_limit
            left, retry_after = await self._store(self.address_buckets.take, peer or "", count, period)
            extra += b"X-RateLimit-Limit: %d\r\nX-RateLimit-Remaining: %d\r\n" % (count, left)
            if retry_after:
                await _refuse(writer, QagError("rate_limited", "Rate limit exceeded", retry_after=retry_after), extra)
                return None
        return extra

    async def _events(self, writer, headers: dict, args: dict, cors: bytes = b"") -> None:
        key_header = headers.get("x-api-key")
        authorization = headers.get("authorization")
        socket_peer = (writer.get_extra_info("peername") or (None,))[0]
        peer = self._peer(writer, headers)
        extra = await self._spend(writer, peer, cors)
        if extra is None:
            return
        try:
            caller = await self._store(self.auth.authenticate, key_header, peer, authorization)
        except QagError as refused:   # a bad bearer token: its code and challenges, as the gateway answers it
            await _refuse(writer, refused, _fields(refused.headers) + extra)
            return
        if caller is None:
            await _answer(writer, 401, {"error": "Unauthorized", "code": "unauthorized"},
                          _fields(self.auth.challenges) + extra)
            return
        if caller.via == "open":
            try:   # judged on the socket's peer, never on X-Forwarded-For (contract 1.4), and refused when relayed
                guard_open_mode(socket_peer, headers.get("host"), headers.get("origin"), self.headers,
                                relayed_clients(headers.get("forwarded"),
                                                (headers.get(name) for name in _RELAY_NAMES)),
                                headers.get("sec-fetch-site"))
            except QagError as refused:
                await _refuse(writer, refused, extra)
                return
        try:
            filters = read_filters(args)
        except QagError as error:
            await _answer(writer, error.status, {"error": error.message, "code": error.code}, extra)
            return
        if len(self.clients) >= self.max_connections:
            await _answer(writer, 503, {"error": "Too many open event streams - try again in a few seconds",
                                        "code": "too_many_streams", "retry_after": 5}, b"Retry-After: 5\r\n" + extra)
            return
        resume_id = _resume_id(headers.get("last-event-id", args.get("last_event_id")))
        since = 0
        if caller.via == "jwt":
            since = int(time.time())   # a signed-in user has no creation date: its own runs from now on
        elif not caller.admin:
            row = await self._store(self.store.get_key, caller.name)
            since = _since(row and row.get("created_at"))
        client = Client(caller, since, filters, self.tail_last if resume_id is None else resume_id, writer,
                        key_header, peer, authorization if caller.via == "jwt" else None)
        self.clients.add(client)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                     b"X-Accel-Buffering: no\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n" + extra + _SECURITY
                     + b"\r\n" + _chunk(b"retry: 3000\n\n"))
        try:
            await writer.drain()
            if resume_id is not None:
                await self._replay(client)
            client.live = True
            await self._stream(client)
        except (ConnectionError, OSError):
            pass
        finally:
            self.clients.discard(client)
            writer.close()

    async def _replay(self, client: Client) -> None:
        """Every event after the client's id that it may see, then live without a gap: the client turns live only
        once it has read as far as the tail has handed out (nothing awaited between that check and going live)."""
        while True:
            rows = await self._store(self.store.events_after, client.floor, PAGE)
            frames = []
            for row in rows:
                client.floor = row["id"]
                if client.may_see(row):
                    frames.append(_frame(row))
            if frames:
                self.replayed += len(frames)
                client.writer.write(_chunk(b"".join(frames)))
                await client.writer.drain()
            if len(rows) < PAGE and client.floor >= self.tail_last:
                return

    async def _stream(self, client: Client) -> None:
        checked = time.monotonic()
        writer = client.writer
        while client in self.clients:
            try:
                frames = [await asyncio.wait_for(client.queue.get(), KEEPALIVE)]
            except asyncio.TimeoutError:
                writer.write(_chunk(b": keepalive\n\n"))
            else:
                while not client.queue.empty():
                    frames.append(client.queue.get_nowait())
                self.delivered += len(frames)
                writer.write(_chunk(b"".join(frames)))
            await writer.drain()
            if time.monotonic() - checked >= RECHECK:
                checked = time.monotonic()
                try:
                    still = await self._store(self.auth.authenticate, client.header, client.peer,
                                              client.authorization)
                except QagError:
                    still = None   # a signed-in user's token expired
                if still is None:
                    return   # revoked, expired or deactivated: the stream ends

    # --- running ------------------------------------------------------------------------------------------
    async def serve(self, host: str, port: int, ready=None) -> None:
        server = await asyncio.start_server(self.handle, host, port, limit=HEAD_LIMIT)
        tail = asyncio.create_task(self.tail())
        bound = server.sockets[0].getsockname()
        print(f"qag events: listening at http://{bound[0]}:{bound[1]}", flush=True)
        if ready is not None:
            ready(bound)
        try:
            async with server:
                await server.serve_forever()
        finally:
            tail.cancel()


def _frame(row: dict) -> bytes:
    payload = json.dumps(event(row), separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")
    return b"id: %d\ndata: %s\n\n" % (row["id"], payload)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _parse(head: bytes) -> tuple[str, str, dict]:
    lines = head.decode("latin-1").split("\r\n")
    method, target, version = lines[0].split(" ")
    if not version.startswith("HTTP/1."):
        raise ValueError(version)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, sep, value = line.partition(":")
            if not sep:
                raise ValueError(line)
            name, value = name.strip().lower(), value.strip()
            # A repeated field is joined, as the main server's workers join it (so X-Forwarded-For's hops are the
            # same list there and here, and a second Host or X-API-Key is no way around what the first says).
            headers[name] = f"{headers[name]},{value}" if name in headers else value
    return method, target, headers


async def _answer(writer, status: int, body: dict, extra: bytes = b"") -> None:
    data = json.dumps(body).encode()
    writer.write(b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n"
                 b"%s%s%s\r\n%s" % (status, _STATUS[status].encode(), len(data), _NO_STORE, extra, _SECURITY, data))
    await _close(writer)


async def _refuse(writer, error: QagError, extra: bytes = b"") -> None:
    """A refusal with its code and extras (retry_after, also as Retry-After), as the other answers here: no
    request id."""
    if "retry_after" in error.extras:
        extra += b"Retry-After: %d\r\n" % error.extras["retry_after"]
    await _answer(writer, error.status, {"error": error.message, "code": error.code, **error.extras}, extra)


async def _close(writer) -> None:
    try:
        await writer.drain()
    except (ConnectionError, OSError):
        pass
    writer.close()
