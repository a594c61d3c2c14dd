"""What each dialect's functions do: denied, side channels, state-changing, built-ins, pure generators; the
PostgreSQL types whose input function looks names up in the catalog, and the engine's own type names."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

# Functions a table-restricted key may never call, whatever allowed_functions says: they read or write files,
# reach other servers, run SQL given as text, sleep or take locks, change server or session state, or advance
# sequences. Looked up lower-cased by the function's own name (a schema-qualified call by its last part).
_DENIED_PREFIXES: dict[str, tuple[str, ...]] = {
    "postgres": ("pg_read_", "pg_ls_", "pg_stat_file", "pg_file_", "lo_", "dblink", "pg_advisory_",
                 "pg_try_advisory_", "pg_sleep", "pg_terminate_", "pg_cancel_", "pg_reload_", "pg_rotate_",
                 "pg_create_", "pg_drop_", "pg_replication_", "pg_logical_", "pg_switch_", "pg_promote",
                 "pg_backup_", "pg_start_backup", "pg_stop_backup", "pg_wal_replay_", "pg_stat_reset",
                 "pg_import_system_", "pg_log_backend_", "pg_copy_", "pg_export_snapshot", "pg_notify"),
    "mysql": (),
    "sqlite": (),
}
_DENIED: dict[str, frozenset[str]] = {
    "postgres": frozenset((
        "query_to_xml", "query_to_xmlschema", "query_to_xml_and_xmlschema", "table_to_xml", "table_to_xmlschema",
        "table_to_xml_and_xmlschema", "schema_to_xml", "schema_to_xmlschema", "schema_to_xml_and_xmlschema",
        "database_to_xml", "database_to_xmlschema", "database_to_xml_and_xmlschema", "cursor_to_xml",
        "cursor_to_xmlschema", "ts_stat", "ts_rewrite", "set_config", "nextval", "setval", "currval", "lastval",
        "txid_current", "pg_current_xact_id", "loread", "lowrite", "dblink", "pg_notify", "pg_sleep",
        "pg_sleep_for", "pg_sleep_until", "pg_terminate_backend", "pg_cancel_backend", "pg_reload_conf",
        "pg_rotate_logfile", "pg_read_file", "pg_read_binary_file", "pg_ls_dir", "pg_stat_file",
        "brin_summarize_new_values", "brin_summarize_range", "brin_desummarize_range", "gin_clean_pending_list",
        "pg_stat_statements_reset",
    )),
    "mysql": frozenset((
        "load_file", "sleep", "benchmark", "get_lock", "release_lock", "is_free_lock", "is_used_lock",
        "release_all_locks", "master_pos_wait", "source_pos_wait", "master_gtid_wait", "wait_for_executed_gtid_set",
        "wait_until_sql_thread_after_gtids", "sys_exec", "sys_eval", "sys_get", "sys_set", "lib_mysqludf_sys_info",
        "nextval", "setval", "lastval", "sequence_next",
    )),
    "sqlite": frozenset((
        "load_extension", "sqlite_log", "readfile", "writefile", "edit", "fts3_tokenizer", "sqlite_dbpage", "zipfile",
        "sqlar_compress", "sqlar_uncompress", "fsdir", "lsmode",
    )),
}

# Side channels (issue 18): built-ins that show the server's settings, statistics, catalogs or other sessions'
# activity, which can reveal values of tables a key may not read and of columns masked for it. Refused for
# table-restricted and masked keys unless the key's allowed_functions names them (unlike _DENIED, a grant can
# open them). Looked up like _DENIED.
_SIDE_PREFIXES: dict[str, tuple[str, ...]] = {
    # pg_stat_*: statistics and activity (pg_stat_get_activity, pg_stat_get_backend_*, counters per table);
    # pg_get_*: catalog definitions and server internals (pg_get_viewdef, pg_get_functiondef, pg_get_expr,
    # pg_get_backend_memory_contexts, pg_get_replication_slots, ...); pg_show_*: pg_settings' functions;
    # pg_control_*: the control file; pg_relation_*: sizes and files of any table; WAL positions.
    # to_reg*: a name looked up in the catalog (to_regclass, to_regtype, ...); has_*: has_table_privilege and
    # the other has_*_privilege, which look their object up by name or OID; acl*, hash_aclitem*: an aclitem's text
    # names roles (aclcontains(acl, 'r=r/postgres') reads its literal as one), acldefault shows owners' names.
    "postgres": ("pg_stat_", "pg_get_", "pg_show_", "pg_control_", "pg_relation_", "pg_current_wal_",
                 "pg_last_wal_", "pg_last_xact_", "pg_walfile_", "pg_xact_", "pg_identify_object", "to_reg",
                 "has_", "acl", "hash_aclitem", "pg_event_trigger_"),
    "mysql": (),
    "sqlite": (),
}
_SIDE: dict[str, frozenset[str]] = {
    "postgres": frozenset((
        "current_setting", "pg_hba_file_rules", "pg_ident_file_mappings", "pg_config", "pg_settings_get_flags",
        "pg_current_logfile", "pg_lock_status", "pg_blocking_pids", "pg_safe_snapshot_blocking_pids",
        "pg_prepared_xact", "pg_current_snapshot", "txid_current_snapshot", "txid_status", "pg_last_committed_xact",
        "pg_mcv_list_items", "pg_sequence_last_value", "pg_sequence_parameters", "obj_description",
        "col_description", "shobj_description", "pg_describe_object", "pg_tablespace_databases",
        "pg_tablespace_location", "pg_filenode_relation", "pg_database_size", "pg_tablespace_size",
        "pg_table_size", "pg_indexes_size", "pg_total_relation_size", "pg_notification_queue_usage",
        "pg_available_extensions", "pg_available_extension_versions", "pg_cursor", "pg_prepared_statement",
        "pg_timezone_names", "pg_timezone_abbrevs", "pg_partition_tree", "pg_partition_ancestors",
        "pg_partition_root", "pg_options_to_table",
        # Catalog lookups by name or OID: each answers whether a table, type, function, schema or role exists
        # (an unknown name is an error or NULL, a known one a value), and some map an OID back to its name
        # (format_type(oid) is a table's name for its row type's OID). pg_typeof's regtype compares with a
        # literal by reading the literal as a type name: `pg_typeof(1) IN ('int4', 'vault')`.
        "pg_has_role", "row_security_active", "format_type", "pg_typeof", "get_current_ts_config",
        "pg_column_is_updatable", "pg_nextoid", "pg_extension_config_dump", "pg_input_is_valid",
        "pg_input_error_info", "makeaclitem", "pg_collation_actual_version",
        "pg_database_collation_actual_version",
        # ... by a name given as text (currtid2('vault', tid): a row's latest version in any table, an error for
        # an unknown one), or by OID: oidvectortypes names the types of a list of OIDs (a table's row type has
        # its name), satisfies_hash_partition opens a table by OID, the validators a function, amvalidate an
        # operator class; pg_extension_update_paths an extension by name
        "currtid", "currtid2", "oidvectortypes", "satisfies_hash_partition", "fmgr_c_validator",
        "fmgr_internal_validator", "fmgr_sql_validator", "plpgsql_validator", "amvalidate", "pg_extension_update_paths",
        # other sessions: whether one is blocked, as pg_blocking_pids tells
        "pg_isolation_test_session_is_blocked",
        # each name-resolving type's own functions: regclass('vault') is the cast, regclassin its input
        *(name + suffix for name in ("regclass", "regtype", "regproc", "regprocedure", "regoper", "regoperator",
                                     "regnamespace", "regrole", "regconfig", "regdictionary", "regcollation",
                                     "aclitem")
          for suffix in ("", "in", "out", "recv", "send")),
    )),
    "mysql": frozenset(),
    "sqlite": frozenset(),
}
# Side channels by the end of their name: PostgreSQL's *_is_visible(oid) (pg_table_is_visible, pg_type_is_visible,
# ...) and *_has_property (pg_index_has_property('vault', ...) reads its regclass argument as a name).
_SIDE_SUFFIXES: dict[str, tuple[str, ...]] = {
    "postgres": ("_is_visible", "_has_property"),
    "mysql": (),
    "sqlite": (),
}

# PostgreSQL types whose input looks a name up in the catalog: the object-identifier types (reg*) and aclitem
# (whose text names roles). A cast to one ('vault'::regclass, CAST(x AS regtype), an array of one) errs for an
# unknown name and gives the OID of a known one, so it tells a key whether tables it may not read exist: a side
# channel, refused for table-restricted and masked keys unless allowed_functions names the type (as it names a
# side-channel function). Functions whose parameter has one of these types read a text literal the same way;
# those that aren't text search's (regconfig, regdictionary) are in _SIDE.
RESOLVING_TYPES = frozenset(("regclass", "regtype", "regproc", "regprocedure", "regoper", "regoperator",
                             "regnamespace", "regrole", "regconfig", "regdictionary", "regcollation", "aclitem"))

# PostgreSQL's own type names outside the catalogs' row types (PostgreSQL 15's pg_catalog: base, range,
# multirange and pseudo-types), and each base type's array type as `_name`. A restricted or masked call's
# search_path puts pg_catalog first, so an unqualified name of these is always the built-in type; any other type
# name (a table's row type, a domain or enum of the database) is judged like a table (qag/policy/tables.verdict):
# `NULL::vault` tells whether vault exists and `(NULL::vault).*` shows its columns.
PG_TYPES = frozenset("""
aclitem bit bool box bpchar bytea char cid cidr circle date datemultirange daterange float4 float8 gtsvector
inet int2 int2vector int4 int4multirange int4range int8 int8multirange int8range interval json jsonb jsonpath
line lseg macaddr macaddr8 money name numeric nummultirange numrange oid oidvector path pg_brin_bloom_summary
pg_brin_minmax_multi_summary pg_dependencies pg_lsn pg_mcv_list pg_ndistinct pg_node_tree pg_snapshot point
polygon refcursor regclass regcollation regconfig regdictionary regnamespace regoper regoperator regproc
regprocedure regrole regtype text tid time timestamp timestamptz timetz tsmultirange tsquery tsrange
tstzmultirange tstzrange tsvector txid_snapshot uuid varbit varchar xid xid8 xml
any anyarray anycompatible anycompatiblearray anycompatiblemultirange anycompatiblenonarray anycompatiblerange
anyelement anyenum anymultirange anynonarray anyrange cstring event_trigger fdw_handler index_am_handler internal
language_handler pg_ddl_command record table_am_handler trigger tsm_handler unknown void
""".split())

# Table functions that produce rows from their arguments only: fine in FROM for a table-restricted key.
GENERATORS = frozenset((
    "range", "numbers", "generate_series", "system_range", "unnest", "generate_subscripts",
    "json_each", "json_tree", "jsonb_each", "json_each_text", "jsonb_each_text", "json_array_elements",
    "jsonb_array_elements", "json_array_elements_text", "jsonb_array_elements_text", "json_to_record",
    "jsonb_to_record", "json_to_recordset", "jsonb_to_recordset", "json_populate_record", "jsonb_populate_record",
    "json_populate_recordset", "jsonb_populate_recordset", "regexp_split_to_table", "regexp_matches",
    "string_to_table", "json_table", "jsontable", "exploding_generate_series", "explode", "posexplode",
    "explode_outer", "posexplode_outer",
))

_COMMON = """
abs acos asin atan atan2 avg ceil ceiling char_length character_length coalesce concat cos cot count cume_dist
degrees dense_rank exp first_value floor greatest lag last_value lead least length ln log log10 log2 lower ltrim
max min mod nth_value ntile nullif percent_rank pi power pow radians rank replace round row_number rtrim sign sin
sqrt substr substring sum tan trim upper cast case if ifnull iif nvl position reverse left right lpad rpad repeat
instr octet_length bit_length ascii chr char hex unhex sha1 sha2 md5 to_base64 from_base64 current_date
current_time current_timestamp now date time extract date_trunc stddev stddev_pop stddev_samp variance var_pop
var_samp every bool_and bool_or string_agg group_concat array_agg json_agg jsonb_agg json_object_agg
jsonb_object_agg total corr covar_pop covar_samp regr_slope regr_intercept regr_count regr_r2 regr_avgx
regr_avgy regr_sxx regr_syy regr_sxy percentile_cont percentile_disc mode median bit_and bit_or bit_xor
""".split()

# Built-in functions per dialect that are read-only and touch no table, file or session state. sqlglot's typed
# expressions count as built-in besides these; any other function is user-defined and needs allowed_functions.
BUILTINS: dict[str, frozenset[str]] = {
    "postgres": frozenset(_COMMON + """
    btrim initcap split_part strpos translate to_char to_date to_number to_timestamp format quote_ident
    quote_literal quote_nullable regexp_replace regexp_match regexp_like regexp_count regexp_instr regexp_substr
    starts_with concat_ws overlay encode decode convert_from convert_to age clock_timestamp statement_timestamp
    transaction_timestamp timeofday localtime localtimestamp date_part date_bin make_date make_time
    make_timestamp make_timestamptz make_interval justify_days justify_hours justify_interval isfinite
    to_json to_jsonb row_to_json array_to_json json_build_object jsonb_build_object json_build_array
    jsonb_build_array json_object jsonb_object json_extract_path jsonb_extract_path json_extract_path_text
    jsonb_extract_path_text json_array_length jsonb_array_length json_typeof jsonb_typeof jsonb_set jsonb_insert
    jsonb_pretty jsonb_strip_nulls json_strip_nulls jsonb_path_query jsonb_path_exists jsonb_path_match
    jsonb_path_query_array jsonb_path_query_first json_object_keys jsonb_object_keys array_length array_lower
    array_upper array_dims array_ndims array_append array_prepend array_cat array_remove array_replace
    array_position array_positions array_to_string string_to_array cardinality trim_array array_fill
    num_nonnulls num_nulls width_bucket trunc cbrt div gcd lcm factorial scale min_scale trim_scale random
    setseed gen_random_uuid uuid_generate_v4 md5 sha224 sha256 sha384 sha512 crc32 to_hex bit_count
    get_bit set_bit get_byte set_byte length lower_inc upper_inc isempty lower_inf upper_inf range_merge
    xmlelement xmlforest xmlconcat xmlagg xmlparse xmlserialize xmlroot xpath xpath_exists xmlexists
    unistr normalize ascii chr pg_typeof format_type current_user session_user current_role user
    current_database current_schema current_catalog version inet_client_addr host masklen network broadcast
    netmask family abbrev text timezone to_tsvector to_tsquery plainto_tsquery phraseto_tsquery
    websearch_to_tsquery ts_rank ts_rank_cd ts_headline setweight strip numnode querytree tsvector_to_array
    array_to_tsvector current_setting bool boolean int int2 int4 int8 float4 float8 numeric
    """.split()),
    # row: ROW(1, 2) and VALUES ROW(...) are the grammar's row constructor (an unquoted row(x) never calls a
    # stored function); a stored function named `row` is in the connection's Catalog.shadowed like any other.
    # values, value: a row of a VALUES list (`IN (VALUES (1), (2))`, `WITH x AS (VALUES (1))`), which sqlglot reads
    # as a call, and an upsert's `ON DUPLICATE KEY UPDATE n = VALUES(n)` / MariaDB's VALUE(n): unquoted, the
    # grammar's own; quoted (`values`(n)) a stored function's call, refused through the connection's
    # Catalog.shadowed like any other name a stored function takes.
    "mysql": frozenset(_COMMON + """
    row values value concat_ws field find_in_set format insert locate lcase ucase mid space strcmp substring_index
    soundex
    elt export_set make_set quote weight_string char_length oct bin conv crc32 rand truncate
    curdate curtime sysdate utc_date utc_time utc_timestamp date_add date_sub adddate subdate addtime subtime
    datediff timediff timestampadd timestampdiff date_format time_format str_to_date from_unixtime
    unix_timestamp dayname dayofmonth dayofweek dayofyear day month monthname year yearweek week weekday
    weekofyear quarter hour minute second microsecond last_day makedate maketime period_add period_diff
    sec_to_time time_to_sec to_days from_days to_seconds convert_tz get_format localtime localtimestamp
    json_extract json_unquote json_object json_array json_contains json_contains_path json_keys json_length
    json_type json_valid json_quote json_search json_set json_insert json_replace json_remove json_merge
    json_merge_patch json_merge_preserve json_depth json_pretty json_arrayagg json_objectagg json_value
    json_overlaps json_array_append json_array_insert regexp_replace regexp_substr regexp_instr regexp_like
    uuid inet_aton inet_ntoa inet6_aton inet6_ntoa is_ipv4 is_ipv6 database schema user current_user
    session_user system_user version connection_id charset collation coercibility found_rows row_count
    last_insert_id convert std bit_count compress uncompress uncompressed_length aes_encrypt aes_decrypt sha random_bytes
    interval isnull least greatest natural_sort_key sformat
    """.split()),
    "sqlite": frozenset(_COMMON + """
    printf format glob like likelihood likely unlikely typeof quote randomblob random zeroblob unicode
    soundex sqlite_version changes total_changes last_insert_rowid julianday strftime datetime unixepoch
    timediff json json_array json_array_length json_extract json_insert json_object json_patch json_remove
    json_replace json_set json_type json_valid json_quote json_group_array json_group_object jsonb
    jsonb_array jsonb_extract jsonb_insert jsonb_object jsonb_patch jsonb_remove jsonb_replace jsonb_set
    json_error_position json_pretty trunc octet_length unhex concat_ws string_agg acosh asinh atanh cosh sinh
    tanh subtype sqlite_source_id sqlite_compileoption_get sqlite_compileoption_used
    """.split()),
}


# Functions that change state outside the statement's result (named locks, MariaDB sequences, shell UDFs): a call
# is a write operation for every caller (contract 4.3's read_only, reported under the function's name), because a
# read-only transaction does not stop GET_LOCK, and a read-only key must not take a lock another caller waits on.
# MariaDB's NEXT VALUE FOR / PREVIOUS VALUE FOR are the same as nextval() / lastval().
WRITING: dict[str, frozenset[str]] = {
    "mysql": frozenset((
        "get_lock", "release_lock", "release_all_locks", "nextval", "setval", "lastval", "sys_exec", "sys_eval",
        "sys_set",
    )),
}


def writing_calls(text: str, sig: list, dialect: str) -> set[str]:
    """The state-changing functions (WRITING) a statement calls, from its significant tokens: a name (bare,
    `quoted` or, under ANSI_QUOTES, "quoted") followed by '(' - MySQL/MariaDB call a built-in whatever the
    whitespace or comments between - and MariaDB's NEXT VALUE FOR / PREVIOUS VALUE FOR."""
    names = WRITING.get(dialect)
    if not names:
        return set()
    found: set[str] = set()
    n = len(sig)
    for j, t in enumerate(sig):
        kind = t.kind
        if kind == "word":
            name = t.value
            if name in ("next", "previous") and j + 2 < n and sig[j + 1].kind == "word" and \
                    sig[j + 1].value == "value" and sig[j + 2].kind == "word" and sig[j + 2].value == "for":
                found.add("nextval" if name == "next" else "lastval")
                continue
        elif kind == "qident" or (kind == "string" and t.value == '"'):
            name = text[t.start + 1:t.end - 1].lower()
        else:
            continue
        if name in names and j + 1 < n and sig[j + 1].kind == "punct" and sig[j + 1].value == "(":
            found.add(name)
    return found


