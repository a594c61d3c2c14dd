"""Every setting declared once: environment names, type, default, doc; validated at startup."""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

FLAG_ON = ("1", "true", "yes", "on")
FLAG_OFF = ("0", "false", "no", "off")
# QAG_* names qag's own tests, benchmarks and build read; no qag process does, so none of them is a setting.
ALLOWED_PREFIXES = ("QAG_TEST_", "QAG_BENCH_", "QAG_BUILD_")
# QueryAPIGate's serve command reads these two; load() makes them QAG_BIND.
_BIND_PARTS = ("QUERYAPIGATE_HOST", "QUERYAPIGATE_PORT")


class SettingsError(ValueError):
    """An invalid setting; its message is the one line printed at startup."""


@dataclass(frozen=True)
class Setting:
    """One environment setting: canonical name, contract alias, parser, default and doc."""

    name: str
    parse: Callable[[str, "Setting"], Any]
    default: Any
    doc: str
    accepted: str
    alias: str | None = None
    secret: bool = False  # NAME_FILE form accepted, value never printed

    @property
    def attr(self) -> str:
        return self.name[len("QAG_"):].lower()


def _flag(text: str, s: Setting) -> bool:
    word = text.strip().lower()
    if word in FLAG_ON:
        return True
    if word in FLAG_OFF:
        return False
    raise SettingsError(f"{s.name} must be one of {s.accepted}, not {text!r}")


# Numbers are read from ASCII digits only: int() and float() also take other scripts' digits, "1_000", "nan" and
# "infinity", and "²" passes str.isdigit() (then fails int() with a message naming no setting).
_INT_TEXT = re.compile(r"[+-]?[0-9]+", re.ASCII)
_FLOAT_TEXT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)
_PORT_TEXT = re.compile(r"[0-9]{1,5}", re.ASCII)

# PostgreSQL's statement_timeout is an int of milliseconds (at most 2147483.647 s, about 24.8 days), and a call
# waits for its reply that long plus a second (qag/backends/watchdog.py NETWORK_MARGIN) in poll(), whose timeout
# is an int of milliseconds too: the longest time limit, in whole seconds, that both take.
STATEMENT_TIMEOUT_MAX = 2_147_482


def _int_range(lo: int, hi: int | None):
    def parse(text: str, s: Setting) -> int:
        word = text.strip()
        if not _INT_TEXT.fullmatch(word):
            raise SettingsError(f"{s.name} must be {s.accepted}, not {text!r}")
        value = int(word)
        if value < lo or (hi is not None and value > hi):
            raise SettingsError(f"{s.name} must be {s.accepted}, not {text!r}")
        return value
    return parse


def _optional_int(lo: int, hi: int | None):
    inner = _int_range(lo, hi)

    def parse(text: str, s: Setting) -> int | None:
        return None if text.strip() == "" else inner(text, s)
    return parse


def _number(text: str, s: Setting) -> float:
    """A finite number written in ASCII (1, 0.5, 1e3), else the setting's one-line refusal."""
    word = text.strip()
    if not _FLOAT_TEXT.fullmatch(word):
        raise SettingsError(f"{s.name} must be {s.accepted}, not {text!r}")
    value = float(word)
    if value in (float("inf"), float("-inf")):   # 1e400
        raise SettingsError(f"{s.name} must be {s.accepted}, not {text!r}")
    return value


def _seconds(allow_zero: bool, hi: float):
    """Seconds from 0 (or above 0) to `hi`: every such setting becomes whole milliseconds or nanoseconds somewhere
    (a time limit, a deadline, a TTL), so an absurd value is refused here rather than overflowing there."""
    def parse(text: str, s: Setting) -> float:
        value = _number(text, s)
        if value < 0 or (value == 0 and not allow_zero) or value > hi:
            raise SettingsError(f"{s.name} must be {s.accepted}, not {text!r}")
        return value
    return parse


def _seconds_max(hi: float):
    return _seconds(True, hi)


def _text(text: str, s: Setting) -> str:
    return text


def _text_or_default(text: str, s: Setting) -> str:
    return text if text.strip() else s.default  # an empty folder would mean the current directory


def _exact_secret(text: str, s: Setting) -> str:
    """A key, token or HMAC secret is used exactly as given, never trimmed (that would change it silently): empty,
    or with whitespace at either end (which HTTP trims from a header, so such a key could never match), or with a
    control character, it is refused. The value is never shown."""
    if text.strip() == "":
        raise SettingsError(f"{s.name} is set but empty")
    if text != text.strip():
        raise SettingsError(f"{s.name} starts or ends with whitespace (a space, tab or newline; a _FILE may end in "
                            f"one newline), which can't be meant: remove it")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        raise SettingsError(f"{s.name} holds a control character, which no HTTP header can carry: remove it")
    return text


def _choice(*choices: str):
    def parse(text: str, s: Setting) -> str:
        word = text.strip().lower()
        if word not in choices:
            raise SettingsError(f"{s.name} must be one of {s.accepted}, not {text!r}")
        return word
    return parse


def _bind(text: str, s: Setting) -> str:
    value = text.strip()
    if value.startswith("unix:"):
        if not unix_path(value).strip():
            raise SettingsError(f"{s.name} must name the socket's path after unix: (unix:/run/qag/qag.sock), "
                                f"not {text!r}")
        return value
    host, sep, port = value.rpartition(":")
    if not sep or not _PORT_TEXT.fullmatch(port) or not 0 <= int(port) < 65536:
        raise SettingsError(f"{s.name} must be {s.accepted}, not {text!r}")
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        # gunicorn reads ::1:7501 as host "" and port ":1:7501": an IPv6 address is written in brackets.
        raise SettingsError(f"{s.name} must be host:port with an IPv6 address in brackets ([::1]:{int(port)}), "
                            f"not {text!r}")
    if "[" in host or "]" in host:
        import ipaddress
        try:
            if not (host.startswith("[") and host.endswith("]")):
                raise ValueError(host)
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise SettingsError(f"{s.name} must be {s.accepted} (an IPv6 address in brackets), not {text!r}") from None
    # ":5000" (or ":0", any free port) is this machine only, as qag's default: never every interface by accident.
    return f"{host}:{int(port)}" if host else f"127.0.0.1:{int(port)}"


def unix_path(bind: str) -> str:
    """The path of a unix: bind address, as gunicorn reads it (unix:PATH or unix://PATH)."""
    return bind[len("unix://"):] if bind.startswith("unix://") else bind[len("unix:"):]


def _optional_bind(text: str, s: Setting) -> str | None:
    return None if text.strip() == "" else _bind(text, s)


def _rate(text: str, s: Setting) -> float:
    value = _number(text, s)
    if not 0 < value <= 1:
        raise SettingsError(f"{s.name} must be {s.accepted}, not {text!r}")
    return value


def _token(text: str, s: Setting) -> str:
    _exact_secret(text, s)
    if len(text) < 16:
        raise SettingsError(f"{s.name} must be at least 16 characters long")
    return text


