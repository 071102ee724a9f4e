"""GPU placement on the local executor: the pure choice, leases between live attempts, CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest

from trackway.errors import InputError
from trackway.executors.local import LocalExecutor, choose_gpus
from trackway.executors.process_tree import process_create_time

from .conftest import FakeGpu, log_lines, python, wait_ended, wait_for

PRINT_GPUS_THEN_WAIT = """
import os, sys, time
print(repr(os.environ.get("CUDA_VISIBLE_DEVICES")), flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
"""


def gpus(count: int, busy: tuple[int, ...] = ()) -> list[FakeGpu]:
    return [FakeGpu(index=i, uuid=f"GPU-{i}", processes=1 if i in busy else 0) for i in range(count)]


def visible_devices(request) -> str | None:
    lines = wait_for(lambda: log_lines(request.log_path) if request.log_path.exists() else None, "the child's output")
    return ast.literal_eval(lines[0][2])


@pytest.mark.parametrize(
    ("inventory", "leased", "n", "chosen"),
    [
        (gpus(4), set(), 2, [0, 1]),
        (gpus(4), set(), 0, []),
        (gpus(2, busy=(0,)), set(), 1, [1]),
        (gpus(3), {0, 1}, 1, [2]),
        (list(reversed(gpus(3))), set(), 3, [0, 1, 2]),
    ],
    ids=["all-free", "none-asked", "busy-by-process", "leased", "any-order"],
)
def test_choose_gpus_takes_the_lowest_free_indices(inventory, leased, n, chosen):
    assert choose_gpus(inventory, leased, n) == chosen


@pytest.mark.parametrize(
    ("inventory", "leased", "n", "message"),
    [
        ([], set(), 2, "--gpus 2: this machine has 0 GPUs"),
        (gpus(1), set(), 2, "--gpus 2: this machine has 1 GPU"),
        (gpus(4, busy=(2,)), {0, 3}, 2, "--gpus 2: only 1 of 4 GPUs is free (busy: 0, 2, 3)"),
        (gpus(2), {0, 1}, 1, "--gpus 1: only 0 of 2 GPUs are free (busy: 0, 1)"),
        (gpus(2), set(), -1, "--gpus -1: expected a whole number of GPUs, 0 or more"),
    ],
)
def test_choose_gpus_says_why_it_cannot(inventory, leased, n, message):
    with pytest.raises(InputError) as raised:
        choose_gpus(inventory, leased, n)

    assert str(raised.value) == message
    assert raised.value.exit_code == 2


def test_leases_keep_concurrent_attempts_on_different_gpus(tmp_path, make_request):
    executor = LocalExecutor(tmp_path / "home", gpu_inventory=lambda: gpus(2))
    go = [tmp_path / f"go-{i}" for i in range(4)]
    first = make_request(python(PRINT_GPUS_THEN_WAIT, go[0]), gpus=1)
    second = make_request(python(PRINT_GPUS_THEN_WAIT, go[1]), gpus=1)

    sub1, sub2 = executor.submit(first), executor.submit(second)

    assert sub1.gpu_model == sub2.gpu_model == "NVIDIA Fake 80GB"
    assert sorted(sub1.gpu_ids + sub2.gpu_ids) == [0, 1]
    assert visible_devices(first) == str(sub1.gpu_ids[0])
    assert visible_devices(second) == str(sub2.gpu_ids[0])
    with pytest.raises(InputError, match=r"^--gpus 1: only 0 of 2 GPUs are free \(busy: 0, 1\)$"):
        executor.submit(make_request(python("pass"), gpus=1))

    go[0].touch()
    wait_ended(executor, sub1.handle)
    again = make_request(python(PRINT_GPUS_THEN_WAIT, go[2]), gpus=1)
    sub3 = executor.submit(again)

    assert sub3.gpu_ids == sub1.gpu_ids
    assert visible_devices(again) == str(sub1.gpu_ids[0])
    go[1].touch()
    go[2].touch()
    wait_ended(executor, sub2.handle)
    wait_ended(executor, sub3.handle)
    assert not [p for p in (tmp_path / "home" / "local" / "gpu-leases").iterdir() if p.name.isdigit()]


def test_lease_of_a_dead_holder_is_taken_over(tmp_path, make_request):
    executor = LocalExecutor(tmp_path / "home", gpu_inventory=lambda: gpus(1))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_create_time = process_create_time(dead.pid)
    dead.wait()
    leases = tmp_path / "home" / "local" / "gpu-leases"
    leases.mkdir(parents=True)
    (leases / "0").write_text(json.dumps({"pid": dead.pid, "create_time": dead_create_time}))

    sub = executor.submit(make_request(python("pass"), gpus=1))

    assert sub.gpu_ids == [0]
    wait_ended(executor, sub.handle)


def test_lease_of_a_live_holder_is_respected(tmp_path, make_request):
    executor = LocalExecutor(tmp_path / "home", gpu_inventory=lambda: gpus(1))
    leases = tmp_path / "home" / "local" / "gpu-leases"
    leases.mkdir(parents=True)
    me = {"pid": os.getpid(), "create_time": process_create_time(os.getpid())}
    (leases / "0").write_text(json.dumps(me))

    with pytest.raises(InputError, match=r"^--gpus 1: only 0 of 1 GPUs are free \(busy: 0\)$"):
        executor.submit(make_request(python("pass"), gpus=1))


def test_no_gpus_asked_on_a_gpu_machine_hides_them(tmp_path, make_request, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    executor = LocalExecutor(tmp_path / "home", gpu_inventory=lambda: gpus(2))
    go = tmp_path / "go"
    go.touch()
    request = make_request(python(PRINT_GPUS_THEN_WAIT, go))

    sub = executor.submit(request)

    assert sub.gpu_ids == [] and sub.gpu_model is None
    assert visible_devices(request) == ""
    wait_ended(executor, sub.handle)


def test_no_gpus_on_the_machine_leaves_the_variable_alone(tmp_path, make_request, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    executor = LocalExecutor(tmp_path / "home", gpu_inventory=lambda: [])
    go = tmp_path / "go"
    go.touch()
    request = make_request(python(PRINT_GPUS_THEN_WAIT, go))

    sub = executor.submit(request)

    assert visible_devices(request) == "7"
    wait_ended(executor, sub.handle)


def test_asking_for_gpus_on_a_machine_without_any_fails_before_starting(tmp_path, make_request):
    executor = LocalExecutor(tmp_path / "home", gpu_inventory=lambda: [])
    request = make_request(python("pass"), gpus=2)

    with pytest.raises(InputError, match=r"^--gpus 2: this machine has 0 GPUs$"):
        executor.submit(request)

    assert not (request.state_dir / "job.json").exists()
