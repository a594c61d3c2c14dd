"""One WARNING a second per database (a connection's, or the store) while it is unavailable, with the reason."""

from __future__ import annotations

import logging
import time

from ..errors import QagError

log = logging.getLogger("qag.database")

INTERVAL = 1.0   # seconds between two warnings about the same connection


class OutageLog:
    """Logs the refusals a database or its pool caused (those answered with Retry-After: 502 connection_failed,
    503 pool exhausted, 504 reply never came; a write's lost reply or connection, `outcome: "unknown"`, has no
    Retry-After), at most once per INTERVAL per connection, so an outage under load says why without flooding the
    log. The reason is the driver's text: a statement's as the server wrote it, a failure to open a connection's as
    base.opening_detail cleaned it (never the connection's password)."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self.suppressed = 0   # warnings skipped by the once-a-second rule since the last one written

    def note(self, what: str, error: QagError, reason: str | None = None) -> None:
        """`what` is unavailable (e.g. "connection 'sales'", "the store"): warn unless it was warned about less than
        INTERVAL ago. Other refusals without Retry-After are the caller's or the statement's, not an outage."""
        extras = error.extras
        if ("retry_after" not in extras and extras.get("outcome") != "unknown") or error.status < 500:
            return
        now = time.monotonic()
        if now - self._last.get(what, -INTERVAL) < INTERVAL:
            self.suppressed += 1
            return
        self._last[what] = now
        more, self.suppressed = self.suppressed, 0
        log.warning("%s unavailable: %d %s: %s%s", what, error.status, error.code,
                    reason or error.extras.get("detail") or error.message,
                    f" ({more} more refusals since the last warning)" if more else "")
