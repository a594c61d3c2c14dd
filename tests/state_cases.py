"""The session-state corpora (tests/cases/state/<dialect>.tsv): reading the cases and judging a probe's reply."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

FOLDER = Path(__file__).resolve().parent / "cases" / "state"


def cases(dialect: str) -> list:
    """pytest params (setter kind, setter SQL, probe kind, probe SQL, expectation) of one dialect's corpus."""
    out = []
    for line in (FOLDER / f"{dialect}.tsv").read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, setter_kind, setter, probe_kind, probe, expect = line.split("\t")
        out.append(pytest.param(setter_kind, _unescaped(setter), probe_kind, _unescaped(probe), json.loads(expect),
                                id=name))
    return out


def _unescaped(sql: str) -> str:
    """A corpus's SQL with its `\\xNN` escapes read (a control character the file couldn't show)."""
    return re.sub(r"\\x([0-9a-fA-F]{2})", lambda m: chr(int(m.group(1), 16)), sql)


def check_probe(reply, expect: dict) -> None:
    """The probe saw none of the state: the expected error, or its first column as expected (see the corpora)."""
    if "error" in expect:
        assert reply.status >= 400 and reply.json["code"] == expect["error"], reply
        return
    assert reply.status == 200, reply
    if "absent" in expect:
        assert expect["absent"].encode() not in reply.body, reply
    elif "rows" in expect:
        assert len(reply.json) == expect["rows"], reply
    else:
        value = next(iter(reply.json[0].values())) if reply.json else None
        if "value" in expect:
            assert value == expect["value"], reply
        else:
            assert value != expect["not"], reply


def assert_one_connection(keys: dict, session_id) -> None:
    """The corpora's premise: two calls of one kind (read, write) by two keys share the worker's one pooled
    connection. `session_id(key)`: the rows of a call by that key that name the session it ran on."""
    for kind, (a, b) in keys.items():
        assert session_id(b) == session_id(a), kind
