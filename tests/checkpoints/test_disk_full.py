"""A checkpoint save that fills the disk says so, leaves nothing half-written, and saving works once there is room.

Regression for issue 9.6 (checkpoint side): ENOSPC during a save reached the training script as
a CheckpointError naming no disk, and the ending was classified `code_error`. Now the script gets
an OSError with errno ENOSPC naming the checkpoint root and the bytes free, from the blocking
path, the background writer (on the next save/wait/close) and `writing()`. A real full tmpfs.
"""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trackway.checkpoints import write
from trackway.checkpoints.layout import CheckpointError
from trackway.checkpoints.manager import CheckpointManager
from trackway.checkpoints.store import CheckpointStore

PY = sys.executable
SCRIPT = str(Path(__file__).parent / "scripts" / "sdk_resume.py")
BIG = 6 << 20  # more than the 4 MiB disk holds


def mount_tmpfs(where: Path, size: str = "4m") -> None:
    where.mkdir(parents=True, exist_ok=True)
    command = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"a real full disk needs a tmpfs mount, and it failed: {done.stderr.strip() or done.returncode}")


def unmount(where: Path) -> None:
    if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.fixture
def disk(tmp_path: Path):
    """A 4 MiB file system for the checkpoint root."""
    mount = tmp_path / "disk"
    mount_tmpfs(mount)
    yield mount
    unmount(mount)


def weights(value: float, numel: int = 1000) -> dict:
    return {"w": torch.full((numel,), value)}


def assert_disk_full(exc: BaseException, root: Path, step: int) -> None:
    """What the script sees: an OSError ENOSPC (also a CheckpointError) naming the step, the root and the bytes free."""
    assert isinstance(exc, OSError) and exc.errno == errno.ENOSPC, repr(exc)
    assert isinstance(exc, CheckpointError)
    message = str(exc)
    assert re.search(rf"disk full while saving checkpoint step-{step:08d} under {re.escape(str(root))}: \d+ bytes free",
                     message), message
    assert isinstance(exc.__cause__, OSError) and exc.__cause__.errno == errno.ENOSPC


def assert_nothing_half_written(root: Path, latest: int) -> None:
    store = CheckpointStore(root)
    assert store.latest_committed().step == latest
    assert [c.step for c in store.list()] == [latest]  # no step directory without its marker
    assert store.debris() == [] and sorted(p.name for p in root.iterdir()) == [f"step-{latest:08d}"]


