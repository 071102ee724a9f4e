"""What `run.log` hands the spool writer, and how the writer encodes it: slices, mixed keys, odd values."""

from __future__ import annotations

import json

import math
import signal
import threading
from pathlib import Path

import numpy as np
import pytest

from trackway.sdk.context import AttemptContext
from trackway.sdk.run import Run
from trackway.sdk.writer import SLICE_ROWS, LossKeys, SpoolWriter
from trackway.spool import decode_metric_line, read_complete_lines


@pytest.fixture
def run(tmp_path):
    context = AttemptContext(run_id="r1", attempt_id="r1/1", attempt_number=1,
                             spool_dir=tmp_path / "spool", checkpoint_dir=tmp_path / "ckpt")
    made = Run(context, {}, install_hooks=False)
    yield made
    made.finish()


def _lines(spool: Path) -> list[tuple[list[str], list[int], list[float], list[list[float]]]]:
    lines, _ = read_complete_lines(spool / "metrics-r0.jsonl", 0)
    return [decode_metric_line(line) for line in lines]


def _points(spool: Path) -> dict[tuple[str, int], float]:
    return {(key, step): value for keys, steps, _, values in _lines(spool)
            for key, column in zip(keys, values) for step, value in zip(steps, column)}


def test_steps_given_as_numpy_integers_or_whole_floats_are_integers(run, tmp_path):
    run.log({"loss": 1.0}, step=np.int64(3))
    run.log({"loss": 2.0}, step=4.0)
    run.log({"loss": 3.0})
    with pytest.raises(TypeError, match=r"run.log\(step=2.5\): a step is an integer"):
        run.log({"loss": 4.0}, step=2.5)
    run._writer.flush()
    assert _points(tmp_path / "spool") == {("loss", 3): 1.0, ("loss", 4): 2.0, ("loss", 5): 3.0}


def test_a_dict_reused_by_the_script_is_logged_as_it_was(run, tmp_path):
    metrics = {"loss": 1.0}
    for step in range(3):
        metrics["loss"] = float(step)
        run.log(metrics, step=step)
    run._writer.flush()
    assert _points(tmp_path / "spool") == {("loss", 0): 0.0, ("loss", 1): 1.0, ("loss", 2): 2.0}


def test_a_long_flush_is_written_a_slice_at_a_time_in_order(tmp_path):
    writer = SpoolWriter(tmp_path / "spool", flush_interval_s=3600)
    total = 3 * SLICE_ROWS + 17
    for step in range(total):
        extra = {"eval_loss": 0.5} if step % 100 == 0 else {}  # another set of keys now and then
        writer.queue.append((step, 1000.0 + step, {"loss": 1.0 / (step + 1), **extra}))
    writer.flush()
    writer.close()
    lines = _lines(tmp_path / "spool")
    assert all(len(steps) <= SLICE_ROWS for _, steps, _, _ in lines)
    loss_steps = [step for keys, steps, _, _ in lines if keys == ["loss"] for step in steps]
    assert loss_steps == [step for step in range(total) if step % 100]  # in the order logged
    points = _points(tmp_path / "spool")
    assert len(points) == total + len(range(0, total, 100))
    assert points[("eval_loss", 200)] == 0.5 and points[("loss", 200)] == 1 / 201


def test_values_that_are_not_plain_floats(tmp_path):
    class Scalar:
        def __float__(self):
            return 2.5

    writer = SpoolWriter(tmp_path / "spool", flush_interval_s=3600)
    writer.queue.extend([
        (0, 1000.0, {"a": 1, "b": True, "c": np.float32(0.5), "d": Scalar()}),
        (1, 1001.0, {"a": "1.5", "b": None, "c": "text", "d": [1, 2], "e": np.ones(3)}),
        (2, 1002.0, {"a": 10**400, "b": float("inf"), "": 1.0, "k" * 201: 1.0}),
        (3, 1003.0, {"x": "nothing numeric"}),
    ])
    writer.close()
    points = _points(tmp_path / "spool")
    assert points == {("a", 0): 1.0, ("b", 0): 1.0, ("c", 0): 0.5, ("d", 0): 2.5, ("a", 1): 1.5, ("b", 2): math.inf}


def test_a_non_finite_tensor_like_loss_is_found_by_the_writer(tmp_path):
    writer = SpoolWriter(tmp_path / "spool", flush_interval_s=3600, loss_keys=LossKeys())
    writer.queue.extend((step, 1000.0 + step, {"loss": np.float64(1.0), "lr": 0.1}) for step in range(5))
    writer.queue.append((5, 1005.0, {"loss": np.float64("nan"), "lr": 0.1}))
    writer.flush()
    assert writer.non_finite is not None and writer.non_finite[0] == "loss" and writer.non_finite[2] == 5
    writer.close()


