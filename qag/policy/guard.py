"""The SQL guard (contract 4.3): one statement, read-only unless writes are allowed, allowed write operations."""

from __future__ import annotations

from qag.errors import QagError
from qag.sql.prepare import Prepared
from qag.sql.writes import read_only_message

_UNREADABLE = ("Only read-only statements (SELECT, WITH, SHOW, DESCRIBE, EXPLAIN) are allowed - this statement "
               "can't be classified ({}), so it is refused.")


def write_op_not_allowed_message(allowed_write_ops: frozenset[str]) -> str:
    """The write_op_not_allowed refusal, naming the operations the key may perform."""
    if not allowed_write_ops:
        return "This API key may not perform write operations."
    return "This API key may only perform these write operations: " + ", ".join(sorted(allowed_write_ops)) + "."


def check(prepared: Prepared, *, writes_allowed: bool, allowed_write_ops: frozenset[str] | None) -> None:
    """Refuse the statement for this call, or return None.

    Order (contract 6.2): several statements (400 multiple_statements) → a write when writes aren't allowed
    (403 read_only) → a write operation outside allowed_write_ops (403 write_op_not_allowed; None = any).
    A statement that can't be classified (empty, unterminated literal or comment) never runs: 403 read_only
    when writes aren't allowed, else 400 invalid_request - the database would refuse it anyway, and a
    statement we can't read can't be checked against allowed_write_ops.
    """
    p = prepared
    if p.multiple:
        raise QagError("multiple_statements", "Only a single SQL statement can be executed at a time")
    ops = p.write_ops
    if not ops:
        return
    if p.unreadable is not None:
        if not writes_allowed:
            raise QagError("read_only", _UNREADABLE.format(p.unreadable))
        raise QagError("invalid_request", f"The SQL statement can't be read: {p.unreadable}")
    if not writes_allowed:
        raise QagError("read_only", read_only_message(ops))
    if allowed_write_ops is not None:
        allowed = frozenset(op.lower() for op in allowed_write_ops)
        if not ops <= allowed:
            raise QagError("write_op_not_allowed", write_op_not_allowed_message(allowed))
