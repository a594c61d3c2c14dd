"""qag's log lines: request threads hand tuples to a bounded queue; one writer thread per worker formats them
(plain or JSON lines, with the request id) and writes them in batches. No request thread formats a line, takes
the logging module's handler lock, or waits on a write.

Plain: `<time> <LEVEL> qag [<request_id> key=<key>]: <message>` (line breaks and control characters escaped); with tracing on (QAG_OTEL)
a request's and a run's lines say `[<request_id> key=<key> trace=<trace id>]`.
JSON:  {"time", "level", "logger", "request_id", "key", ["trace_id",] "message", ...structured extras}.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import sys
import time

from .events import PAUSE_EVERY, BatchWriter, pause

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
_installed: "_Handler | None" = None
_MILLISECONDS = tuple(f"{n:03d}" for n in range(1000))   # a line's milliseconds, formatted once
# Line breaks and every other control character a caller can put in a message (a decoded path's NUL, ESC, ...)
# are written as escapes: one line per record, nothing a terminal or a log shipper would act on.
_ESCAPED = {c: f"\\u{c:04x}" for c in (*range(0x20), *range(0x7f, 0xa0), 0x2028, 0x2029)} | {
    ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\t"}


# Every worker writes to the same stderr (a pipe under systemd, Docker or a supervisor): a write of at most
# PIPE_BUF bytes is never interleaved with another process's, a longer one may be, splicing a line of one worker
# into another's. So a batch goes out in writes of whole lines of at most this many bytes (a longer line alone).
_ATOMIC_BYTES = 4096


def _whole_lines(lines: list[str]):
    """The lines joined into chunks of at most _ATOMIC_BYTES UTF-8 bytes each, cut only between lines."""
    chunk: list[str] = []
    size = 0
    for line in lines:
        length = len(line) if line.isascii() else len(line.encode("utf-8", "replace"))
        if chunk and size + length > _ATOMIC_BYTES:
            yield "".join(chunk)
            chunk, size = [], 0
        chunk.append(line)
        size += length
    if chunk:
        yield "".join(chunk)


class _Handler(logging.Handler):
    """The `qag` logger's handler: the record goes to the queue as it is (formatted by the writer thread)."""

    def __init__(self, writer: "LogWriter"):
        super().__init__()
        self.writer = writer

    def handle(self, record: logging.LogRecord) -> bool:  # no handler lock: the queue is the hand-off
        if record.levelno < self.level:
            return False
        self.writer.put(("rec", record))
        return True

    def emit(self, record: logging.LogRecord) -> None:
        self.handle(record)


class LogWriter:
    """One per worker. `enabled` once installed (served workers; in-process use keeps the logging defaults)."""

    def __init__(self, settings, stream=None):
        self.json = settings.json_logs
        self.level = _LEVELS.get(settings.log_level, logging.INFO)
        self.stream = stream
        self.enabled = False
        self.formatter = logging.Formatter()
        self._second = -1       # the writer thread's cache of the formatted current second
        self._stamp = ""
        self.buffer = BatchWriter("log", self._write, capacity=settings.log_buffer, interval=0.1, wake_at=1000)

    def install(self, stream=None) -> None:
        """Route the `qag` logger through this writer (replacing an earlier writer's handler) and turn on
        request lines."""
        global _installed
        logger = logging.getLogger("qag")
        if _installed is not None:
            logger.removeHandler(_installed)
        handler = _Handler(self)
        handler.setLevel(self.level)
        logger.addHandler(handler)
        logger.setLevel(self.level)
        logger.propagate = False
        _installed = handler
        if stream is not None:
            self.stream = stream
        self.enabled = True

    def put(self, item: tuple) -> None:
        self.buffer.put(item)

    def close(self) -> None:
        self.buffer.close()

    # --- the writer thread --------------------------------------------------------------------------------
    def _write(self, batch: list, batch_id: str) -> None:
        lines = []
        since_pause = 0
        for item in batch:
            since_pause += 1
            if since_pause == PAUSE_EVERY:
                since_pause = 0
                pause()
            try:
                lines.append(self._line(item))
            except Exception as exc:  # a record that can't be formatted must not take the others with it
                lines.append(self._format(time.time(), "ERROR", "qag", None, None,
                                          f"a log line could not be formatted: {exc!r}", None))
        stream = self.stream or sys.stderr
        for chunk in _whole_lines(lines):
            stream.write(chunk)
            stream.flush()

    def _line(self, item: tuple) -> str:
        kind = item[0]
        if kind == "req":
            _, at, rid, key, method, path, status, ms, trace = item
            # "%.1f" % ms is format(ms, ".1f") (the same digits) at half its cost
            message = f"{method} {path} -> {status} in {'%.1f' % ms}ms"
            extras = {"method": method, "path": path, "status": status,
                      "duration_ms": round(ms, 1)} if self.json else None
            return self._format(at, "INFO", "qag", rid, key, message, extras, trace)
        if kind == "exec":
            _, at, plan, sql = item
            timeout = plan.timeout if plan.timeout is not None else 0
            limit = plan.size if not plan.stream else None
            offset = (plan.page - 1) * plan.size if not plan.stream else 0
            conn = plan.connection
            message = (f"Executing on {conn['name']} ({conn['db']}), limit={limit} offset={offset} "
                       f"timeout={float(timeout)}: {sql}")
            extras = {"connection": conn["name"], "dialect": conn["db"], "limit": limit, "offset": offset,
                      "timeout": timeout} if self.json else None
            return self._format(at, "INFO", "qag", plan.request_id, plan.key, message, extras, _trace_of(plan))
        if kind == "slow":
            _, at, plan, ms = item
            conn = plan.connection
            return self._format(at, "WARNING", "qag", plan.request_id, plan.key,
                                f"Slow query on {conn['name']} ({conn['db']}): {ms:.0f} ms",
                                {"connection": conn["name"], "dialect": conn["db"], "duration_ms": round(ms)},
                                _trace_of(plan))
        record: logging.LogRecord = item[1]
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatter.formatException(record.exc_info)
        return self._format(record.created, record.levelname, record.name, getattr(record, "request_id", None),
                            getattr(record, "key", None), message, None)

    def _format(self, at: float, level: str, logger: str, rid, key, message: str, extras: dict | None,
                trace: str | None = None) -> str:
        if self.json:
            moment = _dt.datetime.fromtimestamp(at).astimezone()
            out = {"time": moment.isoformat(timespec="milliseconds"), "level": level, "logger": logger,
                   "request_id": rid, "key": key}
            if trace is not None:
                out["trace_id"] = trace
            out["message"] = message
            if extras:
                out.update(extras)
            return json.dumps(out, separators=(",", ":"), ensure_ascii=False, default=str) + "\n"
        milli = int(at * 1000)
        second = milli // 1000
        if second != self._second:
            self._second = second
            self._stamp = time.strftime("%Y-%m-%d %H:%M:%S,", time.localtime(second))
        if not message.isprintable():
            message = message.translate(_ESCAPED)
        return (f"{self._stamp}{_MILLISECONDS[milli - second * 1000]} {level} {logger} [{rid or '-'} "
                f"key={key or '-'}{'' if trace is None else ' trace=' + trace}]: {message}\n")


def _trace_of(plan) -> str | None:
    """A run's trace id: its request's stages hold it when tracing is on (observe/tracing.TracedStages)."""
    return getattr(plan.timing, "trace_id", None)
