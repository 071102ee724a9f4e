"""Every ledger failure is exit 3 and one line: which ledger, what happened, and that training goes on.

Regression for issue 9.9: a SQLite lock held past the busy timeout, or a full SQLite disk, was
`internal error: OperationalError`, exit 1, where PostgreSQL gave a clean exit 3. Real
processes throughout: a real lock holder, a real full tmpfs, a real closed port.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

PY = sys.executable
HOLD_LOCK = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.readline()  # hold the lock until the test says so
conn.execute("ROLLBACK")
"""


def _one_line(result, *fragments: str) -> str:
    assert result.code == 3, (result.code, result.err)
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert len(lines) == 1, result.err
    assert "Traceback" not in result.err and "internal error" not in result.err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@pytest.fixture
def sqlite_ledger(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli_process) -> Path:
    """A migrated SQLite ledger that the CLI processes of the test use."""
    path = tmp_path / "ledger.db"
    monkeypatch.setenv("TRACKWAY_DB", f"sqlite:///{path}")
    assert cli_process("runs").code == 0
    return path


def test_a_lock_held_past_the_busy_timeout_is_exit_3_locked(sqlite_ledger, cli_process, monkeypatch):
    monkeypatch.setenv("TRACKWAY_SQLITE_BUSY_TIMEOUT", "0.2")
    holder = subprocess.Popen(
        [PY, "-c", HOLD_LOCK, str(sqlite_ledger)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        # Readers are not blocked by a writer (WAL): listing still answers.
        assert cli_process("runs").code == 0
        result = cli_process("submit", "--detach", "--name", "blocked", "--", PY, "-c", "pass")
        _one_line(result, f"ledger sqlite:///{sqlite_ledger}", "locked", "0.2 s", "training is not affected")
    finally:
        holder.stdin.write("\n")
        holder.stdin.close()
        holder.wait(timeout=10)
    listed = cli_process("runs", "--json")
    assert listed.code == 0 and "blocked" not in listed.out  # nothing was recorded half-way


@pytest.fixture
def tiny_disk(tmp_path: Path):
    """A 2 MiB tmpfs to hold the ledger and then fill up."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"a real full disk needs a tmpfs mount, and it failed: {done.stderr.strip() or done.returncode}")
    yield mount
    if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _fill(disk: Path, leave: int) -> Path:
    """Fill the file system until `leave` bytes are free (rounded to its 4 KiB pages)."""
    filler = disk / "filler"
    room = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize - leave
    with filler.open("wb") as f:
        f.write(b"\0" * max(0, room))
    return filler


# 0 bytes free: SQLite cannot even create its shared-memory file ("disk I/O error"); 40 KiB: it
# opens, and the submit's writes meet SQLITE_FULL ("database or disk is full").
@pytest.mark.parametrize("leave", [0, 40 * 1024])
def test_a_full_disk_under_the_sqlite_ledger_is_exit_3_disk_full(home, tiny_disk, monkeypatch, cli_process, leave):
    ledger = tiny_disk / "ledger.db"
    monkeypatch.setenv("TRACKWAY_DB", f"sqlite:///{ledger}")
    assert cli_process("runs").code == 0
    filler = _fill(tiny_disk, leave)
    result = cli_process("submit", "--detach", "--name", "nospace", "--", PY, "-c", "pass")
    _one_line(result, f"sqlite:///{ledger}", "disk full", f"file system holding {tiny_disk}", "training is not affected")
    filler.unlink()  # space freed: the ledger works again, with nothing half-recorded
    listed = cli_process("runs", "--json")
    assert listed.code == 0 and "nospace" not in listed.out, (listed.err, listed.out)
    assert cli_process("submit", "--detach", "--name", "roomy", "--", PY, "-c", "pass").code == 0


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_postgresql_ledger_is_exit_3_with_the_password_hidden(home, monkeypatch, cli_process):
    url = f"postgresql+psycopg://trackway:hunter2secret@127.0.0.1:{_closed_port()}/test?connect_timeout=5"
    monkeypatch.setenv("TRACKWAY_DB", url)
    for command in (["runs"], ["submit", "--detach", "--", PY, "-c", "pass"]):
        line = _one_line(cli_process(*command), "trackway:***@127.0.0.1", "unreachable", "training is not affected")
        assert "hunter2secret" not in line


def test_a_new_sqlite_ledger_is_private(tmp_path, monkeypatch, cli_process, home):
    nested = tmp_path / "a" / "b" / "home"
    monkeypatch.setenv("TRACKWAY_HOME", str(nested))
    assert cli_process("runs").code == 0
    assert stat.S_IMODE((nested / "ledger.db").stat().st_mode) == 0o600
    for directory in (nested, nested.parent, nested.parent.parent):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
