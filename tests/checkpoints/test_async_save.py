"""Async save: the caller only captures, one write at a time, failures surface and never look committed."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from trackway.checkpoints.async_save import AsyncSaver, commit_to
from trackway.checkpoints.layout import CheckpointError, CheckpointState
from trackway.checkpoints.store import CheckpointStore
from trackway.checkpoints.torch_state import restore


class Gate:
    """A persist that waits until the test opens it, recording what it saw and how many ran at once."""

    def __init__(self, store: CheckpointStore, step: int) -> None:
        self.opened = threading.Event()
        self.started = threading.Event()
        self.inner = commit_to(lambda: store.begin(step))
        self.seen: list[float] = []

    def __call__(self, snapshot):
        self.started.set()
        assert self.opened.wait(10)
        self.seen.append(float(snapshot.state["model"]["w"][0]))
        return self.inner(snapshot)


class FailingPending:
    """A pending checkpoint whose files fail part-way through, like a full disk."""

    def __init__(self, pending) -> None:
        self.pending = pending
        self.path = pending.path
        self.step = pending.step

    def open(self, relpath, **options):
        inner = self.pending.open(relpath, **options)

        class Failing:
            def __init__(self) -> None:
                self.written = 0

            def write(self, data) -> int:
                self.written += len(data)
                if self.written > 1000:
                    raise OSError(28, "No space left on device")
                return inner.write(data)

            def __getattr__(self, name):
                return getattr(inner, name)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return inner.__exit__(*exc)

        return Failing()

    def commit(self, metrics=None, extra=None):
        return self.pending.commit(metrics=metrics, extra=extra)

    def abort(self) -> None:
        self.pending.abort()


def test_save_returns_before_the_write_and_commit(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    saver = AsyncSaver()
    gate = Gate(store, 1)
    state = {"w": torch.arange(1000.0)}
    started = time.perf_counter()
    saver.save(gate, model=state)
    assert time.perf_counter() - started < 5
    assert gate.started.wait(5)
    assert saver.busy
    assert store.latest_committed() is None
    gate.opened.set()
    saver.wait()
    assert not saver.busy
    info = store.latest_committed()
    assert info.step == 1
    assert torch.equal(torch.load(info.path / "state.pt", weights_only=True)["model"]["w"], state["w"])
    assert restore(info).step == 1


def test_at_most_one_save_in_flight_and_buffers_are_not_overwritten_mid_write(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    saver = AsyncSaver()
    first, second = Gate(store, 1), Gate(store, 2)
    weights = {"w": torch.full((4,), 1.0)}
    saver.save(first, model=weights)
    assert first.started.wait(5)

    weights["w"].fill_(2.0)
    returned = threading.Event()
    caller = threading.Thread(target=lambda: (saver.save(second, model=weights), returned.set()))
    caller.start()
    time.sleep(0.3)
    # The second save is still waiting for the first; it has not captured into the shared buffers.
    assert not returned.is_set() and not second.started.is_set()
    first.opened.set()
    assert returned.wait(5)
    second.opened.set()
    caller.join()
    saver.wait()
    assert first.seen == [1.0] and second.seen == [2.0]
    assert [c.step for c in store.list() if c.state is CheckpointState.COMMITTED] == [1, 2]


def test_on_commit_hears_about_each_durable_checkpoint(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    saver = AsyncSaver()
    heard = []
    for step in (1, 2, 3):
        saver.save(
            commit_to(lambda step=step: store.begin(step), metrics={"loss": step / 10}),
            model={"w": torch.ones(2) * step},
            on_commit=lambda info: heard.append((info.step, info.state, (info.path / "COMMITTED").exists())),
        )
    saver.close()
    assert heard == [(s, CheckpointState.COMMITTED, True) for s in (1, 2, 3)]


def test_a_background_failure_surfaces_on_the_next_call_and_leaves_nothing_committed(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    saver = AsyncSaver()
    saver.save(commit_to(lambda: store.begin(1)), model={"w": torch.ones(10)})
    saver.wait()
    saver.save(commit_to(lambda: FailingPending(store.begin(2))), model={"w": torch.randn(10_000)})

    with pytest.raises(CheckpointError, match="No space left on device") as caught:
        saver.save(commit_to(lambda: store.begin(3)), model={"w": torch.ones(10)})
    assert isinstance(caught.value.__cause__, OSError)
    assert store.get(2) is None or store.get(2).state is not CheckpointState.COMMITTED
    assert store.latest_committed().step == 1
    assert sorted(p.name for p in tmp_path.iterdir() if "00000002" in p.name) == []

    # The failure is reported once; the saver keeps working afterwards.
    saver.save(commit_to(lambda: store.begin(3)), model={"w": torch.ones(10)})
    saver.wait()
    assert store.latest_committed().step == 3


def test_a_failure_surfaces_on_wait_too(tmp_path: Path) -> None:
    saver = AsyncSaver()

    def broken(snapshot):
        raise RuntimeError("serializer exploded")

    saver.save(broken, model={"w": torch.ones(1)})
    with pytest.raises(CheckpointError, match="RuntimeError: serializer exploded"):
        saver.wait()
    saver.wait()


def test_blocking_save_is_done_on_return(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    saver = AsyncSaver()
    threads = []
    saver.save(
        commit_to(lambda: store.begin(4)),
        model={"w": torch.ones(3)},
        on_commit=lambda info: threads.append(threading.current_thread()),
        blocking=True,
    )
    assert store.latest_committed().step == 4
    assert threads == [threading.current_thread()]


def test_a_closed_saver_refuses_to_save(tmp_path: Path) -> None:
    saver = AsyncSaver()
    saver.close()
    with pytest.raises(CheckpointError, match="closed"):
        saver.save(commit_to(lambda: CheckpointStore(tmp_path).begin(1)), model={"w": torch.ones(1)})


def test_an_on_commit_failure_says_the_checkpoint_is_committed(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    saver = AsyncSaver()

    def on_commit(info):
        raise ConnectionError("ledger down")

    saver.save(commit_to(lambda: store.begin(1)), model={"w": torch.ones(1)}, on_commit=on_commit)
    with pytest.raises(CheckpointError, match="is committed, but its on_commit callback failed"):
        saver.wait()
    assert store.latest_committed().step == 1


def test_a_script_that_ends_right_after_an_async_save_still_commits_it(tmp_path: Path) -> None:
    code = (
        "import torch\n"
        "from trackway.checkpoints.manager import CheckpointManager\n"
        f"manager = CheckpointManager({str(tmp_path)!r})\n"
        "manager.save(1, model={'w': torch.ones(4 << 20)})\n"  # no wait(), no close(): the interpreter exits
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    info = CheckpointStore(tmp_path).latest_committed()
    assert info is not None and info.step == 1
    assert torch.equal(torch.load(info.path / "state.pt", weights_only=True)["model"]["w"], torch.ones(4 << 20))


def test_a_save_while_the_interpreter_exits_is_done_in_place(tmp_path: Path) -> None:
    code = (
        "import atexit, torch\n"
        "from trackway.checkpoints.manager import CheckpointManager\n"
        f"manager = CheckpointManager({str(tmp_path)!r})\n"
        "atexit.register(lambda: manager.save(1, model={'w': torch.ones(3)}))\n"  # no thread can start by then
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and not result.stderr, result.stderr
    assert CheckpointStore(tmp_path).latest_committed().step == 1
