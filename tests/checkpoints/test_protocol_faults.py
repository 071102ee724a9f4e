"""Fault injection: real writer processes killed with SIGKILL at every boundary and at random times,
corrupted files and markers, leftover temp directories, skewed mtimes and two writers on one step.

After every case a resume (`latest_committed()`) must choose the newest checkpoint that really
committed, never a partial one, and nothing the writer reported committed may be lost; the judge
in fault_writer.py re-derives both from the bytes on disk and the writer's ground-truth log.
"""

from __future__ import annotations

import importlib.util
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trackway.checkpoints.layout import MANIFEST, MARKER, CheckpointState
from trackway.checkpoints.store import CheckpointStore

WRITER = Path(__file__).with_name("fault_writer.py")
SRC = Path(__file__).resolve().parents[2] / "src"
_spec = importlib.util.spec_from_file_location("checkpoint_fault_writer", WRITER)
fw = sys.modules.setdefault(_spec.name, importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(fw)

SIZE = 256 * 1024  # small shards keep the suite fast; the writer still mixes big and small writes


def start_writer(root: Path, log: Path, *args: str, crash: str | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    env.pop("TRACKWAY_CHECKPOINT_CRASH_AT", None)
    if crash:
        env["TRACKWAY_CHECKPOINT_CRASH_AT"] = crash
    command = [sys.executable, str(WRITER), str(root), "--log", str(log), "--size", str(SIZE), *args]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)


def run_writer(root: Path, log: Path, *args: str, crash: str | None = None) -> int:
    proc = start_writer(root, log, *args, crash=crash)
    proc.communicate(timeout=60)
    return proc.returncode


def assert_judged_ok(root: Path, log: Path) -> fw.Verdict:
    verdict = fw.judge(root, log)
    assert verdict.ok, verdict
    return verdict


def committed_steps(root: Path) -> list[int]:
    return [c.step for c in CheckpointStore(root).list() if c.state.readable]


# (crash point, writer flags, steps committed when it dies): the writer commits 10, 20, 30, 40.
BOUNDARIES = [
    ("mid_write@3", [], []),
    ("after_payload_fsync@4", [], [10]),
    ("after_manifest@2", [], [10]),
    ("before_rename@2", [], [10]),
    ("after_rename@2", [], [10]),
    ("after_COMMITTED_tmp_write@2", [], [10]),
    ("before_COMMITTED_rename@2", [], [10]),
    ("after_COMMITTED_rename@2", [], [10, 20]),
    ("after_commit@2", [], [10, 20]),
    ("after_SUPERSEDED_rename@1", ["--retention"], [10, 20, 30]),
    ("delete_after_marker@1", ["--retention"], [20, 30, 40]),
    ("delete_mid_files@3", ["--retention"], [20, 30, 40]),
]


@pytest.mark.parametrize(("crash", "flags", "survivors"), BOUNDARIES, ids=[b[0] for b in BOUNDARIES])
def test_killed_at_a_boundary_then_resumed(tmp_path: Path, crash: str, flags: list[str], survivors: list[int]) -> None:
    root, log = tmp_path / "ckpt", tmp_path / "log"
    assert run_writer(root, log, "--count", "4", *flags, crash=crash) == -signal.SIGKILL
    verdict = assert_judged_ok(root, log)
    assert committed_steps(root) == survivors and verdict.latest == max(survivors, default=None)
    # The next attempt resumes from there, writes on (over any half-written step) and loses nothing.
    assert run_writer(root, log, "--count", "2", *flags) == 0
    verdict = assert_judged_ok(root, log)
    assert verdict.latest == max(survivors, default=0) + 20
    CheckpointStore(root).clean_debris(min_age_s=0)
    leftovers = [p.name for p in root.iterdir() if not p.name.startswith("step-")]
    assert leftovers == [] and assert_judged_ok(root, log).latest == verdict.latest


def test_killed_while_cleaning_debris(tmp_path: Path) -> None:
    root, log = tmp_path / "ckpt", tmp_path / "log"
    assert run_writer(root, log, "--count", "2", crash="after_rename@2") == -signal.SIGKILL  # leaves step-20 debris
    assert run_writer(root, log, "--count", "1", "--clean", crash="clean_mid@1") == -signal.SIGKILL
    assert_judged_ok(root, log)
    assert run_writer(root, log, "--count", "1", "--clean") == 0
    assert [p.name for p in root.iterdir() if not p.name.startswith("step-")] == []
    assert assert_judged_ok(root, log).latest == 30


def test_killed_at_random_times(tmp_path: Path) -> None:
    root, log = tmp_path / "ckpt", tmp_path / "log"
    rng = random.Random(1234)
    for _ in range(12):
        before = _commits_logged(log)
        proc = start_writer(root, log, "--count", "1000", "--retention")
        assert proc.stdout.readline() == "ready\n"
        # Past its first commit, then anywhere: on a loaded machine 0.15 s may not reach a commit at all,
        # and twelve kills that each land before one would test only the start.
        deadline = time.monotonic() + 60
        while _commits_logged(log) == before and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.15))
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        assert_judged_ok(root, log)
    assert run_writer(root, log, "--count", "1", "--retention") == 0
    assert len(assert_judged_ok(root, log).logged) >= 2


