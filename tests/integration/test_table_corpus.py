"""The table allow-list corpus (issue 4, contract 4.3 and 6.2): tests/cases/tables/<dialect>/*.json over HTTP.

Every case is one POST /execute_sql, by a key holding the case's grants, against a real qag server of its dialect
(QAG_ALLOW_WRITES=1, so `writes` cases reach the table check); the status and code must be the expected ones
and a refusal must name the `forbidden` tables. After all cases of a dialect the database must be unchanged
(tables, rows, schemas, routines, sequences). A malformed case file fails collection (`invalid_case`), so a typo
can't make a case pass vacuously. The case format is described in tests/cases/tables/README.md.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.server import Server
from tests.table_corpus_db import BUILDERS, EVIL_FILES, sqlite_target

CASES = Path(__file__).resolve().parents[1] / "cases" / "tables"
DIALECTS = ("mysql", "postgres", "sqlite")
CONNECTION = "corpus"

# The codes a case may expect, with their status (contract 2; function_not_allowed is issue 4's; value_invalid is
# the guard's first refusal, a NUL character in the statement).
CODES = {"multiple_statements": 400, "read_only": 403, "write_op_not_allowed": 403, "table_not_allowed": 403,
         "table_check_failed": 403, "function_not_allowed": 403, "value_invalid": 400}
FIELDS = {"sql", "generate", "allowed_tables", "allowed_functions", "writes", "expect", "code", "forbidden",
          "why", "max_seconds"}
GENERATE_FIELDS = {"prefix", "repeat", "times", "middle", "close", "suffix"}
FILE_NAME = re.compile(r"[0-9]{3}-[a-z0-9]+(?:-[a-z0-9]+)*\.json")
GENERATED_MAX_SECONDS = 10.0   # parser stress: refused quickly, not after a long walk


class InvalidCase(Exception):
    """A case file that does not have exactly the corpus's shape."""


def _names(value, what: str, *, allow_null: bool) -> None:
    if value is None and allow_null:
        return
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() == v and v for v in value):
        raise InvalidCase(f"{what} must be a list of non-empty names" + (" or null" if allow_null else ""))


def validate(case) -> dict:
    """The case if it has the corpus's shape, else InvalidCase saying what is wrong."""
    if not isinstance(case, dict):
        raise InvalidCase("a case is a JSON object")
    unknown = sorted(set(case) - FIELDS)
    if unknown:
        raise InvalidCase(f"unknown field(s): {', '.join(unknown)}")
    for required in ("allowed_tables", "expect", "code", "why"):
        if required not in case:
            raise InvalidCase(f"missing field: {required}")
    if ("sql" in case) == ("generate" in case):
        raise InvalidCase("exactly one of sql and generate")
    if "sql" in case and (not isinstance(case["sql"], str) or not case["sql"].strip()):
        raise InvalidCase("sql must be a non-empty string")
    if "generate" in case:
        g = case["generate"]
        if not isinstance(g, dict) or set(g) - GENERATE_FIELDS or not {"repeat", "times"} <= set(g):
            raise InvalidCase("generate is an object with repeat, times and optional prefix/middle/close/suffix")
        if not all(isinstance(g[k], str) for k in g if k != "times") or not g["repeat"]:
            raise InvalidCase("generate's parts are strings, repeat non-empty")
        if not isinstance(g["times"], int) or isinstance(g["times"], bool) or not 1 <= g["times"] <= 200_000:
            raise InvalidCase("generate.times is an integer from 1 to 200000")
    _names(case["allowed_tables"], "allowed_tables", allow_null=True)
    if "allowed_functions" in case:
        _names(case["allowed_functions"], "allowed_functions", allow_null=False)
    if "writes" in case and not isinstance(case["writes"], bool):
        raise InvalidCase("writes must be true or false")
    if "max_seconds" in case and (isinstance(case["max_seconds"], bool)
                                  or not isinstance(case["max_seconds"], (int, float)) or case["max_seconds"] <= 0):
        raise InvalidCase("max_seconds must be a positive number")
    expect, code = case["expect"], case["code"]
    if expect not in (200, 400, 403) or isinstance(expect, bool):
        raise InvalidCase("expect must be 200, 400 or 403")
    if expect == 200:
        if code is not None:
            raise InvalidCase("a 200 case has code null")
    else:
        codes = code if isinstance(code, list) else [code]
        if not codes or len(set(codes)) != len(codes) or not all(isinstance(c, str) for c in codes):
            raise InvalidCase("code is a code, or a non-empty list of distinct codes any of which is right")
        for c in codes:
            if c not in CODES:
                raise InvalidCase(f"unknown code {c!r} (known: {', '.join(sorted(CODES))})")
            if CODES[c] != expect:
                raise InvalidCase(f"code {c} answers {CODES[c]}, not {expect}")
    if "forbidden" in case:
        _names(case["forbidden"], "forbidden", allow_null=False)
        codes = code if isinstance(code, list) else [code]
        if codes != ["table_not_allowed"] or not case["forbidden"]:
            raise InvalidCase("forbidden (the names the refusal must give) needs code table_not_allowed alone")
    if not isinstance(case["why"], str) or not case["why"].strip():
        raise InvalidCase("why is a one-line reason")
    if "\n" in case["why"]:
        raise InvalidCase("why is one line")
    return case