def denied(name: str, dialect: str) -> bool:
    """Whether a table-restricted key may never call the function `name` (lower-case, unqualified)."""
    return name in _DENIED.get(dialect, ()) or name.startswith(_DENIED_PREFIXES.get(dialect, ()))


def side_channel(name: str, dialect: str) -> bool:
    """Whether `name` (lower-case, unqualified) shows the server's settings, statistics, catalogs or activity:
    refused for table-restricted and masked keys unless allowed_functions names it."""
    return (name in _SIDE.get(dialect, ()) or name.startswith(_SIDE_PREFIXES.get(dialect, ()))
            or name.endswith(_SIDE_SUFFIXES.get(dialect, ())))


def resolving_type(name: str) -> str | None:
    """The name-resolving PostgreSQL type (RESOLVING_TYPES) a type name (its last part, as folded) is, or an array
    of (`_regclass`); None for any other. Compared lower-cased: a quoted "RegClass" is refused with them."""
    name = name.lower()
    if name.startswith("_"):
        name = name[1:]
    return name if name in RESOLVING_TYPES else None


def pg_builtin_type(parts: tuple[str, ...]) -> bool:
    """Whether a type name as the parser folds it (its parts) is one of PostgreSQL's own: qualified pg_catalog, or
    unqualified and in PG_TYPES (`_int4` for int4's array too)."""
    if len(parts) >= 2:
        return parts[-2] == "pg_catalog"
    name = parts[-1] if parts else ""
    return name in PG_TYPES or (name.startswith("_") and name[1:] in PG_TYPES)


