"""What every command shares: the resolved settings and a lazily opened, migrated ledger."""

from __future__ import annotations

from dataclasses import dataclass, field

import typer

from trackway.ledger import Ledger, open_ledger
from trackway.settings import Settings, load_settings


@dataclass
class AppContext:
    home: str | None = None
    db: str | None = None
    debug: bool = False
    _settings: Settings | None = field(default=None, repr=False)
    _ledger: Ledger | None = field(default=None, repr=False)

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = load_settings(home=self.home, db=self.db)
        return self._settings

    @property
    def ledger(self) -> Ledger:
        if self._ledger is None:
            self._ledger = open_ledger(self.settings.db_url)
        return self._ledger


def app_context(ctx: typer.Context) -> AppContext:
    root = ctx.find_root()
    if not isinstance(root.obj, AppContext):
        root.obj = AppContext()
    return root.obj
