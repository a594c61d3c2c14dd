"""Table allow-lists (contract 6.2): the verdict for a key on what a statement uses (qag/sql/access.py)."""

from __future__ import annotations

import functools

from qag import _speedups
from qag.errors import QagError
from qag.sql import functions
from qag.sql.access import CATALOG, DIALECTS, Access, is_exact
from qag.sql.names import fold
from qag.sql.prepare import prepare

CACHE_SIZE = 1024

CHECK_FAILED = ("This API key may only query its allowed tables - this kind of statement doesn't name the tables "
                "it reads in a way that can be checked, so it isn't allowed")
_TABLE_FUNCTION = ("This API key may only query its allowed tables - a table function such as {}() reads data the "
                   "allow-list can't see, so it isn't allowed")


def names_exact(dialect: str, default_schema: str) -> bool:
    """Whether the allow-list compares a catalog's table names as written: on PostgreSQL (the catalog holds names
    as the server folded them) and on a MySQL/MariaDB server that compares names exactly (ExactSchema); elsewhere
    they are lower-cased as the engine folds them, as qualified_grants lower-cases the grants."""
    return dialect == "postgres" or is_exact(default_schema)


def qualified_grants(allowed_tables: frozenset, default_schema: str, dialect: str) -> frozenset:
    """Grants qualified like references: a bare `t` is `<default schema>.t`; qualified grants stay as written.
    Lower-cased as the dialect's engine folds names (qag.sql.names: SQLite and PostgreSQL ASCII letters alone,
    so a grant ärger is never the table Ärger), except on a MySQL/MariaDB server that compares names exactly
    (ExactSchema)."""
    return _qualified_grants(allowed_tables, str(default_schema or ""), is_exact(default_schema), dialect)


@functools.lru_cache(maxsize=CACHE_SIZE)
def _qualified_grants(allowed_tables: frozenset, default_schema: str, exact: bool, dialect: str) -> frozenset:
    if exact:
        return frozenset(g if "." in g else f"{default_schema}.{g}" for g in allowed_tables)
    lower = fold(dialect)
    default_schema = lower(default_schema)
    return frozenset(lower(g) if "." in g else f"{default_schema}.{lower(g)}" for g in allowed_tables)


def _table_message(grants: frozenset, forbidden: tuple[str, ...]) -> str:
    return ("This API key may only query these tables: " + (", ".join(sorted(grants)) or "(none)")
            + ". Forbidden: " + ", ".join(forbidden) + ".")


def verdict(acc: Access, dialect: str, default_schema: str, allowed_tables, allowed_functions=None,
            catalog: functions.Catalog | None = None) -> None:
    """Raise the contract's 403 for a precomputed Access, or return None (allowed_tables None: unrestricted).

    catalog: what the connection's engine says about function names (functions.Catalog); None where no catalog
    is at hand (then the hand-written BUILTINS decide, and no shadowing function can be seen)."""
    if allowed_tables is None:
        return
    grants = qualified_grants(frozenset(allowed_tables), default_schema, dialect)
    if acc.failure is not None:
        if acc.failure == CATALOG and acc.tables:
            # The engine's catalog is never granted (it lists every table, its statements and statistics): named as
            # any table outside the allow-list is (contract 6.2), a grant that spells it left out of the list.
            raise QagError("table_not_allowed", _table_message(grants - frozenset(acc.tables), acc.tables))
        raise QagError("table_check_failed", CHECK_FAILED)
    granted_functions = _granted(allowed_functions)
    for name in acc.table_functions:
        if name not in granted_functions:
            raise QagError("table_not_allowed", _TABLE_FUNCTION.format(name))
    forbidden = _speedups.get("tables").forbidden(acc.tables, grants)
    if forbidden:
        raise QagError("table_not_allowed", _table_message(grants, forbidden))
    if acc.types:
        # PostgreSQL looks a type name up as it looks a table up, and a table's row type has its name: NULL::vault
        # tells whether vault exists, (NULL::vault).* shows its columns. A type the engine's catalog lists as the
        # database's own and no relation's (an enum, a domain, an extension's) tells nothing of a table.
        forbidden = _speedups.get("tables").forbidden(acc.types, grants)
        if forbidden and catalog is not None and catalog.types is not None:
            forbidden = _not_plain_types(forbidden, acc.type_names, catalog)
        if forbidden:
            raise QagError("table_not_allowed", _table_message(grants, forbidden)[:-1] + _AS_TYPES)
    _functions_verdict(acc, dialect, granted_functions, catalog)


