"""Pure twin of the table verdict: which of a statement's qualified tables a key's qualified grants don't cover."""

from __future__ import annotations


def forbidden(tables: tuple, grants: frozenset) -> tuple:
    """The sorted tables (a tuple of str) that are not in grants (a frozenset of str).

    TypeError if tables is not a tuple, grants not a frozenset, or an entry of tables is not a str.
    """
    if type(tables) is not tuple:
        raise TypeError("tables must be a tuple of str")
    if type(grants) is not frozenset:
        raise TypeError("grants must be a frozenset of str")
    out = []
    for table in tables:
        if type(table) is not str:
            raise TypeError("tables must be a tuple of str")
        if table not in grants:
            out.append(table)
    if len(out) > 1:
        out.sort()
    return tuple(out)
