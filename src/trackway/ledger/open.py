"""Opening a ledger: the engine (ledger/store.py), then the schema brought to the newest migration (ledger/migrate.py)."""

from __future__ import annotations

from trackway.ledger.migrate import upgrade_to_head
from trackway.ledger.store import Ledger, create_ledger_engine


def open_ledger(url: str, migrate: bool = True) -> Ledger:
    """Open (and, on first use, migrate) the ledger at `url`."""
    ledger = Ledger(create_ledger_engine(url))
    if migrate:
        upgrade_to_head(ledger)
    return ledger
