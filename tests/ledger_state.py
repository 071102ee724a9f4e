"""What a refused query must leave as it was, read in one go: the schema, every table's rows counted, run states."""

from __future__ import annotations

from sqlalchemy import inspect, text

from trackway.ledger import Ledger


def ledger_state(ledger: Ledger) -> tuple:
    """Tables, views and their columns, row counts, each run's state and SQLite's journal mode: equal before and after."""
    with ledger.read() as conn:
        inspector = inspect(conn)
        tables, views = sorted(inspector.get_table_names()), sorted(inspector.get_view_names())
        columns = {name: [c["name"] for c in inspector.get_columns(name)] for name in tables + views}
        counts = {name: conn.execute(text(f"select count(*) from {name}")).scalar_one() for name in tables}
        states = conn.execute(text("select run_id, state from runs order by run_id")).all()
        journal = conn.exec_driver_sql("pragma journal_mode").scalar() if ledger.dialect == "sqlite" else None
    return tables, views, columns, counts, states, journal
