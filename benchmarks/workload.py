"""What a benchmark case asks for: saved queries, the user key space, and how each reply is checked.

A case (the six-database TPC-C case, the pgbench case, the SQLite demo) is a list of `Query` objects over one
`KeySpace`. The same definitions feed three consumers, so every target runs exactly the same work:

- the management API of a gateway (`create_body`): qag and QueryAPIGate take the same bodies;
- wrk's Lua scripts (`lua_config`): paths to call, the spot check of each reply;
- the direct database client (`dbdirect.c`, `direct_config`): the same SQL with the same values.

Users are drawn uniformly or by Zipf (s = 1.0) over the key space; the hot ranks are scattered over the users
by a fixed permutation, `user = (rank * PERM_STRIDE + PERM_OFFSET) mod N`, computed identically in Lua and C.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

PERM_STRIDE = 1_000_003   # a prime: the permutation is a bijection whenever N is not a multiple of it
PERM_OFFSET = 12_345
_PARAM = re.compile(r":([A-Za-z_]\w*)")


_HOLE = re.compile(r"\{(\w+)\}")


def fill(template: str, values: dict) -> str:
    """Replace `{name}` holes whose name is a key-space value (as the Lua script and the C client do)."""
    return _HOLE.sub(lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0), template)


@dataclass(frozen=True)
class KeySpace:
    """Users as mixed-radix numbers: `dims` = ((name, size), ...), most significant first, values from 1."""

    dims: tuple[tuple[str, int], ...]

    @property
    def size(self) -> int:
        return math.prod(n for _, n in self.dims)

    def values(self, user: int) -> dict[str, int]:
        out = {}
        for name, n in reversed(self.dims):
            out[name] = user % n + 1
            user //= n
        return out

    def check(self) -> None:
        if self.size % PERM_STRIDE == 0:
            raise ValueError("key space size is a multiple of the permutation stride")


@dataclass(frozen=True)
class Query:
    """One saved query: SQL with :params, its rules, the fixed extra arguments and the reply check.

    `check` names the key-space values that the first row must carry first, in order, as `column` names
    (`(("c_w_id", "w"), ...)` means the body starts `[{"c_w_id":<w>,...`). `write` marks a statement that
    changes data (the gateway needs writes allowed and a key with write access to it). `mixed` False keeps a
    query out of the `mix` workload and the tools' default mixes.
    """

    name: str
    description: str
    sql: str
    parameters: dict
    check: tuple[tuple[str, str], ...]
    extra: dict = field(default_factory=dict)       # fixed query-string arguments (page_size, threshold, ...)
    write: bool = False
    mixed: bool = True       # drawn by the `mix` workload (a stream variant of a page is run on its own)

    def create_body(self, connection: str) -> dict:
        return {"name": self.name, "description": self.description, "author": "qag-benchmarks", "sql": self.sql,
                "connection_name": connection, "parameters": self.parameters, "publish": True}

    def path_template(self, space: KeySpace) -> str:
        """`/q/<name>?w={w}&...`: the used key-space values as `{name}` holes, then the fixed extras."""
        used = [name for name, _ in space.dims if f":{name}" in self.sql]
        args = [f"{name}={{{name}}}" for name in used] + [f"{k}={v}" for k, v in self.extra.items()]
        return f"/q/{self.name}?" + "&".join(args)

    def check_template(self) -> str:
        if self.extra.get("stream"):
            # A stream's rows are NDJSON lines, written with a space after each separator (contract 3.7).
            return "{" + ", ".join(f'"{col}": {{{name}}}' for col, name in self.check) + ", "
        return "[{" + ",".join(f'"{col}":{{{name}}}' for col, name in self.check) + ","

    def direct_sql(self) -> tuple[str, list[str]]:
        """The SQL with `:name` holes replaced by `{name}` (and the fixed extras inlined), for the C client."""
        names: list[str] = []

        def sub(m: re.Match) -> str:
            name = m.group(1)
            if name in self.extra:
                return str(int(self.extra[name]))
            names.append(name)
            return "{" + name + "}"
        return _PARAM.sub(sub, self.sql), names


@dataclass(frozen=True)
class Case:
    """A named workload: the queries, the key space and the database the direct client talks to."""

    name: str
    db: str                      # "mysql" | "postgres" | "sqlite"
    space: KeySpace
    queries: tuple[Query, ...]
    connection: dict             # gateway connection body (name, db, host, ... )
    direct: dict | None          # the direct client's DSN fields, None when there is no direct client
    grants: dict = field(default_factory=dict)   # extra grant fields for the plain key
    governed: dict = field(default_factory=dict)  # allowed_tables / mask for the governed key

    def query(self, name: str) -> Query:
        for q in self.queries:
            if q.name == name:
                return q
        raise KeyError(f"case {self.name} has no query {name!r}; it has {', '.join(q.name for q in self.queries)}")

    def key_body(self, name: str, queries: list[Query], governed: bool) -> dict:
        grants = [{"name": q.name, "allow_writes": True} if q.write else q.name for q in queries]
        body = {"name": name, "connections": [], "queries": grants, **self.grants}
        if governed:
            body.update(self.governed)
        return body


def _lua_str(s: str) -> str:
    return json.dumps(s)   # a JSON string literal is a valid Lua string literal for this text (ASCII)


def lua_config(case: Case, queries: list[Query], distribution: str, key: str | None, check: bool) -> str:
    """A Lua chunk returning the request mix for wrk's scripts (benchmarks/lua/*.lua)."""
    dims = ", ".join(f"{{{_lua_str(n)}, {size}}}" for n, size in case.space.dims)
    reqs = []
    for q in queries:
        reqs.append(f"{{path = {_lua_str(q.path_template(case.space))}, "
                    f"check = {_lua_str(q.check_template() if check else '')}}}")
    return (f"return {{\n  dims = {{{dims}}},\n  size = {case.space.size},\n"
            f"  distribution = {_lua_str(distribution)},\n  stride = {PERM_STRIDE}, offset = {PERM_OFFSET},\n"
            f"  key = {_lua_str(key or '')},\n  requests = {{\n    " + ",\n    ".join(reqs) + "\n  }\n}\n")


def direct_config(case: Case, queries: list[Query]) -> str:
    """The C client's input: one line per header field, then one `query` line per statement.

    Lines: `dims <name>:<size> ...`, then per query `query <check count>\\t<SQL with {name} holes>` where the
    first <check count> result columns must equal the key-space values named by the check, in order.
    """
    lines = ["dims " + " ".join(f"{n}:{s}" for n, s in case.space.dims)]
    for q in queries:
        sql, _ = q.direct_sql()
        sql = " ".join(sql.split())
        lines.append(f"query {len(q.check)} {','.join(name for _, name in q.check)}\t{sql}")
    return "\n".join(lines) + "\n"
