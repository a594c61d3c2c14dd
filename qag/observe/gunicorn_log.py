"""gunicorn's own log lines written the way qag writes its own: the same plain shape, or JSON lines under
QAG_JSON_LOGS, and request paths as the UTF-8 text the client sent (gunicorn logs WSGI's Latin-1 reading of it)."""

from __future__ import annotations

import datetime as _dt
import json
import logging

from gunicorn import glogging

JSON = False   # set by qag.gunicorn_conf from QAG_JSON_LOGS before gunicorn makes its logger


def utf8(text):
    """A WSGI string (each byte of the request as one Latin-1 character) as the UTF-8 text it carries; text that is
    not UTF-8 keeps its bytes visible as escapes rather than turning into other letters."""
    if not isinstance(text, str) or text.isascii():
        return text
    try:
        return text.encode("latin-1").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:   # already text (a worker that decoded it)
        return text


class _JsonFormatter(logging.Formatter):
    """One JSON object per record: the keys qag's own JSON lines have, plus an access line's fields."""

    def format(self, record: logging.LogRecord) -> str:
        moment = _dt.datetime.fromtimestamp(record.created).astimezone()
        out = {"time": moment.isoformat(timespec="milliseconds"), "level": record.levelname,
               "logger": record.name, "pid": record.process}
        fields = getattr(record, "qag_access", None)
        if fields is not None:
            out["request_id"] = fields.pop("request_id")
            out["message"] = f"{fields['method']} {fields['path']} -> {fields['status']}"
            out.update(fields)
        else:
            out["message"] = record.getMessage()
            if record.exc_info:
                out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, separators=(",", ":"), ensure_ascii=False, default=str)


class Logger(glogging.Logger):
    """gunicorn's logger (`logger_class`) with qag's line shapes."""

    # Plain error-log lines in qag's shape: `<time> <LEVEL> gunicorn [<pid>]: <message>`.
    error_fmt = r"%(asctime)s %(levelname)s gunicorn [%(process)d]: %(message)s"
    datefmt = None   # logging's default, as qag's own lines: 2026-12-02 10:31:47,807

    def setup(self, cfg):
        super().setup(cfg)
        if JSON:
            for log in (self.error_log, self.access_log):
                for handler in log.handlers:
                    if getattr(handler, "_gunicorn", False):
                        handler.setFormatter(_JsonFormatter())

    def atoms(self, resp, req, environ, request_time):
        atoms = super().atoms(resp, req, environ, request_time)
        atoms["U"] = utf8(atoms["U"])
        atoms["r"] = utf8(atoms["r"])
        return atoms

    def access(self, resp, req, environ, request_time):
        if not JSON:
            super().access(resp, req, environ, request_time)
            return
        if not self.access_log_enabled:
            return
        atoms = self.atoms(resp, req, environ, request_time)
        path = atoms["U"] if not self.cfg.access_log_format.count("%(r)s") else atoms["r"].split(" ")[1]
        fields = {"request_id": atoms.get("{x-request-id}o"), "method": atoms["m"], "path": path,
                  "status": int(atoms["s"]) if str(atoms["s"]).isdigit() else atoms["s"],
                  "bytes": atoms["B"], "duration_ms": round(atoms["D"] / 1000.0, 1), "remote_addr": atoms["h"],
                  "user_agent": atoms["a"]}
        self.access_log.info("", extra={"qag_access": fields})