def load_cases() -> tuple[list, list[str]]:
    params, problems = [], []
    seen_dirs = sorted(p.name for p in CASES.iterdir() if p.is_dir())
    if seen_dirs != sorted(DIALECTS):
        problems.append(f"tests/cases/tables holds {seen_dirs}, expected one folder per dialect {list(DIALECTS)}")
    for dialect in DIALECTS:
        numbers: dict[str, str] = {}
        for path in sorted((CASES / dialect).iterdir()):
            where = f"{dialect}/{path.name}"
            try:
                if not FILE_NAME.fullmatch(path.name):
                    raise InvalidCase("file name must be <nnn>-<short-name>.json (lower case, digits, dashes)")
                number = path.name[:3]
                if number in numbers:
                    raise InvalidCase(f"number {number} also used by {numbers[number]}")
                numbers[number] = path.name
                try:
                    case = json.loads(path.read_text(encoding="utf-8"))
                except ValueError as exc:
                    raise InvalidCase(f"not JSON: {exc}") from None
                validate(case)
            except InvalidCase as exc:
                problems.append(f"invalid_case {where}: {exc}")
                continue
            params.append(pytest.param(dialect, path.stem, case, id=f"{dialect}/{path.stem}"))
    return params, problems


PARAMS, PROBLEMS = load_cases()
if PROBLEMS:
    # Fails collection of this module: every malformed case is named.
    raise InvalidCase("\n".join(PROBLEMS))


def substitute(value, names: dict[str, str]):
    if isinstance(value, str):
        for token, real in names.items():
            value = value.replace(token, real)
        return value
    if isinstance(value, list):
        return [substitute(v, names) for v in value]
    return value


def case_sql(case: dict, names: dict[str, str]) -> str:
    if "sql" in case:
        return substitute(case["sql"], names)
    g = {k: substitute(v, names) for k, v in case["generate"].items()}
    n = g["times"]
    return g.get("prefix", "") + g["repeat"] * n + g.get("middle", "") + g.get("close", "") * n + g.get("suffix", "")


class Env:
    """One dialect: its server, database and keys (one per distinct grant set)."""

    def __init__(self, server: Server, target):
        self.server, self.target = server, target
        self.keys: dict[tuple, str] = {}
        self.before = target.snapshot()

    def key(self, tables, functions, writes: bool) -> str:
        grant = (None if tables is None else tuple(tables), None if functions is None else tuple(functions), writes)
        if grant not in self.keys:
            body = {"name": f"corpus-{len(self.keys)}", "connections": [CONNECTION], "allowed_tables": tables,
                    "allow_writes": writes}
            if functions is not None:
                body["allowed_functions"] = functions
            reply = self.server.post("/api/v1/api-keys", body)
            assert reply.status == 201, f"the key for {grant} could not be created: {reply}"
            self.keys[grant] = reply.json["secret"]
        return self.keys[grant]


def _env(dialect: str):
    server = Server(env={"QAG_ALLOW_WRITES": "1"})
    target = None
    try:
        target = sqlite_target(server.home) if dialect == "sqlite" else BUILDERS[dialect]()
        reply = server.post("/api/v1/connections", {"name": CONNECTION, "db": target.db, **target.fields})
        assert reply.status == 201, reply
        env = Env(server, target)
    except BaseException:
        if target is not None:
            target.cleanup()
        server.close()
        raise
    return env


