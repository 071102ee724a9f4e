"""What every command shares: the resolved settings, a lazily opened, migrated ledger (or a plain reader of it),
the rule for when a command records the ends nobody followed, and the global options to repeat in the commands
it suggests."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import typer

from trackway.errors import TrackwayError
from trackway.settings import Settings, load_settings

if TYPE_CHECKING:
    from trackway.ledger import Ledger
    from trackway.ledger.reader import Reader
    from trackway.supervisor.loop import Supervisor

_SUGGESTED = re.compile(r"`trackway(?= |`)")


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
            from trackway.ledger import open_ledger

            self._ledger = open_ledger(self.settings.db_url)
        return self._ledger

    @contextmanager
    def reader(self) -> Iterator[Reader]:
        """One read transaction over plain DB-API (a SQLite ledger is read without importing SQLAlchemy)."""
        from trackway.ledger.reader import Reader, open_reader

        if self._ledger is not None:  # already open: one connection, not two
            with self._ledger.read() as conn:
                yield Reader.over(conn)
            return
        with open_reader(self.settings.db_url) as reader:
            yield reader

    def reconcile(self) -> None:
        """Record the ends of attempts that finished while nobody was following them, when someone must.

        A background supervisor holding this ledger does it every second; with none, a tick runs
        here, but only when something is in flight (an unfinished attempt, a queued run, an
        evaluation): a finished history needs no supervisor, and importing one costs more than
        the listing.
        """
        from trackway.supervisor.lock_file import held

        try:
            if held(self.settings):
                return
        except TrackwayError:  # an in-memory ledger has no background supervisor: tick here
            pass
        with self.reader() as reader:
            busy = reader.in_flight()
        if busy:
            from trackway.supervision import supervisor_for, undelivered

            # A read-only command never claims a message to send (it would exit before sending);
            # what its tick recorded goes to the background supervisor, started for it.
            supervisor = supervisor_for(self.ledger, self.settings, deliver=False)
            supervisor.tick()
            if undelivered(supervisor):
                self._hand_over_messages()

    def _hand_over_messages(self) -> None:
        """Start the background supervisor to send what this command recorded; with autostart off the next
        deliverer (a foreground command, `trackway serve`, a background supervisor) sends it."""
        from trackway.supervisor.background import autostart_enabled, ensure_running

        if not autostart_enabled():
            return
        try:
            ensure_running(self.settings)
        except TrackwayError:  # an in-memory ledger, a home that cannot be written: the next deliverer sends it
            pass

    def supervisor(self) -> Supervisor:
        from trackway.supervision import supervisor_for

        return supervisor_for(self.ledger, self.settings)

    def command(self, *words: str) -> str:
        """`trackway WORDS...` as a person can paste it: with the --db/--home this command was given."""
        return " ".join(["trackway", *global_options(self.home, self.db), *words])

    def hint(self, text: str) -> str:
        """`text` with every `` `trackway ...` `` it suggests given this command's --db/--home."""
        return repeat_global_options(text, self.home, self.db)


def global_options(home: str | None, db: str | None) -> list[str]:
    """The --db/--home words to repeat, shell-quoted; a password in the URL is masked (it is a secret on screen)."""
    words: list[str] = []
    if db:
        words += ["--db", shlex.quote(_without_password(db))]
    if home:
        words += ["--home", shlex.quote(home)]
    return words


def repeat_global_options(text: str, home: str | None, db: str | None) -> str:
    """`text` with `--db/--home` inserted after each `` `trackway `` it quotes (a hint that works when pasted)."""
    words = global_options(home, db)
    if not words:
        return text
    return _SUGGESTED.sub("`" + " ".join(["trackway", *words]), text)


def given_global_options(argv: Sequence[str]) -> tuple[str | None, str | None]:
    """(home, db) as given before the command word in `argv` (for messages printed outside a command)."""
    home = db = None
    words = list(argv)
    while words and words[0].startswith("--"):
        word = words.pop(0)
        name, eq, value = word.partition("=")
        if name in ("--db", "--home"):
            if not eq:
                if not words:
                    break
                value = words.pop(0)
            home, db = (value, db) if name == "--home" else (home, value)
        elif name != "--debug":
            break
    return home, db


def _without_password(url: str) -> str:
    """`url` with its password shown as *** (what `trackway` prints must not publish a secret)."""
    try:
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
    except Exception:  # noqa: BLE001 - not a URL sqlalchemy reads: repeated as given
        return url
    return parsed.render_as_string(hide_password=True) if parsed.password else url


def app_context(ctx: typer.Context) -> AppContext:
    root = ctx.find_root()
    if not isinstance(root.obj, AppContext):
        root.obj = AppContext()
    return root.obj
