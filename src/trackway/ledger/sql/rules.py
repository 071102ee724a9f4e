"""What `trackway sql` may run and what it refuses, by name; the dialect's check and the databases' guards share these.

Only reads run: exactly one SELECT / WITH … SELECT / VALUES / EXPLAIN of one of those, or a
read-only PRAGMA on SQLite. PostgreSQL functions with side effects, the server's configuration
and credential catalogs and the server's API tokens are refused by name, with a message that
says why. These rules are layer 1 (see `readonly`); the database's own guard holds whatever a
query's text hides.
"""

from __future__ import annotations

import re

from trackway.errors import ReadOnlyViolation

ALLOWED = "only SELECT, WITH … SELECT, VALUES, EXPLAIN and read-only PRAGMA"

# PostgreSQL functions that write, signal other sessions, touch server files or large objects, or run
# SQL or read tables named in text (which would escape this check). The reader role stops the ones
# that reach what is not the ledger's; these names give a clearer message first.
_UNSAFE_FUNCTIONS = frozenset(
    """nextval setval set_config pg_terminate_backend pg_cancel_backend pg_reload_conf
    pg_rotate_logfile pg_promote pg_switch_wal pg_backup_start pg_backup_stop pg_start_backup
    pg_stop_backup pg_wal_replay_pause pg_wal_replay_resume pg_log_backend_memory_contexts
    pg_notify pg_import_system_collations pg_read_file pg_read_binary_file pg_stat_file lo_import
    lo_export lo_create lo_creat lo_unlink lo_open lo_write lowrite lo_put lo_truncate
    lo_truncate64 lo_from_bytea loread query_to_xml query_to_xmlschema query_to_xml_and_xmlschema
    cursor_to_xml cursor_to_xmlschema ts_stat load_extension""".split()
)
_UNSAFE_FUNCTION_PREFIXES = (
    "pg_advisory", "pg_try_advisory", "dblink", "pg_stat_reset", "pg_file_", "pg_ls_", "pg_create_",
    "pg_drop_replication", "pg_copy_", "pg_logical_", "pg_replication_origin", "lo_", "table_to_xml",
    "schema_to_xml", "database_to_xml", "query_to_xml", "cursor_to_xml",
)  # fmt: skip

_PRAGMAS_WITH_ARGUMENT = frozenset(
    """table_info table_xinfo table_list index_info index_xinfo index_list foreign_key_list
    foreign_key_check integrity_check quick_check""".split()
)
_READ_ONLY_PRAGMAS = _PRAGMAS_WITH_ARGUMENT | frozenset(
    """application_id auto_vacuum busy_timeout cache_size collation_list compile_options
    data_version database_list encoding foreign_keys freelist_count function_list journal_mode
    module_list page_count page_size pragma_list query_only schema_version synchronous temp_store
    user_version""".split()
)

# What the server knows about itself and its users: configuration (which holds connection strings
# with passwords, e.g. primary_conninfo, and the paths of the password files), authentication
# rules, password hashes, foreign-server credentials, and the files on the server's disk. None of
# it is part of the ledger, and a read-only transaction does not stop reading it.
_SERVER_SECRET_RELATIONS = frozenset(
    """pg_file_settings pg_hba_file_rules pg_ident_file_mappings pg_settings pg_config pg_authid
    pg_shadow pg_user_mappings pg_user_mapping user_mapping_options pg_subscription
    pg_db_role_setting pg_largeobject pg_largeobject_metadata""".split()
)
_SERVER_SECRET_FUNCTIONS = frozenset(
    """current_setting pg_show_all_settings pg_show_all_file_settings pg_config pg_hba_file_rules
    pg_ident_file_mappings pg_read_file pg_read_binary_file pg_stat_file pg_ls_dir
    pg_current_logfile pg_options_to_table""".split()
)
_SERVER_SECRET_FUNCTION_PREFIXES = ("pg_read_", "pg_ls_", "pg_file_")
# Settings that `current_setting('…')` may read: what a query needs to make sense of its results
# (time zone, formats, the transaction it runs in). None of these can hold a credential.
_READABLE_SETTINGS = frozenset(
    """transaction_read_only transaction_isolation default_transaction_read_only statement_timeout
    server_version server_version_num timezone datestyle intervalstyle search_path client_encoding
    server_encoding application_name""".split()
)

# The server's API tokens (names, roles, digests): not for every `read` token to see through /api/sql.
TOKENS_TABLE = "api_tokens"


def is_unsafe_function(name: str) -> bool:
    """Whether the (lower-case) function `name` writes, signals, or reaches past the ledger."""
    return name in _UNSAFE_FUNCTIONS or name.startswith(_UNSAFE_FUNCTION_PREFIXES)


def pragma_is_read_only(name: str, has_argument: bool) -> bool:
    """Whether SQLite's `PRAGMA name` (or `PRAGMA name(…)`) only reads."""
    name = name.lower()
    return name in (_PRAGMAS_WITH_ARGUMENT if has_argument else _READ_ONLY_PRAGMAS)


def is_server_secret_relation(name: str) -> bool:
    """Whether the (lower-case) table or view `name` shows the server's configuration, files or credentials."""
    return name in _SERVER_SECRET_RELATIONS


def reads_server_secrets(name: str, setting: str | None = None) -> bool:
    """Whether calling the (lower-case) function `name` reads the server's configuration, files or credentials.

    `setting` is current_setting's first argument when it is a string literal, else None (refused).
    """
    if name == "current_setting":
        return setting is None or setting.lower() not in _READABLE_SETTINGS
    return name in _SERVER_SECRET_FUNCTIONS or name.startswith(_SERVER_SECRET_FUNCTION_PREFIXES)


def not_allowed(what: str) -> ReadOnlyViolation:
    return ReadOnlyViolation(f"trackway sql is read-only: {what} is not allowed ({ALLOWED})")


def server_secret(what: str) -> ReadOnlyViolation:
    return ReadOnlyViolation(
        f"trackway sql: {what} is not allowed: it shows the database server's configuration, files or "
        "credentials, which are not part of the ledger (query the ledger's tables and views)"
    )


def tokens_not_readable() -> ReadOnlyViolation:
    return ReadOnlyViolation(
        f"trackway sql: {TOKENS_TABLE} is not readable through trackway sql: use `trackway token list`"
    )


def as_given(query: str) -> str:
    """What runs on PostgreSQL for a query that passed the check: its own text, less trailing semicolons."""
    return re.sub(r"[\s;]+$", "", query)


def first_line(exc: BaseException) -> str:
    """The first line of an error's message, for a one-line refusal."""
    message = str(exc).strip()
    return message.splitlines()[0] if message else type(exc).__name__