def masked_verdict(acc: Access, dialect: str, allowed_functions=None,
                   catalog: functions.Catalog | None = None) -> None:
    """Issue 18 for a caller with mask rules and no allowed_tables: nothing that can show a masked value other
    than through its masked row source - the engine's catalogs and statistics, EXPLAIN's estimates, settings,
    diagnostics, activity (403 mask_unresolvable), and no function other than the engine's own built-ins unless
    allowed_functions names it (403 function_not_allowed), as for a table-restricted key."""
    if acc.failure is not None:
        if acc.describes:
            return              # a table's shape: names and types only, no value (SHOW TABLES, DESCRIBE t)
        if acc.failure == CATALOG:
            raise QagError("mask_unresolvable", _MASKED_CATALOG)
        raise QagError("mask_unresolvable", _MASKED_UNCHECKABLE)
    if acc.explain:
        raise QagError("mask_unresolvable", _MASKED_EXPLAIN)
    granted_functions = _granted(allowed_functions)
    for name in acc.table_functions:
        if name not in granted_functions:
            raise QagError("function_not_allowed", f"This API key may not call {name}(): it is not a known "
                                                   f"built-in function and allowed_functions doesn't name it")
    _functions_verdict(acc, dialect, granted_functions, catalog)


_MASKED_CATALOG = ("This API key has masked columns, and this statement reads the server's catalog or statistics "
                   "(which can show masked values), so it isn't allowed")
_MASKED_UNCHECKABLE = ("This API key has masked columns, and this kind of statement can't be checked for what it "
                       "reads (the server's settings, statistics, diagnostics and activity can show masked "
                       "values), so it isn't allowed")
_MASKED_EXPLAIN = ("This API key has masked columns, and EXPLAIN shows the engine's estimates, which come from "
                   "its statistics of the raw values, so it isn't allowed")


_AS_TYPES = (", named as types (a table's row type has the table's name; a type of the database's own that isn't a "
             "relation's row type is allowed when the connection's catalog lists it).")


def _not_plain_types(forbidden: tuple[str, ...], type_names, catalog: functions.Catalog) -> tuple[str, ...]:
    """Those of the forbidden types (qualified like tables) that some spelling in the statement names as other than
    one of the database's own types that no relation's row type is (`order_status` and `public.order_status` are
    both public.order_status, and each is looked up its own way)."""
    plain: dict[str, bool] = {}
    for qualified, schema, name in type_names:
        plain[qualified] = plain.get(qualified, True) and catalog.plain_type(schema, name)
    return tuple(qualified for qualified in forbidden if not plain.get(qualified, False))


def _not_builtin(name: str) -> str:
    # One message whether no function of the name exists or one of the database's own could answer the call: the
    # answer must not tell a key which names the schema holds.
    return (f"This API key may not call {name}(): it is not one of the engine's own built-in functions that "
            f"nothing else can answer, and allowed_functions doesn't name it")


def _granted(allowed_functions) -> frozenset:
    return frozenset(f.lower() for f in allowed_functions) if allowed_functions else frozenset()


# Write operations of statements whose calls qag reads (rows changed or locked): a narrowed key's statement of only
# these must be readable. Others (CREATE, ALTER, CALL, DO, ...) are never read for calls, and a key allowed them
# runs what it defines or calls by design.
_ROW_WRITES = frozenset(("insert", "update", "delete", "replace", "merge", "lock"))


def narrowed_writes_verdict(acc: Access, dialect: str, write_ops: frozenset, allowed_functions=None,
                            catalog: functions.Catalog | None = None) -> None:
    """For a key whose allowed_write_ops narrow its writes (and that has no allowed_tables: verdict() covers those),
    in a call that may write (one whose statement writes nothing runs read-only: RunHandlers.writes_allowed): the
    write operations the guard reads in the statement's text must be all it does, so it calls only the engine's own
    built-ins and the functions allowed_functions names, never a denied one (403 function_not_allowed). A
    user-defined function's writes are not the statement's: an insert-only key's `INSERT INTO log SELECT wipe()`
    would delete. Side channels stay open to it, as to any key without an allow-list, but a user function named
    like one is judged as a call. A statement of row writes whose calls can't all be read (the catalog, too large
    or deep to read) is refused: what it calls is unknown. `write_ops`: the guard's reading of the statement."""
    if acc.failure is not None:
        if not write_ops <= _ROW_WRITES:
            return      # DDL, CALL, DO...: operations the guard found allowed, never read for calls
        raise QagError("function_not_allowed", "This API key may only write what its statement says, and the "
                                               "functions this statement calls can't be read (it reads the "
                                               "server's catalog, or is too large or deep to read): send fewer "
                                               "rows a call, or name no catalog")
    granted = _granted(allowed_functions)
    for name in acc.side:
        if not name.startswith("@@") and name not in granted and not functions.allowed_builtin("", name, dialect,
                                                                                                catalog):
            raise QagError("function_not_allowed", _not_builtin(name))
    for name in acc.table_functions:
        if name not in granted:
            raise QagError("function_not_allowed", _not_builtin(name))
    _functions_verdict(acc, dialect, granted, catalog, channels=False)


