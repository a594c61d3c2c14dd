"""The bare ceiling: a trivial WSGI app under the same gunicorn worker class, for the cost of HTTP alone.

    gunicorn --worker-class gthread --workers 2 --threads 8 benchmarks.bare_app:app

It answers every path with a fixed one-row JSON body, echoing a valid X-Request-Id like the gateways do,
and `/health` like theirs, so the harness drives it with the same scripts (body checks off).
"""

import re

_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_BODY = b'[{"ok":1}]\n'
_HEALTH = b'{"status":"ok"}\n'


def app(environ, start_response):
    rid = environ.get("HTTP_X_REQUEST_ID", "")
    body = _HEALTH if environ.get("PATH_INFO") == "/health" else _BODY
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    if rid and _ID.fullmatch(rid):
        headers.append(("X-Request-Id", rid))
    start_response("200 OK", headers)
    return [body]
