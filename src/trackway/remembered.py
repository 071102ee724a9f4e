"""Results of a costly check remembered on disk, so that a command run again starts without the library that checks.

An entry's name is a hash of what was checked and of the files whose change could change the
result (`stamps`: path, mtime and size of each), so a change to any of them checks afresh. An
entry is used only from a directory of this user's that no one else can write, and only if this
user owns it and no one else can write it; anything else is checked again. Writes are atomic (a
reader never sees half an entry), 0600 in a 0700 directory; a full, read-only or shared disk
only costs the speed-up. Standard library only: it is read before anything else is imported.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path

MAX_ENTRIES = 500
MAX_ENTRY_BYTES = 1 << 20


def entry_path(directory: Path, parts: Iterable[str], rule_files: Iterable[Path], suffix: str) -> Path | None:
    """Where the entry for `parts` checked by `rule_files` is (or would be) kept; None when a rule file is unreadable."""
    try:
        stamps = [f"{path}:{path.stat().st_mtime_ns}:{path.stat().st_size}" for path in rule_files]
    except OSError:
        return None
    key = hashlib.sha256("\0".join([*parts, *stamps]).encode()).hexdigest()
    return directory / f"{key}{suffix}"


def read_entry(entry: Path) -> bytes | None:
    """The entry's bytes if this user wrote it where only this user can write; None (check again) otherwise."""
    from trackway.private_dir import check_private

    try:
        check_private(entry.parent)
        fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())  # of what was opened, not of whatever the name points at by now
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
            return None
        data = file.read(MAX_ENTRY_BYTES + 1)
    return data if len(data) <= MAX_ENTRY_BYTES else None


def write_entry(entry: Path, data: bytes) -> None:
    """Keep `data` as the entry (the oldest entries beyond MAX_ENTRIES of its directory go)."""
    from trackway.private_dir import make_private_dir

    try:
        entry.parent.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        make_private_dir(entry.parent)
        temporary = entry.with_name(f"{entry.name}.{os.getpid()}.tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.replace(temporary, entry)
        kept = sorted(entry.parent.glob(f"*{entry.suffix}"), key=lambda path: path.stat().st_mtime)
        for stale in kept[: max(0, len(kept) - MAX_ENTRIES)]:
            stale.unlink(missing_ok=True)
    except OSError:
        pass