def _functions_verdict(acc: Access, dialect: str, granted: frozenset, catalog, channels: bool = True) -> None:
    """channels: refuse the side channels too (table-restricted and masked keys), not only what may write."""
    if acc.denied:
        name = acc.denied[0]
        raise QagError("function_not_allowed", f"This API key may not call {name}(): it reaches outside its "
                                               f"statement (files, locks, sequences, sessions or server state)")
    for name in acc.casts if channels else ():
        if name not in granted:
            raise QagError("function_not_allowed", f"This API key may not cast to {name}: PostgreSQL looks the "
                                                   f"name up in its catalog, so the answer tells whether tables "
                                                   f"and other objects it may not see exist, and allowed_functions "
                                                   f"doesn't name {name}")
    for name in acc.side if channels else ():
        if name not in granted:
            shown = name if name.startswith("@@") else name + "()"
            raise QagError("function_not_allowed", f"This API key may not read {shown}: the server's settings, "
                                                   f"statistics, catalogs and activity can show data it may not "
                                                   f"see, and allowed_functions doesn't name it")
    for name in acc.user_functions:
        if name not in granted:
            raise QagError("function_not_allowed", f"This API key may not call {name}(): it is not a known "
                                                   f"built-in function and allowed_functions doesn't name it")
    if dialect == "mysql":
        # The walk decided built-ins by name; a stored function of the same name can answer an unqualified call
        # where the server has no native function of that name (MariaDB 10.11: regexp_like, array_agg, ...).
        if catalog is not None and acc.calls:
            for _, name in acc.calls:
                if name in catalog.shadowed and name not in granted:
                    raise QagError("function_not_allowed", _not_builtin(name))
        return
    _fields_verdict(acc, dialect, granted, catalog)
    for schema, name in acc.operators:
        # An operator is a call of its function: one of the database's own (SQL or PL code that may read any table
        # or write) answers a name its schema defines, whatever the arguments' types make PostgreSQL pick.
        if schema == "pg_catalog" or name in granted:
            continue
        if schema or (catalog is not None and name in catalog.operators):
            raise QagError("function_not_allowed", f"This API key may not use the operator {name}: it is not one "
                                                   f"of the engine's own operators that nothing else can answer, and "
                                                   f"allowed_functions doesn't name it")
    for schema, name in (*acc.calls, *functions.grammar_calls(acc.grammar_calls, catalog)):
        if functions.allowed_builtin(schema, name, dialect, catalog):
            continue
        written = f"{schema}.{name}" if schema else name
        if written in granted or name in granted:
            continue
        if catalog is not None and not schema and name in catalog.shadowed:
            raise QagError("function_not_allowed", _not_builtin(name))
        raise QagError("function_not_allowed", _not_builtin(written))


def _fields_verdict(acc: Access, dialect: str, granted: frozenset, catalog) -> None:
    """PostgreSQL reads `x.f` and `(x).f` as a call f(x) when x has no column f (attribute notation): a field
    named like a function the call's search_path can call with one argument is judged as that call. Without
    the engine's catalog, the denied and side-channel names still are."""
    for name in acc.fields:
        if catalog is not None and name not in catalog.projections:
            continue
        if functions.denied(name, dialect):
            raise QagError("function_not_allowed", f"This API key may not call {name}() (written as a field, "
                                                   f".{name}, PostgreSQL calls it): it reaches outside the allowed "
                                                   f"tables (files, locks, sequences, sessions or server state)")
        if name in granted:
            continue
        if functions.side_channel(name, dialect):
            raise QagError("function_not_allowed", f"This API key may not read {name}() (written as a field, "
                                                   f".{name}, PostgreSQL calls it): the server's settings, "
                                                   f"statistics, catalogs and activity can show data it may not "
                                                   f"see, and allowed_functions doesn't name it")
        if catalog is not None and not functions.allowed_builtin("", name, dialect, catalog):
            raise QagError("function_not_allowed", f"This API key may not call {name}(): written as a field "
                                                   f"(.{name}), PostgreSQL calls a function of that name when the "
                                                   f"row has no such column, it is not a known built-in function, "
                                                   f"and allowed_functions doesn't name it")


def check_tables(sql: str, dialect: str, default_schema: str, allowed_tables: list[str] | None,
                 allowed_functions: list[str] | None = None) -> None:
    """Contract 6.2 for one statement: raise QagError table_not_allowed / table_check_failed /
    function_not_allowed / table_check_unsupported, or return None. allowed_tables None = unrestricted."""
    if allowed_tables is None:
        return
    canonical = {"postgresql": "postgres", "mariadb": "mysql"}.get(dialect, dialect)
    if canonical not in DIALECTS:
        raise QagError("table_check_unsupported", f"This API key may only query its allowed tables, and table "
                                                  f"checks are not supported for '{dialect}' connections")
    verdict(prepare(sql, canonical).uses(default_schema), canonical, default_schema, allowed_tables,
            allowed_functions)