# The contract's rate-limit syntax, for QAG_RATE_LIMIT and a key's or role's rate_limit grant (qag/policy).
RATE_LIMIT_RE = re.compile(r"^\s*([0-9]+)\s*/\s*(second|minute|hour|day)s?\s*$", re.IGNORECASE | re.ASCII)
RATE_LIMIT_MAX = 10 ** 18 - 1    # what /openapi.json publishes (18 digits): the host's buckets hold 64-bit counts
PERIOD_SECONDS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}


def parse_rate_limit(text: str) -> tuple[int, int]:
    """'60/minute' → (60, 60); ValueError unless the contract's rate-limit syntax with a count ≥ 1."""
    if not isinstance(text, str):
        raise ValueError("a rate limit is a string like '60/minute'")
    match = RATE_LIMIT_RE.match(text)
    if match is None:
        raise ValueError(f"not a rate limit: {text!r}")
    count = int(match.group(1))
    if not 1 <= count <= RATE_LIMIT_MAX:
        raise ValueError(f"a rate limit needs a count from 1 to {RATE_LIMIT_MAX}: {text!r}")
    return count, PERIOD_SECONDS[match.group(2).lower()]


def _rate_limit(text: str, s: Setting) -> tuple[int, int] | None:
    if text.strip() == "":
        return None
    try:
        return parse_rate_limit(text)
    except ValueError:
        raise SettingsError(f"{s.name} must look like '60/minute' (a positive count, then second, minute, hour or "
                            f"day), not {text!r}") from None


def _redis_url(text: str, s: Setting) -> str | None:
    url = text.strip()
    if url == "":
        return None
    if not url.startswith(("redis://", "rediss://", "unix://")):
        # Never echo the value: a Redis URL can hold a password.
        raise SettingsError(f"{s.name} must be {s.accepted}")
    try:
        from redis.connection import parse_url  # refused now rather than on the first call
    except ImportError:
        raise SettingsError(f"{s.name} is set but the redis package is missing: pip install 'qag[redis]'") from None
    try:
        parse_url(url)  # the client's own reading, without connecting
    except Exception:  # its message may quote part of the password: never shown
        raise SettingsError(f"{s.name} is not a Redis URL the client can read (host, port and database number, "
                            f"with special characters of the password percent-encoded)") from None
    _redis_db(url, s)
    return url


def _redis_db(url: str, s: Setting) -> None:
    """The database number as redis-py would read it, checked: it ignores a path that is no number (redis://h/abc
    quietly uses database 0) and reads /1/2 as 12."""
    from urllib.parse import parse_qs, unquote, urlsplit
    parts = urlsplit(url)
    given = []
    if parts.scheme != "unix" and unquote(parts.path) not in ("", "/"):
        given.append(unquote(parts.path)[1:])
    given += parse_qs(parts.query).get("db", [])
    for db in given:
        if not _INT_TEXT.fullmatch(db) or db.startswith(("+", "-")) or int(db) > 2_147_483_647:
            raise SettingsError(f"{s.name}'s database number (redis://host:6379/0, or ?db=0) must be a whole "
                                f"number from 0; this URL's is not")


def _database_url(text: str, s: Setting) -> str | None:
    url = text.strip()
    if url == "":
        return None
    if not url.startswith(("postgresql://", "postgres://")):
        # Never echo the value: it can hold a password.
        raise SettingsError(f"{s.name} must be {s.accepted}")
    try:
        from psycopg2.extensions import parse_dsn  # refused now rather than on the first call
    except ImportError:
        raise SettingsError(f"{s.name} is set but psycopg2 is missing: pip install 'qag[postgres]'") from None
    try:
        parse_dsn(url)  # libpq's own reading, without connecting
    except Exception:  # its message may quote the password: never shown
        raise SettingsError(f"{s.name} is not a URL libpq can read (check the percent-encoding of special "
                            f"characters such as % @ / in the user name and password)") from None
    return url


def _optional_text(text: str, s: Setting) -> str | None:
    return text.strip() or None


def _csv(text: str, s: Setting) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _jwt_secret(text: str, s: Setting) -> str:
    _exact_secret(text, s)
    # A short HMAC secret can be brute-forced offline from any one token it signed.
    if len(text.encode("utf-8")) < 32:
        raise SettingsError(f"{s.name} must be at least 32 bytes long")
    return text


def _jwks_url(text: str, s: Setting) -> str | None:
    from .bearer import key_source_url
    url = text.strip()
    if url == "":
        return None
    # Keys fetched over plain HTTP could be swapped in transit; loopback is for tests and sidecars.
    if not key_source_url(url):
        raise SettingsError(f"{s.name} must be {s.accepted}")
    return url


# Characters a URL qag puts inside a quoted WWW-Authenticate parameter or a route may hold: RFC 3986's unreserved,
# sub-delims and ":" "/" "@" "[" "]": no quote, backslash or space, and no %-escapes (a route is matched decoded).
_URL_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~!$&'()*+,;=:/@[]")


def _oauth_url(text: str, s: Setting, what: str) -> str:
    """An absolute https URL (http only for a loopback host: tests, a local agent) without query, fragment or user
    information, as RFC 8707 resource indicators and RFC 8414 issuers are."""
    from urllib.parse import urlsplit
    url = text.strip()
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port   # .port raises for a port that is no number or out of range
    except ValueError:
        host = port = parts = None
    scheme = parts.scheme.lower() if parts is not None else ""
    if (parts is None or not set(url) <= _URL_CHARS or scheme not in ("https", "http") or not host
            or (scheme == "http" and host not in ("localhost", "127.0.0.1", "::1")) or parts.query or parts.fragment
            or "@" in parts.netloc or port == 0):
        raise SettingsError(f"{s.name} must be {s.accepted} ({what}), not {text!r}")
    return url


def _resource_url(text: str, s: Setting) -> str | None:
    if text.strip() == "":
        return None
    from .bearer import audience_key
    # Kept in the form tokens' `aud` is compared in, so the metadata document names exactly what is accepted.
    return audience_key(_oauth_url(text, s, "the URL agents connect to, /mcp included"))


def _auth_servers(text: str, s: Setting) -> tuple[str, ...]:
    # Issuer identifiers are compared as exact strings by clients (RFC 8414 3.3): kept as written.
    return tuple(_oauth_url(part, s, "an authorization server's issuer URL") for part in _csv(text, s))


def _scopes(text: str, s: Setting) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(part for part in text.replace(",", " ").split() if part))
    for name in names:
        # RFC 6749 3.3 scope-token: printable ASCII without space, quote or backslash.
        if not all(0x21 <= ord(c) <= 0x7E and c not in '"\\' for c in name):
            raise SettingsError(f"{s.name} must be {s.accepted}, not {text!r}")
    return names


def _origins(text: str, s: Setting) -> tuple[str, ...]:
    items = [o.strip().rstrip("/").lower() for o in text.split(",")]
    return tuple(o for o in items if o)


