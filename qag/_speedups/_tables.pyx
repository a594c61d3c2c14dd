# cython: language_level=3, boundscheck=False, wraparound=False
"""Compiled twin of tables.py: the tables a key's qualified grants don't cover (rules in its docstring)."""

from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from cpython.set cimport PySet_Contains


def forbidden(tables, grants):
    """The sorted tables (a tuple of str) that are not in grants (a frozenset of str)."""
    if type(tables) is not tuple:
        raise TypeError("tables must be a tuple of str")
    if type(grants) is not frozenset:
        raise TypeError("grants must be a frozenset of str")
    cdef Py_ssize_t i, n = PyTuple_GET_SIZE(tables)
    cdef list out = None
    cdef object table
    for i in range(n):
        table = <object>PyTuple_GET_ITEM(tables, i)
        if type(table) is not str:
            raise TypeError("tables must be a tuple of str")
        if not PySet_Contains(grants, table):
            if out is None:
                out = []
            out.append(table)
    if out is None:
        return ()
    if len(out) > 1:
        out.sort()
    return tuple(out)