@pytest.fixture(scope="module")
def envs():
    """Each dialect's Env, started when its first case runs; all torn down at the end of the module."""
    started: dict[str, Env] = {}

    def get(dialect: str) -> Env:
        if dialect not in started:
            started[dialect] = _env(dialect)
        return started[dialect]

    yield get
    for env in started.values():
        env.target.cleanup()
        env.server.close()


def test_corpus_is_large_enough():
    per = {d: sum(1 for p in PARAMS if p.values[0] == d) for d in DIALECTS}
    assert sum(per.values()) >= 400 and min(per.values()) >= 100, per


@pytest.mark.parametrize("case", [
    {"allowed_tables": ["customer"], "expect": 200, "code": None},                               # no why, no sql
    {"sql": "SELECT 1", "allowed_tables": "customer", "expect": 200, "code": None, "why": "x"},
    {"sql": "SELECT 1", "allowed_tables": None, "expect": 403, "code": None, "why": "x"},
    {"sql": "SELECT 1", "allowed_tables": None, "expect": 403, "code": "table_not_alowed", "why": "x"},
    {"sql": "SELECT 1", "allowed_tables": None, "expect": 400, "code": "read_only", "why": "x"},
    {"sql": "SELECT 1", "allowed_tables": None, "expect": "403", "code": "read_only", "why": "x"},
    {"sql": "SELECT 1", "allowed_tables": None, "expect": 200, "code": None, "why": "x", "forbiden": ["a"]},
    {"sql": "SELECT 1", "allowed_tables": None, "expect": 403, "code": "read_only", "why": "x", "forbidden": ["a"]},
    {"sql": "SELECT 1", "allowed_tables": None, "expect": 200, "code": None, "why": "x", "writes": "yes"},
    {"sql": "SELECT 1", "generate": {"repeat": "x", "times": 2}, "allowed_tables": None, "expect": 200,
     "code": None, "why": "x"},
    {"generate": {"repeat": "x", "times": 0}, "allowed_tables": None, "expect": 200, "code": None, "why": "x"},
    {"sql": "SELECT 1", "allowed_tables": [""], "expect": 200, "code": None, "why": "x"},
])
def test_a_malformed_case_is_refused(case):
    with pytest.raises(InvalidCase):
        validate(case)


@pytest.mark.e2e
@pytest.mark.parametrize("dialect,name,case", PARAMS)
def test_case(envs, dialect, name, case):
    env = envs(dialect)
    names = env.target.names
    sql = case_sql(case, names)
    key = env.key(substitute(case["allowed_tables"], names), substitute(case.get("allowed_functions"), names),
                  case.get("writes", False))
    started = time.monotonic()
    reply = env.server.post("/execute_sql", {"sql": sql, "connection_name": CONNECTION}, key=key)
    elapsed = time.monotonic() - started
    shown = sql if len(sql) < 300 else sql[:300] + f"... ({len(sql)} characters)"
    context = f"{case['why']}\nSQL: {shown}\nreply: {reply.status} {reply.body[:500]!r}"
    assert reply.status == case["expect"], context
    if case["expect"] != 200:
        body = reply.json
        codes = case["code"] if isinstance(case["code"], list) else [case["code"]]
        assert body.get("code") in codes, context
        for table in substitute(case.get("forbidden", []), names):
            assert table in body.get("error", ""), f"the refusal does not name {table}\n{context}"
    limit = case.get("max_seconds", GENERATED_MAX_SECONDS if "generate" in case else None)
    if limit is not None:
        assert elapsed < limit, f"answered after {elapsed:.1f} s (limit {limit} s)\n{context}"


@pytest.mark.e2e
@pytest.mark.parametrize("dialect", DIALECTS)
def test_database_unchanged_after_the_corpus(envs, dialect):
    """Runs after every case (pytest keeps definition order): nothing a case sent changed the database."""
    env = envs(dialect)
    assert env.target.snapshot() == env.before
    assert env.target.home_files() == []
    for name in EVIL_FILES:
        assert not (Path(env.server.home) / name).exists(), name