SETTINGS: tuple[Setting, ...] = (
    Setting("QAG_HOME", _text, None, "Folder of the store (qag.db) and base of relative SQLite connection paths; default: the current directory.",
            "a folder path", alias="QUERYAPIGATE_HOME"),
    Setting("QAG_DATABASE_URL", _database_url, None, "The store on PostgreSQL, shared by several instances (migrated on start, one instance at a time); unset = SQLite (qag.db) in QAG_HOME. Options such as sslmode or options=-csearch_path=... go in the URL.",
            "a postgresql:// or postgres:// URL", alias="QUERYAPIGATE_DATABASE_URL", secret=True),
    Setting("QAG_STORE_TIMEOUT", _seconds_max(3600.0), 10.0, "Seconds a PostgreSQL store (QAG_DATABASE_URL) has to answer each statement, commit included: the server cancels it then (statement_timeout; also a transaction left waiting that long), and a reply that has not come 1 s later ends the connection (a stalled server or network path). The call gets 503 unavailable with Retry-After; the history, quota and metadata threads try again later. 0 = no limit (not advised: a stalled store then holds request threads until it answers). `qag store copy` and migrations at startup are not limited.",
            "a number of seconds from 0 to 3600"),
    Setting("QAG_API_KEY", _exact_secret, None, "The admin key: grants everything. Unset with no scoped keys stored = open mode (loopback callers only; a request a proxy relays for a client elsewhere, named in X-Forwarded-For, Forwarded, X-Real-IP or a CDN's client header, is refused, and public routes answer it as anyone).",
            "non-empty text, without whitespace at either end", alias="QUERYAPIGATE_API_KEY", secret=True),
    Setting("QAG_ALLOW_WRITES", _flag, False, "Server-wide ceiling for writes: statements that write run only when this is on and the caller may write.",
            "1/true/yes/on or 0/false/no/off", alias="QUERYAPIGATE_ALLOW_WRITES"),
    Setting("QAG_QUERY_TIMEOUT", _seconds(True, STATEMENT_TIMEOUT_MAX), 30.0, "Statement time limit in seconds; 0 = none. A request or key may only lower it. At most 2147482 (about 24.8 days: PostgreSQL's longest statement_timeout, less the second qag waits beyond it); a request's own longer timeout is cut to PostgreSQL's longest.",
            "a number of seconds from 0 to 2147482", alias="QUERYAPIGATE_QUERY_TIMEOUT"),
    Setting("QAG_MAX_PAGE_SIZE", _int_range(1, 1_000_000), 1000, "Largest page_size a caller may ask for.",
            "a whole number from 1 to 1000000", alias="QUERYAPIGATE_MAX_PAGE_SIZE"),
    Setting("QAG_STREAM_MAX_ROWS", _optional_int(1, None), None, "Row cap for stream=true exports (silently truncates); unset = unbounded.",
            "a positive whole number", alias="QUERYAPIGATE_STREAM_MAX_ROWS"),
    Setting("QAG_MAX_STREAMS", _optional_int(0, 10_000), None, "stream=true exports sending at once per worker process (each holds one of its QAG_THREADS request threads while its client reads, so a client that never reads holds it up to the call's time limit); one more is refused with 503 too_many_streams (Retry-After: 5); 0 turns streams off; unset = QAG_THREADS / 2 (at least 1).",
            "a whole number from 0 to 10000"),
    Setting("QAG_MCP_MAX_ROWS", _int_range(1, 1_000_000), 200, "Rows one MCP tool call returns at most (a key's max_rows narrows it; QAG_MAX_PAGE_SIZE doesn't apply); the result says when it was cut.",
            "a whole number from 1 to 1000000", alias="QUERYAPIGATE_MCP_MAX_ROWS"),
    Setting("QAG_MCP_API_KEY", _exact_secret, None, "The key `qag mcp` (MCP over stdio) calls with: its tools, grants and limits are this key's; unset = QAG_API_KEY (the admin key), or open mode.",
            "an API key (sk_...)", secret=True),
    Setting("QAG_PARQUET_ROW_GROUP", _int_range(100, 1_000_000), 10_000, "Rows per row group of a parquet stream: a stream holds at most this many rows (and their encoding) in memory, however long it is. A paged xlsx, xml, yaml or parquet body is bounded by QAG_MAX_PAGE_SIZE.",
            "a whole number from 100 to 1000000"),
    Setting("QAG_BIND", _bind, "127.0.0.1:5000", "Address `qag serve` listens on (host:port, port 0 = any free port, :port = 127.0.0.1:port, or unix:/path); a port in use stops startup with one line.",
            "host:port or unix:/path"),
    Setting("QAG_ADMIN_BIND", _optional_bind, None, "A second address, for operators only, that serves /metrics, /livez, /readyz and /health and nothing else; while it is set, QAG_BIND answers 404 for /metrics. Unset = everything on QAG_BIND, where /metrics is public unless QAG_METRICS_TOKEN is set (the contract's default) and names every API key and connection.",
            "host:port or unix:/path"),
    Setting("QAG_WORKERS", _int_range(1, 256), 2, "gunicorn worker processes for `qag serve`.",
            "a whole number from 1 to 256"),
    Setting("QAG_THREADS", _int_range(1, 256), 8, "Request threads per worker process.",
            "a whole number from 1 to 256", alias="QUERYAPIGATE_THREADS"),
    Setting("QAG_POOL_SIZE", _optional_int(0, 1024), None, "Idle pooled connections kept per database and access mode in each worker; 0 = no pooling; unset = QAG_THREADS.",
            "a whole number from 0 to 1024", alias="QUERYAPIGATE_POOL_SIZE"),
    Setting("QAG_POOL_IDLE_TIMEOUT", _seconds(False, 86400.0), 300.0, "Seconds an idle pooled connection is kept before it is closed instead of reused.",
            "a number of seconds > 0, at most 86400", alias="QUERYAPIGATE_POOL_IDLE_TIMEOUT"),
    Setting("QAG_POOL_MAX", _optional_int(1, 1024), None, "Cap on open connections per database and access mode in each worker; callers beyond it wait QAG_POOL_WAIT, then get 503. Unset = no cap.",
            "a whole number from 1 to 1024"),
    Setting("QAG_POOL_WAIT", _seconds(False, 3600.0), 5.0, "Seconds a caller waits for a connection under QAG_POOL_MAX before it gets 503 with Retry-After.",
            "a number of seconds > 0, at most 3600"),
    Setting("QAG_SPIN_US", _int_range(0, 10000), 200, "Microseconds a worker thread that is alone in its wait looks for its next bytes without sleeping, before it sleeps until they come: a pool thread when no other is answering a request (the next request), a PostgreSQL or MySQL call when no other waits for a reply of its database (the reply). An idle core halts, and waking it takes longer than a lone caller's next request or a short query's reply (on a virtual machine above all). Spent only while the worker has nothing else to do; after a spin that ended before its bytes came, waits sleep at once until one ends sooner than a spin would have. 0 = always sleep.",
            "a whole number of microseconds from 0 to 10000"),
    Setting("QAG_WORKER_SCHED", _choice("batch", "normal"), "batch", "Linux scheduling policy of a worker's threads: batch (SCHED_BATCH: a thread woken by its database's reply or a request's bytes waits for the running thread to block, rather than preempting it, so the interpreter lock changes hands when a thread is done, not in the middle of its work: fewer context switches per call) or normal (SCHED_OTHER, the system's default). Set for the worker process as it starts, before its threads; elsewhere than Linux, nothing.",
            "batch or normal"),
    Setting("QAG_TIMEOUT", _int_range(1, 86400), 120, "Seconds a worker may stay silent before the gunicorn master restarts it.",
            "a whole number of seconds from 1 to 86400"),
    Setting("QAG_GRACEFUL_TIMEOUT", _int_range(1, 86400), 30, "Seconds in-flight requests get to finish on shutdown or reload.",
            "a whole number of seconds from 1 to 86400"),
    Setting("QAG_WORKER_CLASS", _choice("qag", "gthread"), "qag", "gunicorn worker class of `qag serve`: qag's own (qag.worker.QagWorker: compiled HTTP parsing, a selector thread and QAG_THREADS app threads) or gunicorn's gthread.",
            "qag or gthread"),
    Setting("QAG_CLIENT_TIMEOUT", _int_range(1, 3600), 30, "qag worker: seconds a client has to send a whole request (head and body) once it starts, to take each part of an answer (any progress starts the time again; a stream: each of its writes), and for a request that came while every app thread was busy to wait for one past the keep-alive deadline; a slower client is disconnected without holding an app thread (a stream's thread waits for it). gthread: seconds a request (head and body) has to arrive once a thread takes it, and each part of an answer may wait.",
            "a whole number of seconds from 1 to 3600"),
    Setting("QAG_MAX_BODY_BYTES", _int_range(1, 1 << 30), 1_048_576, "Largest request body; a larger one is refused with 413 before it is read.",
            "a whole number of bytes from 1 to 1073741824"),
    Setting("QAG_SPEEDUPS", _choice("auto", "require", "off"), "auto", "Whether qag's compiled modules (qag/_speedups/compiled.py lists them) or their pure-Python twins run, all of one kind: compiled when every build is present and built from the current source, else pure with a warning at startup (auto); compiled or refuse to start (require); pure (off). `qag version` names each choice, the HTTP parser included. Read once, when qag is imported.",
            "auto, require or off"),
    Setting("QAG_ACCESS_LOG", _flag, False, "gunicorn's access log on stdout (path without the query string). Off by default, unlike QueryAPIGate: qag's own request line (QAG_LOG_REQUESTS) says the same once per request, with the key.",
            "1/true/yes/on or 0/false/no/off", alias="QUERYAPIGATE_ACCESS_LOG"),
    Setting("QAG_CORS_ORIGINS", _origins, (), "Comma list of browser origins allowed by CORS, or *; unset = CORS off.",
            "a comma-separated list of origins, or *", alias="QUERYAPIGATE_CORS_ORIGINS"),
    Setting("QAG_HSTS_MAX_AGE", _optional_int(1, 63_072_000), None, "Strict-Transport-Security max-age, sent only on HTTPS requests; unset = off.",
            "a whole number of seconds from 1 to 63072000", alias="QUERYAPIGATE_HSTS_MAX_AGE"),
    Setting("QAG_TRUST_PROXY", _int_range(0, 16), 0, "Reverse-proxy hops whose X-Forwarded-For/-Proto are trusted; 0 = judge the socket peer. The client address is the entry that many hops from the right, read as the address it names (a :port, [brackets], an IPv6 zone and ::ffff: mapping dropped) for rate limits, allowed_ips and logs.",
            "a whole number from 0 to 16", alias="QUERYAPIGATE_TRUST_PROXY"),
    Setting("QAG_RATE_LIMIT", _rate_limit, None, "Server-wide rate limit per client address (token bucket, before authentication; not /health, /livez, /readyz, /metrics, OPTIONS). Counted for every worker of the host (in Redis for every instance with QAG_REDIS_URL); `qag events` counts its connection attempts to /events in the same buckets (its own, without Redis). Unset = off.",
            "N/second, N/minute, N/hour or N/day (N >= 1, plural accepted)", alias="QUERYAPIGATE_RATE_LIMIT"),
    Setting("QAG_AUDIT_LOG_LIMIT", _int_range(1, 10_000_000), 500, "Audit-log entries kept (newest first); also bounds GET /api/v1/connections/deleted.",
            "a whole number from 1 to 10000000", alias="QUERYAPIGATE_AUDIT_LOG_LIMIT"),
    Setting("QAG_ACCESS_LOG_QUERY", _flag, False, "Keep the query string in gunicorn's access log (parameter values can be personal data).",
            "1/true/yes/on or 0/false/no/off", alias="QUERYAPIGATE_ACCESS_LOG_QUERY"),
    Setting("QAG_LOG_REQUESTS", _flag, True, "A log line per request (not /health, /livez, /readyz, /metrics) and per executed query; off keeps warnings and errors only.",
            "1/true/yes/on or 0/false/no/off", alias="QUERYAPIGATE_LOG_REQUESTS"),
    Setting("QAG_LOG_STATEMENTS", _flag, False, "Also a line per executed statement (`Executing on <connection> (<dialect>), limit=... offset=... timeout=...: <sql>`, as QueryAPIGate wrote under QUERYAPIGATE_LOG_REQUESTS); off by default, so a request is one line. Needs QAG_LOG_REQUESTS.",
            "1/true/yes/on or 0/false/no/off"),
    Setting("QAG_JSON_LOGS", _flag, False, "qag's log lines as JSON objects (time, level, logger, request_id, key, message and structured extras).",
            "1/true/yes/on or 0/false/no/off", alias="QUERYAPIGATE_JSON_LOGS"),
    Setting("QAG_LOG_BUFFER", _int_range(100, 10_000_000), 10_000, "Log lines queued per worker for its writer thread; beyond it the oldest are dropped and counted (qag_log_lines_dropped_total).",
            "a whole number from 100 to 10000000"),
    Setting("QAG_SLOW_QUERY_THRESHOLD", _seconds(True, STATEMENT_TIMEOUT_MAX), 1.0, "Seconds of database time after which a run is logged as a slow-query warning; 0 = off.",
            "a number of seconds from 0 to 2147482", alias="QUERYAPIGATE_SLOW_QUERY_THRESHOLD"),
    Setting("QAG_SERVER_TIMING", _flag, False, "Add a Server-Timing header (auth, bind, policy, cache, query, encode durations) to responses.",
            "1/true/yes/on or 0/false/no/off"),
    Setting("QAG_OTEL", _choice("auto", "on", "off"), "auto", "OpenTelemetry tracing: continue an incoming W3C traceparent, a span per request and per stage (auth, bind, policy, cache, database, encode) exported over OTLP/HTTP, the trace id in log lines and run history. auto = on when OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set; on = always (default endpoint http://localhost:4318); OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none turns it off. Configured by the standard OTEL_* variables (service name, endpoint, headers, sampler, batching). Needs pip install 'qag[otel]'; off, nothing of OpenTelemetry is imported.",
            "auto, on or off"),
    Setting("QAG_METRICS_TOKEN", _token, None, "Bearer token /metrics requires (the admin key also works); unset = /metrics is public.",
            "text of at least 16 characters", alias="QUERYAPIGATE_METRICS_TOKEN", secret=True),
    Setting("QAG_MASK_KEY", _exact_secret, None, "HMAC key of the `hash` masking action; unset = a random key generated once and kept in the store (shared by every instance using it).",
            "non-empty text, without whitespace at either end", alias="QUERYAPIGATE_MASK_KEY", secret=True),
    Setting("QAG_HISTORY_LIMIT", _int_range(1, 1_000_000), 50, "Runs kept in history per saved-query version (the newest), trimmed after each batch write.",
            "a whole number from 1 to 1000000", alias="QUERYAPIGATE_HISTORY_LIMIT"),
    Setting("QAG_HISTORY_ADHOC_LIMIT", _int_range(1, 10_000_000), 1000, "Ad-hoc (/execute_sql) runs kept in history, the newest.",
            "a whole number from 1 to 10000000", alias="QUERYAPIGATE_HISTORY_ADHOC_LIMIT"),
    Setting("QAG_HISTORY_RETENTION_DAYS", _optional_int(1, 36_500), None, "Keep every run in history for this many days instead of the count limits; unset = the count limits.",
            "a whole number of days from 1 to 36500", alias="QUERYAPIGATE_HISTORY_RETENTION_DAYS"),
    Setting("QAG_HISTORY_SAMPLE_RATE", _rate, 1.0, "Fraction of successful runs kept in history (failures always are); every run stays an event.",
            "a number greater than 0 and at most 1", alias="QUERYAPIGATE_HISTORY_SAMPLE_RATE"),
    Setting("QAG_HISTORY_ADHOC_SQL", _choice("text", "hash", "none"), "text", "What history and logs keep of ad-hoc SQL: the text (first 4000 characters), its SHA-256, or nothing.",
            "text, hash or none", alias="QUERYAPIGATE_HISTORY_ADHOC_SQL"),
    Setting("QAG_HISTORY_FLUSH_INTERVAL", _seconds_max(60.0), 1.0, "Seconds between a worker's batch writes of history and events (sooner when 500 are queued); 0 = write as soon as anything is queued. The call never waits for the write.",
            "a number of seconds from 0 to 60", alias="QUERYAPIGATE_HISTORY_FLUSH_INTERVAL"),
    Setting("QAG_HISTORY_BUFFER", _int_range(10, 10_000_000), 10_000, "Runs queued per worker for the history writer; beyond it the oldest unwritten ones are dropped and counted (queryapigate_history_runs_total{outcome=\"dropped\"}).",
            "a whole number from 10 to 10000000"),
    Setting("QAG_EVENTS_RETENTION_HOURS", _int_range(1, 87_600), 24, "Hours the event log keeps every run (swept in the background in small batches).",
            "a whole number of hours from 1 to 87600", alias="QUERYAPIGATE_EVENTS_RETENTION_HOURS"),
    Setting("QAG_EVENTS_MAX_STREAMS", _optional_int(0, 10_000), None, "Open GET /events streams per worker process (each holds one of its QAG_THREADS request threads); one more is refused with 503 too_many_streams; 0 turns streams off (every one refused so); unset = min(4, QAG_THREADS / 2).",
            "a whole number from 0 to 10000", alias="QUERYAPIGATE_EVENTS_MAX_STREAMS"),
    Setting("QAG_EVENTS_KEEPALIVE", _seconds_max(3600.0), 15.0, "Seconds without an event after which a GET /events stream sends a `: keepalive` comment (and notices a client that went away).",
            "a number of seconds from 0 to 3600 (0 = every second)"),
    Setting("QAG_EVENTS_RING_BYTES", _int_range(65_536, 1 << 30), 4 << 20, "Bytes of the host's shared-memory ring that carries live run events from the worker that served a run to the GET /events streams of every worker; runs are put there only while a stream is open. A stream whose pump was overtaken by this many bytes of events loses the overtaken ones.",
            "a whole number of bytes from 65536 to 1073741824"),
    Setting("QAG_EVENTS_HOST", _text, "127.0.0.1", "Address `qag events` (the standalone events server) listens on.",
            "a host name or address"),
    Setting("QAG_EVENTS_PORT", _int_range(0, 65535), 5002, "Port of `qag events` (0 = any free port, printed at start).",
            "a whole number from 0 to 65535", alias="QUERYAPIGATE_EVENTS_PORT"),
    Setting("QAG_EVENTS_POLL_INTERVAL", _seconds_max(60.0), 1.0, "Seconds between two reads of the store's event log by `qag events`.",
            "a number of seconds from 0 to 60", alias="QUERYAPIGATE_EVENTS_POLL_INTERVAL"),
    Setting("QAG_EVENTS_MAX_CONNECTIONS", _int_range(1, 1_000_000), 10_000, "Open streams `qag events` serves at once; one more is refused with 503 too_many_streams (Retry-After: 5).",
            "a whole number from 1 to 1000000", alias="QUERYAPIGATE_EVENTS_MAX_CONNECTIONS"),
    Setting("QAG_REDIS_URL", _redis_url, None, "Redis shared by every worker and instance: rate limits, slots and quotas counted there, the response cache kept there, configuration changes published there. When it fails the host's workers count rate limits, slots and quotas together (QAG_LIMITS_TABLE_ENTRIES), response-cache lookups are misses, and Redis is retried after 5 s. Unset = no Redis.",
            "a redis://, rediss:// or unix:// URL", alias="QUERYAPIGATE_REDIS_URL", secret=True),
    Setting("QAG_METADATA_CACHE_TTL", _seconds(True, 86400.0), 60.0, "Seconds the key, saved-query and connection rows every call needs are reused from the host's shared-memory cache; 0 = read the store on every call (a non-number is refused at startup, where QueryAPIGate silently turned the cache off). Changes through this instance are seen at once, other instances' within about a second (the store is polled; at once with QAG_REDIS_URL): the TTL only bounds a change nothing announced, so the default is on.",
            "seconds from 0 to 86400 (0 = off)", alias="QUERYAPIGATE_METADATA_CACHE_TTL"),
    Setting("QAG_METADATA_POLL_INTERVAL", _seconds_max(3600.0), 1.0, "Seconds between reads of the store's config generation, by one worker per host: how soon a change made by another instance (or straight in the store) is seen without Redis. 0 = no polling.",
            "seconds from 0 to 3600"),
    Setting("QAG_LIMITS_TABLE_ENTRIES", _int_range(64, 1 << 22), 16_384, "Places in the host's shared-memory table of rate-limit buckets, max_concurrent slots and quota counters, shared by every worker (192 bytes each, plus 8 of index; memory is only used as places fill). A full table makes room by dropping what loses nothing (a refilled bucket, an unheld slot, a quota counter the store holds), and for an API key's entry the least recently used client-address bucket; when nothing can go, that identity is counted by each worker alone and the call counted in queryapigate_rate_limit_fallbacks_total.",
            "a whole number from 64 to 4194304"),
    Setting("QAG_METADATA_CACHE_BYTES", _int_range(65_536, 1 << 34), 16_777_216, "Size of the host's shared-memory metadata cache (4 KiB a row; memory is only used as rows arrive). A full cache evicts the oldest rows.",
            "a whole number of bytes from 65536"),
    Setting("QAG_RESPONSE_CACHE_MAX_BYTES", _int_range(1, 1 << 36), 64 << 20, "Bytes of responses (bodies and headers, in 1 KiB blocks) the host's shared-memory response cache holds for every worker of the instance, for saved-query versions with a cache_ttl; beyond it, or beyond 10,000 entries, the least recently used are evicted. A response larger than this is not cached (never an error). Default 64 MiB per host (memory is only used as entries arrive). Not used with QAG_REDIS_URL (the cache is then kept in Redis).",
            "a whole number of bytes from 1 to 68719476736"),
    Setting("QAG_JWT_SECRET", _jwt_secret, None, "Accept `Authorization: Bearer <JWT>` signed with this shared secret (HS256/384/512; at least 32 bytes). Set this or QAG_JWT_JWKS_URL / QAG_JWT_ISSUER, not both. Needs `pip install 'qag[jwt]'`.",
            "text of at least 32 bytes", alias="QUERYAPIGATE_JWT_SECRET", secret=True),
    Setting("QAG_JWT_JWKS_URL", _jwks_url, None, "Accept bearer tokens signed by the keys published at this JWKS URL (RS/PS/ES/EdDSA); unset with QAG_JWT_ISSUER set = the issuer's OIDC discovery document names it. Keys are cached and fetched again for an unknown `kid` (at most once per QAG_JWT_JWKS_REFRESH_INTERVAL).",
            "an https:// URL (http:// only for a loopback host: localhost, 127.0.0.0/8, [::1])", alias="QUERYAPIGATE_JWT_JWKS_URL"),
    Setting("QAG_JWT_ISSUER", _optional_text, None, "The `iss` every bearer token must carry; with no QAG_JWT_SECRET or QAG_JWT_JWKS_URL, also where the OIDC discovery document is read (<issuer>/.well-known/openid-configuration), and then it must be an https URL (http only for a loopback host). Required with asymmetric keys.",
            "the issuer's URL as it appears in `iss`", alias="QUERYAPIGATE_JWT_ISSUER"),
    Setting("QAG_JWT_AUDIENCE", _csv, (), "Accepted `aud` values (comma-separated); a token must name one. Required with asymmetric keys; optional with a secret.",
            "a comma-separated list", alias="QUERYAPIGATE_JWT_AUDIENCE"),
    Setting("QAG_JWT_ALGORITHMS", _csv, (), "Signature algorithms accepted; default HS256 with a secret, RS256, ES256 and EdDSA with keys. A secret takes only HS*, keys only asymmetric ones (no HS/RS confusion); `none` is never accepted.",
            "a comma-separated list", alias="QUERYAPIGATE_JWT_ALGORITHMS"),
    Setting("QAG_JWT_ROLE", _optional_text, None, "The role every signed-in user gets when QAG_JWT_ROLE_CLAIM names none that exists.",
            "a role name", alias="QUERYAPIGATE_JWT_ROLE"),
    Setting("QAG_JWT_ROLE_CLAIM", _optional_text, None, "The claim naming a signed-in user's role (a string, or a list: the first existing role wins); dotted names reach into objects (`app_metadata.role`), and a token whose top-level claim of that dotted name says otherwise has no role.",
            "a claim name", alias="QUERYAPIGATE_JWT_ROLE_CLAIM"),
    Setting("QAG_JWT_USER_CLAIM", _text_or_default, "sub", "The claim identifying the signed-in user: history, events and rate limits and quotas name the caller `jwt:<value>`.",
            "a claim name", alias="QUERYAPIGATE_JWT_USER_CLAIM"),
    Setting("QAG_JWT_LEEWAY", _seconds_max(300.0), 30.0, "Seconds of clock skew allowed on `exp`, `nbf` and `iat`.",
            "seconds from 0 to 300"),
    Setting("QAG_JWT_JWKS_REFRESH_INTERVAL", _seconds_max(3600.0), 30.0, "Least seconds between two fetches of the JWKS caused by tokens with an unknown `kid` (so made-up key ids can't make qag hammer the issuer); the keys are also fetched again after an hour.",
            "seconds from 0 to 3600"),
    Setting("QAG_JWT_CACHE_ENTRIES", _int_range(0, 1_000_000), 10_000, "Verified tokens remembered per worker (by their SHA-256, until their `exp`) so a token seen before is not verified again; 0 = verify every call.",
            "a whole number from 0 to 1000000"),
    Setting("QAG_MCP_RESOURCE_URL", _resource_url, None, "The canonical URL of the MCP endpoint as agents reach it (`https://qag.example.com/mcp`): the `resource` of the OAuth protected-resource metadata (/.well-known/oauth-protected-resource) and an audience bearer tokens at /mcp may carry (RFC 8707), besides QAG_JWT_AUDIENCE. Unset = the metadata names the request's own scheme and Host (X-Forwarded-Proto/-Host only from QAG_TRUST_PROXY proxies) and /mcp accepts QAG_JWT_AUDIENCE only. Needs bearer tokens (QAG_JWT_*).",
            "an https:// URL (http:// only for localhost, 127.0.0.1 or [::1]) without query or fragment", alias="QUERYAPIGATE_MCP_RESOURCE_URL"),
    Setting("QAG_MCP_AUTH_SERVER", _auth_servers, (), "The OAuth authorization servers (issuer URLs, comma-separated) the protected-resource metadata names, where an agent gets tokens for /mcp; unset = QAG_JWT_ISSUER when that is an http(s) URL. With neither, the metadata is not served (404). Needs bearer tokens (QAG_JWT_*).",
            "comma-separated https:// URLs (http:// only for localhost, 127.0.0.1 or [::1])", alias="QUERYAPIGATE_MCP_AUTH_SERVER"),
    Setting("QAG_MCP_SCOPE", _scopes, (), "OAuth scopes (space- or comma-separated) a bearer token must all hold (its `scope` or `scp` claim) to use /mcp; listed as scopes_supported in the metadata and named in /mcp's Bearer challenges; a token lacking one gets 403 token_scope. Unset = no scope required. Needs bearer tokens (QAG_JWT_*).",
            "scope names", alias="QUERYAPIGATE_MCP_SCOPE"),
    Setting("QAG_DEMO_HOME", _text_or_default, "demo-home", "Folder of `qag demo`'s home (store and example data); `qag demo --home` wins. Relative to the current directory.",
            "a folder path"),
    Setting("QAG_LOG_LEVEL", _choice("debug", "info", "warning", "error"), "info", "Level of qag's own log lines on stderr.",
            "debug, info, warning or error"),
)