def builtin(name: str, dialect: str) -> bool:
    """Whether `name` (lower-case, unqualified) is a known read-only built-in of the dialect, by the hand-written
    list (BUILTINS). The fallback where the engine's own catalog is not at hand: with a connection, PostgreSQL's
    built-ins come from pg_proc and SQLite's from `pragma function_list` (see Catalog); MySQL/MariaDB have no
    catalog of native functions, so the list stays, checked against the stored functions that could answer a
    call of the same name."""
    if dialect == "sqlite":
        names = _sqlite_builtins()
        if names is not None:
            return name in names
    return name in BUILTINS.get(dialect, ())


# SQLite functions that change something (load native code, write the error log, register a tokenizer pointer,
# write files in the CLI's extensions): never run, for any caller (the SQLite backend's authorizer refuses them).
SQLITE_CHANGING = frozenset({"load_extension", "sqlite_log", "readfile", "writefile", "edit", "fts3_tokenizer"})
_SQLITE_LIBRARY: frozenset | None = None


def sqlite_library_builtins() -> frozenset:
    """The running sqlite3 library's built-in functions (`pragma function_list`, builtin=1), lower-case, minus
    those that change something (SQLITE_CHANGING); read once per process. SQLite runs in this process, so the
    library itself is the engine's catalog."""
    global _SQLITE_LIBRARY
    if _SQLITE_LIBRARY is None:
        conn = sqlite3.connect(":memory:")
        try:
            names = {row[0].lower() for row in conn.execute("SELECT name FROM pragma_function_list WHERE builtin")}
        finally:
            conn.close()
        _SQLITE_LIBRARY = frozenset(names - SQLITE_CHANGING)
    return _SQLITE_LIBRARY