def test_events_are_written_while_a_flush_runs(tmp_path):
    writer = SpoolWriter(tmp_path / "spool", flush_interval_s=3600)
    writer.queue.extend((step, 1000.0 + step, {"loss": 1.0}) for step in range(20 * SLICE_ROWS))
    flushing = threading.Thread(target=writer.flush)
    flushing.start()
    for n in range(20):
        writer.event("progress", n=n)
    flushing.join(timeout=30)
    writer.close()
    assert len(_points(tmp_path / "spool")) == 20 * SLICE_ROWS
    events = (tmp_path / "spool" / "events.jsonl").read_text().splitlines()
    assert [line.count('"kind": "progress"') for line in events].count(1) == 20


@pytest.mark.parametrize("asked", [{}, {"log_all_ranks": False}], ids=["every rank logs by default", "rank 0 only"])
def test_another_rank_logs_unless_told_not_to_and_its_heartbeat_says_its_step_either_way(tmp_path, asked):
    context = AttemptContext(run_id="r1", attempt_id="r1/1", attempt_number=1, spool_dir=tmp_path / "spool",
                             checkpoint_dir=tmp_path / "ckpt", rank=1, world_size=2)
    run = Run(context, {}, install_hooks=False, **asked)
    for step in range(3):
        run.log({"loss": float(step)})
    run._writer.flush()
    spool = tmp_path / "spool" / "metrics-r1.jsonl"
    points = ({(key, step) for keys, steps, _, _ in (decode_metric_line(line) for line in read_complete_lines(spool, 0)[0])
               for key in keys for step in steps} if spool.exists() else set())
    assert points == ({("loss", 0), ("loss", 1), ("loss", 2)} if not asked else set())
    assert run._step == 2
    run.finish()
    # Its own heartbeat, beside rank 0's file (which it never touches): its rank, its step, and that it finished.
    beat = json.loads((tmp_path / "spool" / "heartbeat-r1.json").read_text())
    assert (beat["rank"], beat["step"], beat["closed"]) == (1, 2, True)
    assert not (tmp_path / "spool" / "heartbeat.json").exists()


def test_after_a_notice_is_read_the_script_logs_on_until_it_saves_and_exits(tmp_path):
    context = AttemptContext(run_id="r1", attempt_id="r1/1", attempt_number=1,
                             spool_dir=tmp_path / "spool", checkpoint_dir=tmp_path / "ckpt")
    run = Run(context, {}, install_hooks=False)
    run.log({"loss": 1.0}, step=0)
    run._on_notice(signal.SIGTERM)
    run.log({"loss": 2.0}, step=1)  # the step under way when the notice came
    assert run.should_stop
    for step in range(2, 5):  # read: the script handles the notice, so later steps are logged, not ended
        run.log({"loss": float(step)}, step=step)
    run._writer.flush()
    assert {step for (_, step) in _points(tmp_path / "spool")} == {0, 1, 2, 3, 4}
    with pytest.raises(SystemExit) as ended:
        run.finish()
    assert ended.value.code == 75  # preempted: resumed, never completed


def test_the_shared_termination_note_is_the_first_ending_rank_s_and_rank_0_only_restates_it(tmp_path):
    spool = tmp_path / "spool"
    ranks = [Run(AttemptContext(run_id="r1", attempt_id="r1/1", attempt_number=1, spool_dir=spool,
                                checkpoint_dir=tmp_path / "ckpt", rank=rank, world_size=2), {}, install_hooks=False)
             for rank in (0, 1)]
    note = spool / "termination.json"
    ranks[1].note("oom", "rank 1 ran out of memory")  # the cause
    ranks[0].note("code_error", "RuntimeError: Connection closed by peer")  # its consequence on rank 0
    assert (json.loads(note.read_text())["rank"], json.loads(note.read_text())["reason"]) == (1, "oom")
    note.unlink()
    ranks[1].note("preempted", "rank 1 saved and stopped")
    ranks[0].note("preempted", "rank 0 saved and stopped")  # the same reason: rank 0's word, with its step
    ranks[1].note("code_error", "rank 1 again")  # a different reason after: never over it
    assert json.loads(note.read_text())["message"] == "rank 0 saved and stopped"
    assert [p.name for p in spool.iterdir() if p.name.endswith(".tmp")] == []
    for run in ranks:
        run._close(None, None)