def test_a_blocking_save_that_fills_the_disk_raises_enospc_and_leaves_no_half_checkpoint(disk: Path) -> None:
    manager = CheckpointManager(disk, async_save=False)
    manager.save(1, model=weights(1.0))
    with pytest.raises(OSError) as caught:
        manager.save(2, model=weights(2.0, BIG // 4))
    assert_disk_full(caught.value, disk, 2)
    assert_nothing_half_written(disk, 1)

    # The failed step is not taken as saved: with room (a smaller state), step 2 saves and restores.
    manager.save(2, model=weights(2.0))
    restored = CheckpointManager(disk).restore_latest(model=None)
    assert restored.step == 2


def test_a_safetensors_save_that_cannot_fit_fails_before_writing_a_byte(disk: Path, monkeypatch) -> None:
    manager = CheckpointManager(disk, async_save=False, format="safetensors")
    manager.save(1, model=weights(1.0))
    free = os.statvfs(disk).f_bavail
    passed: list[str] = []  # the crash points write.py passed in this save: "mid_write" after each write
    monkeypatch.setattr(write, "crash_point", passed.append)
    with pytest.raises(OSError) as caught:
        manager.save(2, model=weights(2.0, BIG // 4))
    assert_disk_full(caught.value, disk, 2)
    assert "mid_write" not in passed  # the room was asked for first: no tensor went to a disk without it
    monkeypatch.undo()
    assert_nothing_half_written(disk, 1)
    assert os.statvfs(disk).f_bavail == free


@pytest.mark.parametrize("surfaces_on", ["save", "wait", "close"])
def test_a_background_save_that_fills_the_disk_surfaces_enospc_on_the_next_call(disk: Path, surfaces_on: str) -> None:
    manager = CheckpointManager(disk, async_save=True)
    manager.save(1, model=weights(1.0))
    manager.save(2, model=weights(2.0, BIG // 4))  # returns once copied to host memory
    with pytest.raises(OSError) as caught:
        if surfaces_on == "save":
            manager.save(3, model=weights(3.0))
        elif surfaces_on == "wait":
            manager.wait()
        else:
            manager.close()
    assert_disk_full(caught.value, disk, 2)
    assert_nothing_half_written(disk, 1)


def test_after_space_is_freed_the_same_step_saves_and_restores(disk: Path) -> None:
    manager = CheckpointManager(disk, async_save=True)
    manager.save(1, model=weights(1.0))
    manager.wait()
    filler = disk / "filler"
    filler.write_bytes(b"\0" * (3 << 20))  # someone else's file leaves too little room for step 2
    state = weights(2.0, 300_000)  # 1.2 MB
    manager.save(2, model=state)
    with pytest.raises(OSError) as caught:
        manager.wait()
    assert_disk_full(caught.value, disk, 2)
    filler.unlink()
    assert_nothing_half_written(disk, 1)

    manager.save(2, model=state)
    manager.close()
    model = torch.nn.Module()
    model.register_buffer("w", torch.zeros(300_000))
    restored = CheckpointManager(disk).restore_latest(model=model)
    assert restored.step == 2 and torch.equal(model.w, state["w"])


def test_writing_files_into_a_full_disk_raises_enospc_naming_the_root(disk: Path) -> None:
    manager = CheckpointManager(disk)
    with manager.writing(1) as directory:
        (directory / "notes.txt").write_text("fine")
    with pytest.raises(OSError) as caught:
        with manager.writing(2) as directory:
            (directory / "weights.bin").write_bytes(b"\0" * BIG)
    assert_disk_full(caught.value, disk, 2)
    assert_nothing_half_written(disk, 1)


def test_a_supervised_run_whose_save_fills_the_disk_says_so_and_resumes_once_there_is_room(
    cli, home: Path
) -> None:
    runs = home / "runs"
    mount_tmpfs(runs)
    try:
        # Attempt 1 saves step 10, then a step-20 save too big for the disk, and dies of it at finish().
        failed = cli("submit", "--name", "full", "--", PY, SCRIPT, "25", "--big-at", "20", "--stop-at", "15")
        assert failed.code == 1, failed.err
        (attempt,) = cli("attempts", "full", "--json").json()
        assert attempt["termination_reason"] != "code_error"
        lines = " ".join(attempt["termination_evidence"]["lines"])
        root = runs / attempt["run_id"] / "checkpoints"
        assert "disk full" in lines and str(root) in lines, lines
        log = Path(attempt["log_path"]).read_text()
        assert re.search(rf"\[Errno 28\] disk full while saving checkpoint step-00000020 under {re.escape(str(root))}: "
                         r"\d+ bytes free", log), log[-2000:]
        assert_nothing_half_written(root, 10)

        # The ballast was attempt 1's alone: the next attempt fits, resumes from step 10 and completes.
        resumed = cli("resume", "full")
        assert resumed.code == 0, resumed.err
        second = cli("attempts", "full", "--json").json()[1]
        assert second["termination_reason"] == "completed" and second["resumed_from_checkpoint"] == "step-00000010"
        assert (second["first_step"], second["last_step"]) == (11, 15)
    finally:
        unmount(runs)


def fill(disk: Path, leave_pages: int) -> Path:
    """Fill the disk with a filler file, then give back exactly `leave_pages` pages."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    size = filler.stat().st_size
    with filler.open("r+b") as f:
        f.truncate(size - leave_pages * 4096)
    return filler


def test_a_marker_that_does_not_fit_leaves_no_step_directory_behind(disk: Path) -> None:
    store = CheckpointStore(disk)
    pending = store.begin(1)
    with pending.open("model.bin") as f:
        f.write(b"w" * 100)
    fill(disk, leave_pages=1)  # room for the manifest, none for the commit marker
    with pytest.raises(OSError) as caught:
        pending.commit()
    assert_disk_full(caught.value, disk, 1)
    pending.abort()
    (disk / "filler").unlink()
    assert store.list() == [] and store.debris() == [] and sorted(p.name for p in disk.iterdir()) == []
