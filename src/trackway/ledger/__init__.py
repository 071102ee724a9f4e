"""The ledger: SQL tables holding every run, attempt, metric, checkpoint and evaluation.

`Ledger` and `open_ledger` (SQLAlchemy) are imported on first use: `trackway.ledger.reader` reads a
SQLite ledger without them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["Ledger", "open_ledger"]

if TYPE_CHECKING:
    from trackway.ledger.open import open_ledger
    from trackway.ledger.store import Ledger


def __getattr__(name: str):
    if name == "Ledger":
        from trackway.ledger.store import Ledger

        return Ledger
    if name == "open_ledger":
        from trackway.ledger.open import open_ledger

        return open_ledger
    raise AttributeError(f"module 'trackway.ledger' has no attribute {name!r}")
