"""The ledger: the SQL index and memory of every run, attempt and blob (SQLite or PostgreSQL)."""

from trackway.ledger.store import Ledger, open_ledger

__all__ = ["Ledger", "open_ledger"]
