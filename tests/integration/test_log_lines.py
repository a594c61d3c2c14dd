"""What an operator ships (issue 22.5): one line per request by default, gunicorn's own lines in qag's shape (JSON
under QAG_JSON_LOGS), non-ASCII paths as sent, and a worker's lines in time order."""

from __future__ import annotations

import json
import re
from datetime import datetime
from urllib.parse import quote

import pytest

from tests.server import q, wait_for

pytestmark = pytest.mark.e2e

CAFE = "/q/" + quote("café")


@pytest.mark.parametrize("worker_class", ["qag", "gthread"])
def test_one_plain_line_per_request_with_the_path_as_sent(make_server, uniq, worker_class):
    s = make_server(env={"QAG_WORKER_CLASS": worker_class}, workers=1)
    name = uniq("one")
    s.query(name, "SELECT 1 AS v", "lite")
    rids = [s.get(q(name)).headers["x-request-id"] for _ in range(3)] + [s.get(CAFE).headers["x-request-id"]]
    wait_for(lambda: all(any(r in line for line in s.log) for r in rids), "the request lines")
    for rid in rids:
        mine = [line for line in s.log if rid in line]
        assert len(mine) == 1, mine
    assert any(line.rstrip().endswith(f"]: GET /q/café -> 404 in {line.rsplit(' ', 1)[-1].strip()}")
               for line in s.log if rids[-1] in line)
    # gunicorn's own lines in qag's shape: `<time> <LEVEL> gunicorn [<pid>]: <message>`
    booted = [line for line in s.log if "Booting worker" in line]
    assert booted and re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO gunicorn \[\d+\]: Booting worker", booted[0])
    # A worker's lines are in time order.
    stamps = [datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f") for line in s.log if line[:4].isdigit()]
    assert stamps == sorted(stamps)


def test_access_log_when_asked_keeps_utf8_paths(make_server):
    s = make_server(env={"QAG_ACCESS_LOG": "on"}, workers=1)
    rid = s.get(CAFE).headers["x-request-id"]
    line = wait_for(lambda: next((l for l in s.log if f"rid={rid}" in l), None), "the access line")
    assert '"GET /q/café HTTP/1.1" 404' in line


@pytest.mark.parametrize("worker_class", ["qag", "gthread"])
def test_json_mode_makes_every_line_json(make_server, worker_class):
    s = make_server(env={"QAG_JSON_LOGS": "1", "QAG_ACCESS_LOG": "on", "QAG_WORKER_CLASS": worker_class},
                    workers=1)
    rid = s.get(CAFE).headers["x-request-id"]
    wait_for(lambda: sum(rid in line for line in s.log) >= 2, "the request's lines")
    lines = [line for line in s.log if line.strip() and not line.startswith("qag: ")]
    parsed = [json.loads(line) for line in lines]   # every line gunicorn or qag wrote is a JSON object
    assert any(p["logger"] == "gunicorn.error" and "Booting worker" in p["message"] for p in parsed)
    access = [p for p in parsed if p["logger"] == "gunicorn.access" and p["request_id"] == rid]
    assert len(access) == 1 and access[0]["path"] == "/q/café" and access[0]["status"] == 404
    mine = [p for p in parsed if p["logger"] == "qag" and p["request_id"] == rid]
    assert len(mine) == 1 and mine[0]["path"] == "/q/café"