def _commits_logged(log: Path) -> int:
    return sum(line.startswith("commit ") for line in log.read_text().splitlines()) if log.exists() else 0


def build(root: Path, steps: tuple[int, ...] = (10, 20, 30)) -> CheckpointStore:
    store = CheckpointStore(root)
    for step in steps:
        fw.write_checkpoint(store, step, 0, SIZE, None)
    return store


def flip_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def copy_from_step_20(directory: Path, *names: str) -> None:
    for name in names:
        (directory / name).write_bytes((directory.parent / "step-00000020" / name).read_bytes())


CORRUPTIONS = {
    "truncated file": lambda d: os.truncate(d / "shard-1.bin", (d / "shard-1.bin").stat().st_size // 2),
    "same-size bit flip": lambda d: flip_bit(d / "nested" / "deeper" / "shard-2.bin"),
    "missing file": lambda d: (d / "shard-0.bin").unlink(),
    "torn marker": lambda d: (d / MARKER).write_bytes((d / MARKER).read_bytes()[:20]),
    "garbage marker": lambda d: (d / MARKER).write_bytes(b"\x00\xffnot json at all"),
    "marker of another manifest": lambda d: copy_from_step_20(d, MARKER),
    "edited manifest": lambda d: (d / MANIFEST).write_bytes((d / MANIFEST).read_bytes().replace(b'"loss"', b'"LOSS"')),
    "another step's marker and manifest": lambda d: copy_from_step_20(d, MARKER, MANIFEST),
}


@pytest.mark.parametrize("corrupt", list(CORRUPTIONS), ids=list(CORRUPTIONS))
def test_corrupt_newest_is_set_aside_and_the_previous_one_used(tmp_path: Path, corrupt: str) -> None:
    store = build(tmp_path)
    newest = tmp_path / "step-00000030"
    CORRUPTIONS[corrupt](newest)
    before = sorted(p.relative_to(newest) for p in newest.rglob("*"))
    assert store.latest_committed().step == 20
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("step-00000030.corrupt-")]
    assert len(aside) == 1 and not newest.exists()
    assert sorted(p.relative_to(aside[0]) for p in aside[0].rglob("*")) == before  # set aside intact
    store.clean_debris(min_age_s=0)
    assert aside[0].exists() and store.latest_committed().step == 20  # never deleted, and stable
    assert fw.really_committed(tmp_path / "step-00000020")


def test_killed_while_setting_a_corrupt_checkpoint_aside(tmp_path: Path) -> None:
    root, log = tmp_path / "ckpt", tmp_path / "log"
    assert run_writer(root, log, "--count", "3") == 0
    flip_bit(root / "step-00000030" / "shard-0.bin")
    assert run_writer(root, log, "--count", "1", crash="before_set_aside") == -signal.SIGKILL
    assert (root / "step-00000030").exists()  # not yet moved: the next look sets it aside again
    assert CheckpointStore(root).latest_committed().step == 20
    assert run_writer(root, log, "--count", "1") == 0
    assert committed_steps(root) == [10, 20, 30]  # step 30 written again, by the resumed writer
    assert len([p for p in root.iterdir() if ".corrupt-" in p.name]) == 1