_BY_ATTR = {s.attr: s for s in SETTINGS}


@dataclass(frozen=True)
class Settings:
    """The validated settings of one process; attribute names are the setting names without QAG_."""

    values: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Plain instance attributes, so a read on the request path is a dict lookup in C rather than a failed
        # lookup followed by a Python __getattr__ call.
        for name, value in self.values.items():
            object.__setattr__(self, name, value)

    def with_overrides(self, **changes: Any) -> "Settings":
        return Settings({**self.values, **changes})


_SECRET_FILE_MAX = 65_536   # a key, a token or a URL: a larger file is the wrong one (or /dev/zero)


def _raw(s: Setting, env: Mapping[str, str]) -> tuple[str | None, str | None]:
    """(value, the variable it came from) honouring the alias and the NAME_FILE form."""
    found: list[tuple[str, str]] = []
    for name in (s.name, s.alias):
        if not name:
            continue
        if name in env:
            found.append((name, env[name]))
        if s.secret and f"{name}_FILE" in env:
            path = env[f"{name}_FILE"]
            try:
                with open(path, encoding="utf-8") as fh:
                    content = fh.read(_SECRET_FILE_MAX + 1)
            except OSError as exc:
                raise SettingsError(f"{name}_FILE: cannot read {path!r} ({exc.strerror})") from None
            except UnicodeDecodeError:   # its message would quote the file's bytes: never shown
                raise SettingsError(f"{name}_FILE: {path!r} is not UTF-8 text; it must hold the value alone") from None
            if len(content) > _SECRET_FILE_MAX:
                raise SettingsError(f"{name}_FILE: {path!r} is longer than {_SECRET_FILE_MAX} characters; it must "
                                    f"hold the value alone") from None
            for ending in ("\r\n", "\n"):
                if content.endswith(ending):
                    content = content[: -len(ending)]
                    break
            if content == "":
                raise SettingsError(f"{name}_FILE: {path!r} is empty")
            found.append((f"{name}_FILE", content))
    if len(found) > 1:
        names = ", ".join(n for n, _ in found)
        raise SettingsError(f"{s.name} is set more than once ({names}); set only one")
    return (found[0][1], found[0][0]) if found else (None, None)


