"""Settings that follow trackway.toml: a long-lived process notices the file changed, reads it again, says what changed.

The background supervisor lives for as long as work is in flight, often for days; a person who
edits `[supervisor] stop_on` or a watcher's window expects the next tick to act on it, not the
next supervisor. `SettingsFollower.check()` looks at the file's identity (a `stat`, cheap enough
for every tick) and, when it changed, loads the settings as a command would and returns them with
one line per changed setting. A file that no longer reads (bad TOML, a refused value) keeps the
running settings and says why, once per edit. The ledger and the home are what the process is
bound to: a change of either is refused until the supervisor is restarted.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trackway.errors import TrackwayError
from trackway.settings import CONFIG_FILE_NAME, Settings

BOUND = ("home", "db_url")  # fixed for the life of the process
# Values that may hold secrets (apprise URLs carry tokens): a change is counted, never shown.
NOT_SHOWN = ("notify_urls",)


class SettingsFollower:
    """Watches one trackway.toml for a process that holds `current`, loaded by `load`."""

    def __init__(self, current: Settings, load: Callable[[], Settings], path: Path | None = None) -> None:
        self.current = current
        self.load = load
        self.path = path or Path.cwd() / CONFIG_FILE_NAME
        # Not the file's identity now: `current` may have been read before an edit that came since.
        self._seen: object = None

    def check(self) -> tuple[Settings | None, list[str]]:
        """New settings when the file changed and reads well (None otherwise), and what to log about it."""
        identity = _identity(self.path)
        if self._seen is not None and identity == self._seen:
            return None, []
        self._seen = identity or "absent"
        where = f"{self.path}" if identity is not None else f"{self.path} (removed: the defaults apply)"
        try:
            loaded = self.load()
        except TrackwayError as exc:
            return None, [f"{where} changed but was not applied; the running settings stay: {exc}"]
        bound = [name for name in BOUND if getattr(loaded, name) != getattr(self.current, name)]
        if bound:
            return None, [f"{where} changed {', '.join(bound)}, which this supervisor is bound to; the running "
                          "settings stay (`trackway supervise --stop`, then any command starts one on the new ledger)"]
        changes = describe_changes(self.current, loaded)
        if not changes:
            return None, []
        self.current = loaded
        return loaded, [f"{where} changed; now in effect: {'; '.join(changes)}"]


def describe_changes(before: Settings, after: Settings) -> list[str]:
    """One phrase per setting that differs: `stop_on: [] → ['loss_rising']`; resources by name, secrets by count."""
    said = []
    for field in dataclasses.fields(Settings):
        name = field.name
        old, new = getattr(before, name), getattr(after, name)
        if name in BOUND or old == new:
            continue
        if name in NOT_SHOWN:
            said.append(f"{name}: {len(old)} → {len(new)} (not shown: may hold secrets)")
        elif name == "resources":
            said.append(_resources(old, new))
        else:
            said.append(f"{name}: {_shown(old)} → {_shown(new)}")
    return said


def _resources(old: dict[str, Any], new: dict[str, Any]) -> str:
    parts = []
    if added := sorted(set(new) - set(old)):
        parts.append(f"added {', '.join(added)}")
    if removed := sorted(set(old) - set(new)):
        parts.append(f"removed {', '.join(removed)}")
    if changed := sorted(name for name in set(old) & set(new) if old[name] != new[name]):
        parts.append(f"changed {', '.join(changed)}")
    return f"resources: {'; '.join(parts)}"


def _shown(value: Any) -> str:
    if isinstance(value, tuple):
        value = list(value)
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_ino, stat.st_size, stat.st_mtime_ns
