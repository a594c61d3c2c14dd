"""Schemathesis against a live qag: every operation of a caller's /openapi.json, fuzzed with schema-valid requests,
each response checked (server errors, documented statuses, content types, response schemas, valid data accepted)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from urllib.parse import quote

import requests
from hypothesis import HealthCheck, Phase, assume, given, settings

import schemathesis
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (content_type_conformance, positive_data_acceptance,
                                               response_schema_conformance, status_code_conformance)

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          positive_data_acceptance]
# Operations that reach outside the machine (a connection's host is the caller's to choose) or never end (an SSE
# stream) are not fuzzed: the first would send traffic to whatever host a generated body names.
SKIPPED = {("POST", "/api/v1/connections/test"), ("POST", "/api/v1/connections/databases"), ("GET", "/events")}


@dataclass
class Outcome:
    """Failures found by one run: (method path, check, status, title) → how many cases, and one example each."""

    calls: int = 0
    statuses: dict = field(default_factory=dict)
    failures: dict = field(default_factory=dict)
    examples: dict = field(default_factory=dict)

    @property
    def count(self) -> int:
        return sum(self.failures.values())

    def summary(self, limit: int = 40) -> str:
        lines = [f"{self.count} failures in {self.calls} calls"]
        for key, n in sorted(self.failures.items(), key=lambda kv: -kv[1])[:limit]:
            lines.append(f"  {n:4d} × {key[0]} [{key[1]}] {key[2]}: {key[3]}\n        e.g. {self.examples[key]}")
        return "\n".join(lines)


def _dependencies_hold(case, operation: dict) -> bool:
    """The documented dependencies between parameters (x-qag-dependencies): a case that breaks one is not a
    schema-valid request, so it is not sent."""
    query = {**(case.path_parameters or {}), **(case.query or {})}
    body = case.body if isinstance(case.body, dict) else {}
    for rule in operation.get("x-qag-dependencies", ()):
        if "keys-of" in rule:
            # Every declared name must be a placeholder (:name or {name}) of the SQL beside it.
            keys = body.get(rule["keys-of"]) or {}
            text = body.get(rule["placeholders-of"])
            if keys and not (isinstance(text, str) and all(
                    re.search(rf"(?::{re.escape(k)}\b|{{{re.escape(k)}}})", text) for k in keys)):
                return False
            continue
        when = rule["if"]
        present = query.get(when["parameter"], body.get(when["parameter"]))
        if present is None or ("in" in when and str(present).strip().lower() not in when["in"]):
            continue
        for name, allowed in rule.get("then", {}).items():
            value = query.get(name, body.get(name))
            if allowed is None:
                if value is not None:
                    return False
            elif value is None or str(value).lower() not in allowed:
                return False
    return True


def _from_response(case, operation: dict) -> bool:
    """A parameter whose value only an earlier response can give (x-qag-from-response: a cursor, an ETag) is
    not generated: any other value is refused by design, not by the schema's shape."""
    names = set(operation.get("x-qag-from-response", ()))
    return not (names & set(case.query or {}) or names & set(case.headers or {}))


def _local_only(case) -> None:
    """A generated connection names this machine only: the fuzzer must never make qag call out."""
    if isinstance(case.body, dict) and "/connections" in case.operation.path:
        if "host" in case.body:
            case.body["host"] = "127.0.0.1"
        options = case.body.get("options")
        if isinstance(options, dict):
            for name in list(options):
                if "host" in name.lower() or name.lower() in ("service", "servicefile", "passfile"):
                    del options[name]


def fuzz(base_url: str, headers: dict, document: dict, *, max_examples: int = 25, seed: int = 22,
         only: callable = None) -> Outcome:
    """Run every (selected) operation of `document` against `base_url` with `headers`; count the failures."""
    schema = schemathesis.openapi.from_dict(document)
    outcome = Outcome()
    session = requests.Session()
    for result in schema.get_all_operations():
        operation = result.ok()
        method, path = operation.method.upper(), operation.path
        if (method, path) in SKIPPED or (only is not None and not only(method, path)):
            continue
        raw = document["paths"][path][operation.method.lower()]

        @settings(max_examples=max_examples, derandomize=True, deadline=None, database=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(operation.as_strategy())
        def run(case):
            assume(_dependencies_hold(case, raw) and _from_response(case, raw))
            _local_only(case)
            response = case.call(base_url=base_url, session=session, headers=headers, timeout=20)
            outcome.calls += 1
            seen = outcome.statuses.setdefault(f"{method} {path}", {})
            seen[response.status_code] = seen.get(response.status_code, 0) + 1
            try:
                case.validate_response(response, checks=CHECKS, headers=headers)
            except FailureGroup as group:
                for failure in group.exceptions:
                    key = (f"{method} {path}", _check_name(failure), response.status_code, failure.title)
                    outcome.failures[key] = outcome.failures.get(key, 0) + 1
                    outcome.examples.setdefault(key, _example(case, response))

        run()
    return outcome


def _check_name(failure) -> str:
    return type(failure).__name__


def _example(case, response) -> str:
    sent = {k: v for k, v in (("query", case.query), ("path", case.path_parameters), ("body", case.body))
            if v not in (None, {}) and not (k == "body" and type(v).__name__ == "NotSet")}
    return f"{json.dumps(sent, default=str)[:300]} -> {response.status_code} {response.text[:200]!r}"


def q(name: str) -> str:
    return "/q/" + quote(name, safe="")


def statuses(outcome: Outcome) -> str:
    """Which statuses each operation answered: a run whose every answer is a 404 proves little."""
    return "\n".join(f"  {op}: {dict(sorted(seen.items()))}" for op, seen in sorted(outcome.statuses.items()))
