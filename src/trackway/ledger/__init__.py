"""The ledger: SQL tables holding every run, attempt, metric, checkpoint and evaluation.

`Ledger` and `open_ledger` (SQLAlchemy) are imported on first use: `trackway.ledger.reader` reads a
SQLite ledger without them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["Ledger", "open_ledger"]

if TYPE_CHECKING:
    from trackway.ledger.store import Ledger, open_ledger


def __getattr__(name: str):
    if name in __all__:
        from trackway.ledger import store

        return getattr(store, name)
    raise AttributeError(f"module 'trackway.ledger' has no attribute {name!r}")
