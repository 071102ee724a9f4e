"""`trackway sql`: one read-only query over the ledger, in PostgreSQL's dialect on every backend.

Each module has one job, and each imports only the ones above it in this list:

- `rules`: what may run and what is refused (unsafe functions, pragmas, the server's secrets,
  the API tokens table), and the messages that say so.
- `functions`: PostgreSQL's date_trunc, date_part and `~`, as Python functions for a SQLite ledger.
- `dialect`: parse and classify one query with sqlglot, and transpile it for SQLite. The only
  module that imports sqlglot, which is slow to import.
- `remembered`: queries already checked, kept on disk so that one run again skips `dialect`
  (imported lazily, only for a query not yet checked).
- `readonly`: `run_readonly_query`, the read-only execution on SQLite and PostgreSQL, the reader role.
- `worker`: `POST /api/sql` on SQLite, in child processes killed at their deadline.

This package imports nothing itself: importing one module never imports sqlglot.
"""