def _known_names() -> set[str]:
    """Every environment name a setting answers to: name, alias and, for secrets, their NAME_FILE forms."""
    names = set(_BIND_PARTS)
    for s in SETTINGS:
        for name in filter(None, (s.name, s.alias)):
            names.add(name)
            if s.secret:
                names.add(f"{name}_FILE")
    return names


def _closest(name: str, known: set[str]) -> str | None:
    """The known name closest to `name`, compared without the QAG_ or QUERYAPIGATE_ prefix every name shares (else
    any short typo looks like QAG_HOME); a QAG_ name wins over its alias, QueryAPIGate's host and port are QAG_BIND."""
    by_rest: dict[str, str] = {}
    for n in sorted(known, key=lambda n: not n.startswith("QAG_")):
        by_rest.setdefault(n.split("_", 1)[1], "QAG_BIND" if n in _BIND_PARTS else n)
    close = difflib.get_close_matches(name.split("_", 1)[1], sorted(by_rest), n=1)
    return by_rest[close[0]] if close else None


def unused_aliases(env: Mapping[str, str] | None = None) -> list[str]:
    """QUERYAPIGATE_* names qag does not read (QueryAPIGate settings it does not implement): warned about, never
    refused, so a deployment switching over keeps its environment."""
    env = os.environ if env is None else env
    known = _known_names()
    return sorted(n for n in env if n.startswith("QUERYAPIGATE_") and n not in known)