_SQLITE_BUILTINS: list = []


def _sqlite_builtins() -> frozenset | None:
    """sqlite_library_builtins(), or None if the library can't list them (then BUILTINS)."""
    if not _SQLITE_BUILTINS:
        try:
            names = sqlite_library_builtins()
        except Exception:  # an SQLite library without pragma_function_list (before 3.30)
            names = None
        _SQLITE_BUILTINS.append(names)
    return _SQLITE_BUILTINS[0]


@dataclass(frozen=True, slots=True)
class Catalog:
    """What the engine itself says about function names, for one connection (issue 18: functions allowed by
    what a call resolves to, not by its name). Read once per connection and kept with the backend's schema
    cache (qag/backends/_postgres_schema.read_functions, qag/backends/_mysql_schema.read_functions).

    builtins: the engine's own functions, when it lists them (PostgreSQL: every name in pg_catalog from initdb,
              oid < 16384, so no function a user put into pg_catalog later); None: the hand-written BUILTINS.
    shadowed: names of functions an unqualified call could resolve to outside the engine's own (PostgreSQL: in
              the schemas of the call's pinned search_path other than pg_catalog; MySQL/MariaDB: stored functions
              of the connection's database and loadable functions). An unqualified call of such a name is
              refused unless allowed_functions names it, whatever the engine's overload resolution would pick.
    projections: names of functions a field of a row can call (PostgreSQL: any of the call's search_path that
              takes one argument; `x.f` is f(x) when x has no column f); empty where the engine has no such call.
    types:    PostgreSQL: (schema, name) of the database's own types that show no relation's columns (enums,
              domains, extensions' base types, ranges, free-standing composite types, their arrays; not a table's,
              view's, sequence's or foreign table's row type, nor one built on such a row type or on a domain
              whose CHECK calls a function or operator not from initdb), outside pg_catalog and
              information_schema (qag/backends/_postgres_schema.read_functions); None: not read, so every type
              that isn't the engine's own is judged as a table.
    bare_types: of those, the names an unqualified type name resolves to along the call's pinned search_path
              (pg_catalog, "<schema>", pg_temp): in "<schema>" and not in pg_catalog, whose types come first.
    operators: PostgreSQL: names of the operators in "<schema>" (and any added to pg_catalog after initdb) whose
              function is the database's own code (SQL or a procedural language, which may read any table or
              write; an extension's C operators are the engine's): an unqualified operator of such a name may be
              answered by it, whatever the arguments' types, so it is refused unless allowed_functions names it.
    server_major: PostgreSQL: the server's major version, which decides the SQL/JSON constructs it reads as calls
              (grammar_calls); None: not read.
    """

    builtins: frozenset | None
    shadowed: frozenset
    projections: frozenset = frozenset()
    types: frozenset | None = None
    bare_types: frozenset = frozenset()
    operators: frozenset = frozenset()
    server_major: int | None = None

    def plain_type(self, schema: str | None, name: str) -> bool:
        """Whether a type name as written (schema '' when unqualified, None with a database part) is one of the
        database's own types that no relation's row type is (so naming it tells nothing of a table)."""
        if self.types is None or schema is None:
            return False
        if schema == "":
            return name in self.bare_types
        return (schema, name) in self.types


def allowed_builtin(schema: str, name: str, dialect: str, catalog: Catalog | None) -> bool:
    """Whether a call of `name` (unqualified when schema is '', or qualified with the engine's own schema) is
    one of the engine's own built-ins that no other function can answer."""
    if catalog is None:
        return builtin(name, dialect) or name in GENERATORS
    if schema == "" and name in catalog.shadowed:
        return False
    if catalog.builtins is None:
        return builtin(name, dialect) or name in GENERATORS
    return name in catalog.builtins


def grammar_calls(constructs, catalog: Catalog | None) -> tuple[tuple[str, str], ...]:
    """The unqualified calls a PostgreSQL server makes of a statement's SQL/JSON constructs (Access.grammar_calls):
    those newer than the server's grammar, which it reads as calls of functions of their names; every one when
    the server's version is unknown."""
    major = catalog.server_major if catalog is not None else None
    return tuple(sorted({("", name) for name, since in constructs if major is None or major < since}))


def denied_names(dialect: str) -> list[str]:
    """Every denied name and prefix (prefixes end in '*'), sorted, for docs and tests."""
    return sorted(set(_DENIED.get(dialect, ())) | {p + "*" for p in _DENIED_PREFIXES.get(dialect, ())})