def test_corruption_below_the_newest_does_not_change_the_choice(tmp_path: Path) -> None:
    store = build(tmp_path)
    flip_bit(tmp_path / "step-00000020" / "shard-0.bin")
    assert store.latest_committed().step == 30
    assert (tmp_path / "step-00000020").exists()  # only what stands above the chosen one is judged
    assert store.list(verify_files=True)[1].state is CheckpointState.CORRUPT


def test_two_corrupt_newest_fall_back_two_steps(tmp_path: Path) -> None:
    store = build(tmp_path)
    (tmp_path / "step-00000030" / "shard-0.bin").unlink()
    flip_bit(tmp_path / "step-00000020" / "shard-1.bin")
    assert store.latest_committed().step == 10
    assert len([p for p in tmp_path.iterdir() if ".corrupt-" in p.name]) == 2


def test_leftovers_and_skewed_mtimes_do_not_change_the_choice(tmp_path: Path) -> None:
    root, log = tmp_path / "ckpt", tmp_path / "log"
    assert run_writer(root, log, "--count", "3") == 0
    assert run_writer(root, log, "--count", "1", crash="before_rename@1") == -signal.SIGKILL  # a temp dir
    assert run_writer(root, log, "--count", "1", crash="after_COMMITTED_tmp_write@1") == -signal.SIGKILL
    (root / "step-00000999").mkdir()  # an empty step directory from who knows what
    store = CheckpointStore(root)
    expected = [(c.step, c.state) for c in store.list()]
    assert store.latest_committed().step == 30 and len(store.debris()) == 3
    now = time.time()
    everything = [root, *root.rglob("*")]
    for when in (now + 20 * 365 * 86400, 0.0, None):
        for i, path in enumerate(everything):
            moment = when if when is not None else (0.0 if i % 2 else now + 10**9)  # some old, some future
            os.utime(path, (moment, moment), follow_symlinks=False)
        assert [(c.step, c.state) for c in store.list()] == expected
        assert store.latest_committed().step == 30
        assert_judged_ok(root, log)
    for path in everything:
        os.utime(path, (now + 10**9, now + 10**9))
    assert store.clean_debris(min_age_s=3600) == []  # anything dated in the future looks young: kept
    assert len(store.clean_debris(min_age_s=0)) == 3 and store.latest_committed().step == 30


def race(root: Path, log: Path, step: int) -> list[int]:
    barrier = root.parent / f"go-{step}"
    args = ("--step", str(step), "--barrier", str(barrier))
    procs = [start_writer(root, log, *args, "--variant", str(variant)) for variant in (1, 2)]
    for proc in procs:
        assert proc.stdout.readline() == "ready\n"
    barrier.touch()
    for proc in procs:
        proc.communicate(timeout=60)
    return [proc.returncode for proc in procs]


def test_two_writers_racing_on_one_step(tmp_path: Path) -> None:
    root, log = tmp_path / "ckpt", tmp_path / "log"
    for step in (10, 20, 30, 40):
        assert race(root, log, step) == [0, 0]
        winners = [line.split()[2] for line in log.read_text().splitlines() if line.startswith(f"commit {step} ")]
        assert len(winners) == 2 and winners[0] == winners[1]  # both were told the same checkpoint
        assert_judged_ok(root, log)
    assert committed_steps(root) == [10, 20, 30, 40]
    assert [p.name for p in root.iterdir() if not p.name.startswith("step-")] == []  # the loser cleaned up


def test_second_writer_moves_a_dead_writers_uncommitted_step_aside(tmp_path: Path) -> None:
    root, log = tmp_path / "ckpt", tmp_path / "log"
    assert run_writer(root, log, "--step", "10", "--variant", "1", crash="after_rename") == -signal.SIGKILL
    assert_judged_ok(root, log)
    assert CheckpointStore(root).get(10).state is CheckpointState.WRITING
    assert run_writer(root, log, "--step", "10", "--variant", "2") == 0
    verdict = assert_judged_ok(root, log)
    assert verdict.latest == 10 and log.read_text().splitlines()[-1] == "commit 10 2"
    assert len([p for p in root.iterdir() if p.name.startswith(".debris-step-00000010-")]) == 1
