"""What every management handler shares: strict bodies, ETags and If-Match, names, the audit trail."""

from __future__ import annotations

import hashlib
import hmac
import json

from ..auth import now_text
from ..errors import QagError
from ..http.response import Response, json_response
from ..shapes import COLLECTION_NAME, CONNECTION_NAME, QUERY_NAME  # noqa: F401 (the names' one description)


_VALID_QUERY_NAMES: set[str] = set()   # names judged valid already: every call of a saved query checks its name
_VALID_QUERY_NAMES_MAX = 4096


def valid_query_name(name) -> bool:
    if type(name) is str and name in _VALID_QUERY_NAMES:   # exact str only: a subclass could hash as another
        return True
    valid = isinstance(name, str) and QUERY_NAME.fullmatch(name) is not None and not name.startswith(".")
    if valid and type(name) is str:
        if len(_VALID_QUERY_NAMES) >= _VALID_QUERY_NAMES_MAX:
            _VALID_QUERY_NAMES.clear()   # bounded: names in the URL are the caller's to choose
        _VALID_QUERY_NAMES.add(name)
    return valid


def body_object(request, *, required: bool = True) -> dict:
    """A management body: a JSON object sent as JSON; absent → {} unless required."""
    value = request.json_object(lenient_content_type=False, invalid_message="Request body must be a JSON object")
    if value is None:
        if required:
            raise QagError("invalid_body", "Request body must be a JSON object")
        return {}
    _refuse_wide_integers(value)
    return value


_INT64 = range(-(1 << 63), 1 << 63)


def _refuse_wide_integers(body: dict) -> None:
    """What a management body stores (a parameter's default or bounds, a port, an option) must fit 64 bits: no
    database binds a wider integer, and the metadata cache that hands the stored rows to every worker can't
    hold one, so every later call that read the row failed."""
    stack: list = [body]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
        elif type(value) is int and value not in _INT64:
            raise QagError("invalid_body", "Request body holds an integer outside 64 bits "
                                           "(from -9223372036854775808 to 9223372036854775807)")


def refuse_unknown(body: dict, allowed, message: str = "Unknown field(s): {}") -> None:
    unknown = sorted(k for k in body if k not in allowed)
    if unknown:
        raise QagError("unknown_field", message.format(", ".join(unknown)))


def etag_of(state) -> str:
    """A hash of the stored state: any change through any route, by any process, changes it."""
    canonical = json.dumps(state, sort_keys=True, separators=(",", ":"), default=str)
    return '"' + hashlib.md5(canonical.encode("utf-8"), usedforsecurity=False).hexdigest() + '"'


def keyed_digest(key: bytes, value) -> str:
    """An HMAC of a secret value, for state hashes that must not reveal it."""
    return hmac.new(key, str(value).encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()


def check_if_match(request, state, what: str) -> None:
    wanted = request.header("If-Match")
    if wanted is None:
        return
    # One value, compared whole (contract 5.1, as QueryAPIGate): a list, a weak W/"..." or an unquoted tag is
    # neither * nor the current ETag, so the change is refused rather than made on a guess.
    wanted = wanted.strip()
    if wanted == "*" or wanted == etag_of(state):
        return
    raise QagError("precondition_failed", f"This {what} changed since you loaded it - reload it and try again")


def with_etag(value: dict, state, status: int = 200, extra_headers=None) -> Response:
    headers = [("ETag", etag_of(state))] + list(extra_headers or [])
    return json_response(value, status, headers)


def audit(store, caller, action: str, target: str, changes: dict) -> None:
    """One audit entry per successful change; callers pass changes with secrets already removed."""
    store.audit(now_text(), caller.label if caller.name is not None else "-", caller.via, action, target, changes)


def no_content() -> Response:
    return Response(204)