def load(env: Mapping[str, str] | None = None) -> Settings:
    """Read and validate every setting; raises SettingsError with one line on the first bad one."""
    env = os.environ if env is None else env
    for name in env:
        if name.startswith("SQL2API_"):
            raise SettingsError(f"leftover setting {name} -> QUERYAPIGATE_{name[len('SQL2API_'):]} (or QAG_{name[len('SQL2API_'):]}); rename it")
    known = _known_names()
    unknown = sorted(n for n in env if n.startswith("QAG_") and n not in known and not n.startswith(ALLOWED_PREFIXES))
    if unknown:
        # A typo would otherwise leave the setting at its default without a word.
        name, close = unknown[0], _closest(unknown[0], known)
        if name.endswith("_FILE") and name[:-len("_FILE")] in known:
            hint = f"only secrets have a _FILE form: set {name[:-len('_FILE')]} itself"
        else:
            hint = f"did you mean {close}?" if close else "see docs/configuration.md"
        raise SettingsError(f"{name} is not a qag setting; {hint}")
    values: dict[str, Any] = {}
    for s in SETTINGS:
        values[s.attr] = _read(s, env)
    host, port = (env.get(n, "").strip() for n in _BIND_PARTS)
    if not env.get("QAG_BIND", "").strip() and (host or port):
        # QueryAPIGate's serve defaults: QUERYAPIGATE_HOST / QUERYAPIGATE_PORT make up the bind address (a bare
        # IPv6 host goes in brackets, as gunicorn reads it).
        host = host or "127.0.0.1"
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        values["bind"] = _bind(f"{host}:{port or '5000'}", Setting("QUERYAPIGATE_HOST/QUERYAPIGATE_PORT", _bind,
                                                                   None, "", "a host and a port from 0 to 65535"))
    _check_jwt(values)
    _check_mcp_oauth(values)
    if values["pool_size"] is None:
        values["pool_size"] = values["threads"]
    if values["events_max_streams"] is None:
        values["events_max_streams"] = min(4, values["threads"] // 2)
    if values["max_streams"] is None:
        values["max_streams"] = max(1, values["threads"] // 2)
    values["otel"] = _tracing(values["otel"], env)
    if values["home"] is None:
        values["home"] = os.getcwd()
    values["home"] = os.path.abspath(values["home"])
    return Settings(values)


def _tracing(mode: str, env: Mapping[str, str]) -> str:
    """QAG_OTEL resolved to "on" or "off" with the OTEL_* variables the SDK reads; what "on" needs is checked now,
    in one line, rather than in every worker. Only package metadata is read: nothing of OpenTelemetry is imported
    (the gunicorn master forks its workers from this process)."""
    if mode == "off" or env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return "off"
    exporter = env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    if exporter == "none":
        return "off"
    if mode == "auto" and not (env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        return "off"
    why = "QAG_OTEL=on" if mode == "on" else "OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT is set (QAG_OTEL=auto)"
    if exporter not in ("otlp", "otlp_proto_http"):
        raise SettingsError(f"OTEL_TRACES_EXPORTER={exporter!r}: qag exports traces over OTLP/HTTP only (otlp or none)")
    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        protocol = env.get(name, "").strip()
        if protocol:
            if protocol != "http/protobuf":
                raise SettingsError(f"{name}={protocol!r}: qag exports OTLP over HTTP (http/protobuf, the "
                                    f"collector's port 4318), not {protocol}")
            break
    from importlib import metadata
    for package in ("opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http"):
        try:
            metadata.version(package)
        except metadata.PackageNotFoundError:
            raise SettingsError(f"tracing is on ({why}) but {package} is not installed: pip install 'qag[otel]', "
                                f"or set QAG_OTEL=off") from None
    return "on"


_SYMMETRIC = ("HS256", "HS384", "HS512")
_ASYMMETRIC = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")


def _check_jwt(values: dict) -> None:
    """Bearer-token settings that would make checking tokens unsafe or impossible stop startup: a gateway that
    fails open on a misconfiguration is worse than one that does not start."""
    secret, jwks, issuer = values["jwt_secret"], values["jwt_jwks_url"], values["jwt_issuer"]
    keyed = jwks is not None or (secret is None and issuer is not None)
    named = [n for n in ("jwt_audience", "jwt_algorithms", "jwt_role", "jwt_role_claim") if values[n]]
    if secret is None and not keyed:
        if named:
            raise SettingsError("QAG_JWT_* settings are set but none of QAG_JWT_SECRET, QAG_JWT_JWKS_URL or "
                                "QAG_JWT_ISSUER is: bearer tokens could not be verified")
        values["jwt_mode"] = None
        return
    if secret is not None and jwks is not None:
        raise SettingsError("set QAG_JWT_SECRET or QAG_JWT_JWKS_URL, not both")
    try:
        import jwt  # noqa: F401  (refused now rather than on the first token)
    except ImportError:
        raise SettingsError("bearer tokens are configured but PyJWT is missing: pip install 'qag[jwt]'") from None
    allowed = _SYMMETRIC if secret is not None else _ASYMMETRIC
    algorithms = values["jwt_algorithms"] or (("HS256",) if secret is not None else ("RS256", "ES256", "EdDSA"))
    wrong = [a for a in algorithms if a not in allowed]
    if wrong:
        # Mixing the families is the classic algorithm confusion: a public key taken as an HMAC secret.
        raise SettingsError(f"QAG_JWT_ALGORITHMS may only list {', '.join(allowed)} with "
                            f"{'QAG_JWT_SECRET' if secret is not None else 'signing keys'}, not {', '.join(wrong)}")
    if keyed and (issuer is None or not values["jwt_audience"]):
        # A provider signs tokens for every application it serves: without both, another app's tokens pass here.
        raise SettingsError("bearer tokens from an issuer's keys need QAG_JWT_ISSUER and QAG_JWT_AUDIENCE set")
    from .bearer import key_source_url
    if keyed and jwks is None and not key_source_url(issuer):
        # The discovery document names the keys: read over plain HTTP from elsewhere, it could name anyone's.
        raise SettingsError("QAG_JWT_ISSUER is where the signing keys are discovered (no QAG_JWT_JWKS_URL), so it "
                            "must be an https URL (http only for a loopback host)")
    if values["jwt_role"] is None and values["jwt_role_claim"] is None:
        raise SettingsError("bearer tokens need QAG_JWT_ROLE (the role every signed-in user gets) and/or "
                            "QAG_JWT_ROLE_CLAIM (a claim naming one)")
    values["jwt_algorithms"] = tuple(algorithms)
    values["jwt_mode"] = "secret" if secret is not None else "keys"


def _check_mcp_oauth(values: dict) -> None:
    """/mcp as an OAuth resource server verifies tokens with the QAG_JWT_* settings: without them its settings would
    do nothing, which stops startup like any setting that can't take effect."""
    named = [n for n in ("QAG_MCP_RESOURCE_URL", "QAG_MCP_AUTH_SERVER", "QAG_MCP_SCOPE")
             if values[n[len("QAG_"):].lower()]]
    if named and values["jwt_mode"] is None:
        raise SettingsError(f"{', '.join(named)} set but bearer tokens are not configured: /mcp verifies OAuth tokens "
                            f"with QAG_JWT_ISSUER (or QAG_JWT_JWKS_URL / QAG_JWT_SECRET) and QAG_JWT_AUDIENCE")


def _read(s: Setting, env: Mapping[str, str]) -> Any:
    """One setting's value. The rule for every value: surrounding whitespace (spaces, tabs, newlines) is removed,
    and empty means unset (the default), except for the secrets, which are read as given (a key, a token or an
    HMAC secret refuses empty and surrounding whitespace, the URLs trim it)."""
    raw, source = _raw(s, env)
    if raw is not None and not s.secret:
        raw = raw.strip()
        if raw == "":
            raw = None
    if raw is None:
        return s.default
    return s.parse(raw, s if source in (s.name, None) else Setting(source, s.parse, s.default, s.doc, s.accepted))


def value(name: str, env: Mapping[str, str] | None = None) -> Any:
    """One setting's value, read and checked as load() reads it (SettingsError otherwise), without the others:
    for what must be decided before load() can run (QAG_SPEEDUPS, when qag is imported)."""
    env = os.environ if env is None else env
    return _read(next(s for s in SETTINGS if s.name == name), env)


def sources(env: Mapping[str, str] | None = None) -> list[tuple[Setting, str | None]]:
    """Each setting with the variable its value came from (NAME, its alias, NAME_FILE), None for its default;
    `qag config` shows them. Call after load() accepted the same environment."""
    env = os.environ if env is None else env
    out = []
    for s in SETTINGS:
        raw, source = _raw(s, env)
        if raw is not None and not s.secret and raw.strip() == "":
            source = None   # set but empty: the default, as load() reads it
        if s.name == "QAG_OTEL" and source is None and _tracing("auto", env) == "on":
            # auto turned tracing on: say which of the SDK's variables did.
            source = next(n for n in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
                          if env.get(n))
        out.append((s, source))
    return out


def generate_markdown() -> str:
    """docs/configuration.md, generated from SETTINGS; a test keeps the file in step."""
    lines = [
        "# Configuration",
        "",
        "Generated from `qag/settings.py` by `python -m qag.settings > docs/configuration.md`; do not edit by hand.",
        "",
        "qag is configured with environment variables only. Each `QAG_*` name also answers to the",
        "`QUERYAPIGATE_*` name of QueryAPIGate 0.43 where one exists (setting both is refused). Settings marked",
        "*secret* also accept `NAME_FILE`, the path of a file holding the value (one trailing newline removed).",
        "",
        "Whitespace and empty values: surrounding spaces, tabs and newlines are removed from every value, and a",
        "variable set to an empty value counts as unset (the default), so `QAG_EVENTS_HOST=` is 127.0.0.1 and",
        "`QAG_HOME=\" /srv/qag\"` is /srv/qag. Secrets are the exception: a key, token or HMAC secret",
        "(`QAG_API_KEY`, `QAG_MCP_API_KEY`, `QAG_METRICS_TOKEN`, `QAG_MASK_KEY`, `QAG_JWT_SECRET`) is used exactly",
        "as given, so an empty one, or one starting or ending with whitespace (HTTP trims it from a header: such",
        "a key could never match), is refused; the URLs (`QAG_DATABASE_URL`, `QAG_REDIS_URL`) are trimmed, and",
        "empty means unset. Numbers are written in ASCII digits (`1.5`, `2e3`; not `nan`, `inf` or `1_000`), an",
        "IPv6 address in a bind address in brackets (`[::1]:5000`).",
        "",
        "An invalid value stops startup with one line naming the setting and what it accepts. So does an unknown",
        "`QAG_*` name (a typo such as `QAG_WORKER`), naming the closest setting; names starting with",
        ", ".join(f"`{p}`" for p in ALLOWED_PREFIXES[:-1]) + f" or `{ALLOWED_PREFIXES[-1]}` are left alone "
        "(qag's tests, benchmarks and build read them). An unknown",
        "`QUERYAPIGATE_*` name (a QueryAPIGate setting qag does not implement) is ignored, with a warning from",
        "`qag serve`.",
        "",
        "| setting | alias | default | accepted | meaning |",
        "|---|---|---|---|---|",
    ]
    for s in SETTINGS:
        default = "unset" if s.default in (None, ()) else repr(s.default) if isinstance(s.default, str) else str(s.default).lower() if isinstance(s.default, bool) else str(s.default)
        alias = f"`{s.alias}`" if s.alias else ""
        secret = " *secret*" if s.secret else ""
        lines.append(f"| `{s.name}`{secret} | {alias} | {default} | {s.accepted} | {s.doc} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(generate_markdown(), end="")
