"""`run.checkpoints`: due, save, writing, restore_latest, lineage, commit callbacks, and two real ranks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import trackway.checkpoints
from trackway.checkpoints.layout import MANIFEST, CheckpointError, CheckpointState
from trackway.checkpoints.manager import CheckpointManager, shard_name
from trackway.checkpoints.store import CheckpointStore
from trackway.errors import InputError

SCRIPTS = Path(__file__).parent / "scripts"
TORCHRUN = Path(sys.executable).parent / "torchrun"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def committed_steps(manager: CheckpointManager) -> list[int]:
    return [c.step for c in manager.list() if c.state is CheckpointState.COMMITTED]


def test_due_every_n_steps(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, every_steps=10)
    assert [s for s in range(0, 35) if manager.due(s)] == [10, 20, 30]


def test_due_every_m_minutes_since_the_last_save(tmp_path: Path) -> None:
    clock = FakeClock()
    manager = CheckpointManager(tmp_path, every_minutes=2, clock=clock, async_save=False)
    assert not manager.due(1)
    clock.now += 119
    assert not manager.due(2)
    clock.now += 1
    assert manager.due(3)
    manager.save(3, model={"w": torch.ones(1)})
    assert not manager.due(4)
    clock.now += 120
    assert manager.due(5)


def test_due_by_steps_or_minutes_whichever_comes_first(tmp_path: Path) -> None:
    clock = FakeClock()
    manager = CheckpointManager(tmp_path, every_steps=100, every_minutes=1, clock=clock)
    assert manager.due(100)
    assert not manager.due(7)
    clock.now += 61
    assert manager.due(7)


def test_due_is_never_true_without_a_schedule_or_twice_for_a_step(tmp_path: Path) -> None:
    assert not any(CheckpointManager(tmp_path).due(s) for s in range(100))
    manager = CheckpointManager(tmp_path, every_steps=5)
    manager.save(5, model={"w": torch.ones(1)})
    assert not manager.due(5)
    manager.close()


@pytest.mark.parametrize("bad", [{"every_steps": 0}, {"every_steps": 2.5}, {"every_minutes": 0}, {"every_minutes": -1}])
def test_bad_schedules_are_refused(tmp_path: Path, bad: dict) -> None:
    with pytest.raises(InputError, match="every_"):
        CheckpointManager(tmp_path, **bad)


def test_save_then_restore_latest_round_trip(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 3)).sum().backward()
    optimizer.step()
    with CheckpointManager(tmp_path, run_id="r1", attempt_id="a1") as manager:
        manager.save(7, model=model, optimizer=optimizer, data_state={"index": 70}, metrics={"loss": 1.5})

    fresh = CheckpointManager(tmp_path)
    other = torch.nn.Linear(3, 3)
    other_optimizer = torch.optim.SGD(other.parameters(), lr=0.1, momentum=0.9)
    restored = fresh.restore_latest(model=other, optimizer=other_optimizer)
    assert (restored.step, restored.data_state, restored.metrics) == (7, {"index": 70}, {"loss": 1.5})
    assert torch.equal(other.weight, model.weight)
    assert other_optimizer.state_dict()["state"][0]["momentum_buffer"].equal(
        optimizer.state_dict()["state"][0]["momentum_buffer"]
    )
    manifest = restored.info.manifest
    assert (manifest["run_id"], manifest["attempt_id"], manifest["step"]) == ("r1", "a1", 7)
    assert fresh.parent == restored.info.name
    assert not fresh.due(7)


def test_restore_latest_is_none_on_a_fresh_start(tmp_path: Path) -> None:
    assert CheckpointManager(tmp_path / "nothing-here").restore_latest(model=torch.nn.Linear(1, 1)) is None


def test_a_resume_target_with_nothing_committed_is_an_error_not_a_fresh_start(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, resume_from="step-00000100")
    with pytest.raises(CheckpointError, match="asked to resume from step-00000100"):
        manager.restore_latest(model=torch.nn.Linear(1, 1))


def test_restore_latest_waits_for_the_save_in_flight(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    big = {"w": torch.randn(4_000_000)}
    manager.save(1, model=big)
    restored = manager.restore_latest(model=None)
    assert restored.step == 1


def test_restore_latest_sets_a_corrupt_checkpoint_aside_and_uses_the_previous(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, async_save=False)
    manager.save(1, model={"w": torch.zeros(100)})
    manager.save(2, model={"w": torch.ones(100)})
    newest = CheckpointStore(tmp_path).get(2).path / "state.pt"
    data = bytearray(newest.read_bytes())
    data[-100] ^= 0xFF
    newest.write_bytes(bytes(data))

    restored = CheckpointManager(tmp_path).restore_latest()
    assert restored.step == 1
    assert (restored.info.path / "state.pt").exists()


def test_lineage_runs_from_the_resumed_checkpoint_through_each_save(tmp_path: Path) -> None:
    first = CheckpointManager(tmp_path)
    first.save(1, model={"w": torch.ones(1)})
    first.save(2, model={"w": torch.ones(1)})
    first.close()
    second = CheckpointManager(tmp_path, resume_from="step-00000002")
    second.restore_latest()
    second.save(3, model={"w": torch.ones(1)})
    second.save(4, model={"w": torch.ones(1)})
    second.close()
    store = CheckpointStore(tmp_path)
    parents = {c.step: c.manifest.get("parent") for c in store.list()}
    names = {c.step: c.name for c in store.list()}
    assert parents == {1: None, 2: names[1], 3: names[2], 4: names[3]}


def test_saving_the_same_step_twice_is_a_no_op(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    manager.save(3, model={"w": torch.ones(1)})
    manager.save(3, model={"w": torch.zeros(1)})
    manager.close()
    assert committed_steps(manager) == [3]


def test_on_commit_gets_every_durable_checkpoint(tmp_path: Path) -> None:
    heard = []
    manager = CheckpointManager(tmp_path, on_commit=lambda info: heard.append((info.step, info.name)))
    for step in (10, 20):
        manager.save(step, model={"w": torch.ones(1)}, metrics={"loss": 0.1})
    manager.close()
    assert [step for step, _ in heard] == [10, 20]
    assert all((tmp_path / name / "COMMITTED").exists() for _, name in heard)


def test_a_failed_background_save_is_raised_by_the_next_save(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    manager.save(1, model={"w": torch.ones(1)})
    manager.wait()
    shutil.rmtree(tmp_path)
    (tmp_path).write_text("a file where the checkpoint directory should be")
    manager.save(2, model={"w": torch.ones(1)})
    with pytest.raises(CheckpointError, match="background checkpoint save failed"):
        manager.save(2, model={"w": torch.ones(1)})

    # Storage is back: saving the step that failed really saves it.
    tmp_path.unlink()
    manager.save(2, model={"w": torch.full((1,), 2.0)})
    manager.close()
    assert committed_steps(manager) == [2]


def test_writing_commits_any_files_on_clean_exit(tmp_path: Path) -> None:
    heard = []
    manager = CheckpointManager(tmp_path, on_commit=heard.append)
    with manager.writing(5, metrics={"acc": 0.9}) as directory:
        (directory / "weights.bin").write_bytes(b"\x01" * 1000)
        (directory / "tokenizer").mkdir()
        (directory / "tokenizer" / "vocab.txt").write_text("a\nb\n")
    info = CheckpointStore(tmp_path).latest_committed()
    assert info.step == 5 and info.manifest["metrics"] == {"acc": 0.9}
    assert (info.path / "tokenizer" / "vocab.txt").read_text() == "a\nb\n"
    assert [i.step for i in heard] == [5]
    assert manager.latest().step == 5


def test_writing_discards_everything_on_an_exception(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    with pytest.raises(ZeroDivisionError):
        with manager.writing(6) as directory:
            (directory / "weights.bin").write_bytes(b"\x01" * 10)
            1 / 0
    assert committed_steps(manager) == []
    assert CheckpointStore(tmp_path).latest_committed() is None


def test_the_manager_does_not_import_torch_for_scripts_that_do_not_use_it(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from trackway.checkpoints.manager import CheckpointManager\n"
        f"m = CheckpointManager({str(tmp_path)!r}, every_steps=2)\n"
        "assert m.due(2)\n"
        "with m.writing(2) as d:\n"
        "    (d / 'model.json').write_text('{}')\n"
        "assert [c.step for c in m.list()] == [2], m.list()\n"
        "assert m.latest().step == 2\n"
        "m.close()\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_shard_names() -> None:
    assert [shard_name(r) for r in (0, 1, 12)] == ["state.pt", "rank-00001.pt", "rank-00012.pt"]


def torchrun(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [str(TORCHRUN), "--standalone", "--nproc_per_node=2", str(SCRIPTS / "train_tiny.py"), *args],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )


@pytest.mark.slow
@pytest.mark.parametrize("payload", ["torch", "safetensors"])
def test_two_ranks_write_one_shard_each_commit_once_and_resume_exactly(tmp_path: Path, payload: str) -> None:
    common = ["--steps", "20", "--every", "5", "--format", payload]
    straight = torchrun(str(tmp_path / "straight"), str(tmp_path / "straight.pt"), *common)
    assert straight.returncode == 0, straight.stderr[-3000:]
    stopped = torchrun(str(tmp_path / "stopped"), str(tmp_path / "unused.pt"), *common, "--stop-after", "13")
    assert stopped.returncode == 0, stopped.stderr[-3000:]

    store = CheckpointStore(tmp_path / "stopped")
    latest = store.latest_committed()
    assert latest is not None and latest.step in (5, 10)
    manifest = json.loads((latest.path / MANIFEST).read_text())
    assert {shard_name(0, payload), shard_name(1, payload)} <= set(_manifest_files(manifest))
    rank0, rank1 = (trackway.checkpoints.load(latest.path, rank=rank) for rank in (0, 1))
    assert rank0["data_state"]["rank"] == 0 and rank1["data_state"]["rank"] == 1
    assert not torch.equal(rank0["rng"]["torch"], rank1["rng"]["torch"])
    # The stop may land while step 10 is still being written: its temp directory is debris, never read;
    # between the rename and the marker it is an unmarked step directory, which is just as unread.
    unread = [info for info in store.list() if not info.state.readable]
    assert all(info.state is CheckpointState.WRITING and info.step > latest.step for info in unread), unread

    resumed = torchrun(str(tmp_path / "stopped"), str(tmp_path / "resumed.pt"), *common, "--files-at", "21")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed {latest.step}" in resumed.stdout
    for rank in (0, 1):
        expected = torch.load(f"{tmp_path / 'straight.pt'}.rank{rank}", weights_only=True)
        got = torch.load(f"{tmp_path / 'resumed.pt'}.rank{rank}", weights_only=True)
        for name in expected:
            assert torch.equal(expected[name], got[name]), (rank, name)
    infos = [c for c in CheckpointStore(tmp_path / "stopped").list() if c.state is CheckpointState.COMMITTED]
    assert [c.step for c in infos][-3:] == [15, 20, 21]
    assert infos[-2].manifest["parent"] == infos[-3].name
    # writing() with two ranks: one shared directory, both ranks' files, committed once by rank 0.
    neutral = infos[-1]
    assert sorted(neutral.manifest["files"]) == ["notes-rank0.txt", "notes-rank1.txt"]
    assert neutral.manifest["parent"] == infos[-2].name and neutral.manifest["metrics"] == {"final": True}
    assert (neutral.path / "notes-rank1.txt").read_text() == "rank 1 finished 20 steps\n"


def _manifest_files(manifest: dict) -> list[str]:
    files = manifest.get("files")
    if isinstance(files, dict):
        return list(files)
    return [f.get("path") or f.get("name") for f in files]


def collective_calls(root: Path, mode: str, timeout_s: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRACKWAY_COLLECTIVE_TIMEOUT_S": timeout_s}
    return subprocess.run(
        [str(TORCHRUN), "--standalone", "--nproc_per_node=2", str(SCRIPTS / "collective_calls.py"), str(root), mode],
        capture_output=True, text=True, timeout=120, env=env,
    )


def test_a_restore_on_rank_0_only_fails_in_seconds_naming_the_rank_that_did_not_join(tmp_path: Path) -> None:
    # Not a hang until gloo's 30-minute timeout: collective_calls' own limit is 120 s.
    done = collective_calls(tmp_path / "ckpt", "restore-rank0-only", "3")
    assert done.returncode != 0
    assert ("CollectiveCallError: rank 0 called the collective checkpoint call restore_latest(), "
            "and rank 1 of 2 did not join within 3 s") in done.stderr


@pytest.mark.slow
def test_mismatched_collective_calls_name_what_the_other_rank_called(tmp_path: Path) -> None:
    done = collective_calls(tmp_path / "ckpt", "mismatch", "3")
    assert done.returncode != 0
    assert "rank 1 of 2 did not join within 3 s (rank 1 called latest() instead)" in done.stderr
    assert "rank 0 of 2 did not join within 3 s (rank 0 called save(5) instead)" in done.stderr


def test_ranks_arriving_apart_and_a_long_write_are_not_mistaken_for_a_missing_rank(tmp_path: Path) -> None:
    # Rank 1 reaches save 2 s late and spends 5 s in writing()'s block: both under a 4 s limit, as only entry is timed.
    done = collective_calls(tmp_path / "ckpt", "skew", "4")
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(line for line in done.stdout.splitlines() if line.startswith("ok")) == ["ok 0 12", "ok 1 12"]
    committed = [c for c in CheckpointStore(tmp_path / "ckpt").list() if c.state is CheckpointState.COMMITTED]
    assert [c.step for c in committed] == [5, 6]
    assert sorted(committed[1].manifest["files"]) == ["rank0.txt", "rank1.txt"]
