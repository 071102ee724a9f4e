"""PyTorch checkpoint content: round trip, reused host buffers, capture-time validation, safe loading."""

from __future__ import annotations

import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from trackway.checkpoints.layout import CheckpointError
from trackway.checkpoints.store import CheckpointStore
from trackway.checkpoints.torch_state import HostBuffers, capture, restore
from trackway.errors import InputError


def make_training(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(8, 2)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1)
    return model, optimizer, scheduler, scaler


def train_steps(model, optimizer, scheduler, scaler, steps: int) -> None:
    for _ in range(steps):
        x = torch.randn(16, 4)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()


def save(store: CheckpointStore, step: int, snapshot, metrics=None):
    pending = store.begin(step)
    snapshot.write(pending)
    return pending.commit(metrics=metrics)


def test_round_trip_restores_every_part_of_the_state(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    model, optimizer, scheduler, scaler = make_training()
    train_steps(model, optimizer, scheduler, scaler, 3)
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    cursor = {"epoch": 1, "index": 48, "order_seed": 7, "files": ["a.jsonl", "b.jsonl"]}
    snapshot = capture(model, optimizer, scheduler, scaler, data_state=cursor, extra={"tokens": 12345})
    info = save(store, 3, snapshot, metrics={"loss": 0.25})
    expected_draws = (random.random(), np.random.rand(), torch.rand(3))

    other_model, other_optimizer, other_scheduler, other_scaler = make_training(seed=99)
    random.seed(100)
    np.random.seed(100)
    torch.manual_seed(100)
    restored = restore(info, other_model, other_optimizer, other_scheduler, other_scaler)

    assert (restored.step, restored.data_state, restored.extra, restored.metrics) == (
        3,
        cursor,
        {"tokens": 12345},
        {"loss": 0.25},
    )
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, other_model.state_dict()[name]), name
    assert _flatten(optimizer.state_dict()) == _flatten(other_optimizer.state_dict())
    assert scheduler.state_dict() == other_scheduler.state_dict()
    assert other_scheduler.get_last_lr() == scheduler.get_last_lr()
    assert scaler.state_dict() == other_scaler.state_dict()
    assert other_scaler.get_scale() == scaler.get_scale() != 1024.0
    draws = (random.random(), np.random.rand(), torch.rand(3))
    assert draws[:2] == expected_draws[:2] and torch.equal(draws[2], expected_draws[2])


def test_training_continues_identically_after_restore(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    model, optimizer, scheduler, scaler = make_training()
    train_steps(model, optimizer, scheduler, scaler, 2)
    info = save(store, 2, capture(model, optimizer, scheduler, scaler))
    train_steps(model, optimizer, scheduler, scaler, 3)

    other = make_training(seed=5)
    restore(info, *other)
    train_steps(*other, 3)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, other[0].state_dict()[name]), name


def test_restore_by_path_and_without_rng(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    model, *_ = make_training()
    info = save(store, 5, capture(model, data_state={"i": 1}))
    torch.manual_seed(42)
    before = torch.get_rng_state()
    restored = restore(info.path, restore_rng=False)
    assert restored.step == 5 and restored.data_state == {"i": 1}
    assert torch.equal(torch.get_rng_state(), before)


def test_host_buffers_are_allocated_once_and_reused(tmp_path: Path) -> None:
    model, optimizer, scheduler, scaler = make_training()
    train_steps(model, optimizer, scheduler, scaler, 1)
    buffers = HostBuffers()
    first = capture(model, optimizer, buffers=buffers)
    pointers = {name: t.data_ptr() for name, t in first.state["model"].items()}
    count = len(buffers)
    train_steps(model, optimizer, scheduler, scaler, 1)
    second = capture(model, optimizer, buffers=buffers)

    assert {name: t.data_ptr() for name, t in second.state["model"].items()} == pointers
    assert len(buffers) == count
    assert first.nbytes == second.nbytes > 0
    for name, tensor in model.state_dict().items():
        # Copies, not aliases: the model moves on, the snapshot does not.
        assert torch.equal(second.state["model"][name], tensor)
        assert second.state["model"][name].data_ptr() != tensor.data_ptr()


def test_buffers_follow_shape_changes_and_drop_stale_ones() -> None:
    buffers = HostBuffers()
    capture(extra={"w": torch.zeros(4)}, buffers=buffers)
    capture(extra={"w": torch.zeros(8)}, buffers=buffers)
    shapes = [b.shape for b in buffers._buffers.values() if b.numel() in (4, 8)]
    assert shapes == [torch.Size([8])]


def test_tied_tensors_share_one_buffer() -> None:
    shared = torch.randn(3, 3)
    snapshot = capture(model={"embed": shared, "head": shared, "other": shared.clone()})
    assert snapshot.state["model"]["embed"] is snapshot.state["model"]["head"]
    assert snapshot.state["model"]["other"] is not snapshot.state["model"]["embed"]


def test_capture_inside_inference_mode_leaves_buffers_usable() -> None:
    buffers = HostBuffers()
    weights = {"w": torch.randn(5)}
    with torch.inference_mode():
        capture(model=weights, buffers=buffers)
    weights["w"].add_(1)
    snapshot = capture(model=weights, buffers=buffers)
    assert torch.equal(snapshot.state["model"]["w"], weights["w"])
    assert not snapshot.state["model"]["w"].is_inference()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"extra": {"fn": lambda: 0}},
            "checkpoint extra['fn']: a function cannot be stored; checkpoints hold tensors and plain values only",
        ),
        ({"data_state": {"files": ["a", object()]}}, "checkpoint data_state['files'][1]: a object object cannot"),
        ({"extra": {"mask": np.zeros(3)}}, "checkpoint extra['mask']: a numpy.ndarray object cannot be stored"),
        ({"extra": {(1, 2): 3}}, "checkpoint extra: a key of type tuple cannot be stored"),
        ({"extra": {"cls": ValueError}}, "checkpoint extra['cls']: a class (ValueError) cannot be stored"),
    ],
)
def test_capture_names_the_key_that_cannot_be_stored(kwargs: dict, message: str) -> None:
    with pytest.raises(InputError) as caught:
        capture(**kwargs)
    assert str(caught.value).startswith(message)


def test_numpy_scalars_become_python_numbers_and_arrays_get_a_hint() -> None:
    snapshot = capture(data_state={"index": np.int64(42), "temperature": np.float32(0.5)})
    assert snapshot.state["data_state"] == {"index": 42, "temperature": 0.5}
    assert type(snapshot.state["data_state"]["index"]) is int
    with pytest.raises(InputError, match=r"convert it with torch.from_numpy\(\)"):
        capture(data_state={"order": np.arange(3)})


def test_capture_refuses_a_container_that_contains_itself() -> None:
    loop: list = []
    loop.append(loop)
    with pytest.raises(InputError, match=r"checkpoint extra\[0\]: a container that contains itself"):
        capture(extra=loop)


def test_plain_values_survive_weights_only_loading(tmp_path: Path) -> None:
    extra = {
        "ints": [1, -(2**70), 2**130],
        "floats": (0.5, float("inf")),
        "flags": {"a": True, "b": None},
        "blob": b"\x00\x01",
        "shape": torch.Size([2, 3]),
        "dtype": torch.bfloat16,
        "device": torch.device("cpu"),
        7: "int keys are fine",
    }
    info = save(CheckpointStore(tmp_path), 1, capture(extra=extra))
    assert restore(info).extra == extra


class _Exploit:
    """What an attacker plants: unpickling it would run a shell command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


class _ExploitViaExec:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('owned')",))


@pytest.mark.parametrize("exploit", [_Exploit, _ExploitViaExec])
def test_a_planted_malicious_pickle_is_refused_and_never_runs(tmp_path: Path, exploit: type) -> None:
    marker = tmp_path / "side-effect"
    store = CheckpointStore(tmp_path / "ckpt")
    pending = store.begin(10)
    with pending.open("state.pt") as f:
        # A well-formed checkpoint file whose pickle carries the payload, committed with a
        # correct manifest and marker: only the loader stands between it and execution.
        torch.save({"format": "trackway.torch_state/1", "model": {"w": exploit(marker)}}, f, pickle_protocol=2)
    info = pending.commit()
    assert store.latest_committed().step == 10

    with pytest.raises(CheckpointError) as caught:
        restore(info, model=torch.nn.Linear(1, 1))
    message = str(caught.value)
    assert "refused to load" in message and "weights_only=True" in message and "never run code" in message
    assert "system" in message or "exec" in message
    assert not marker.exists()


def test_a_raw_pickle_file_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "side-effect"
    store = CheckpointStore(tmp_path / "ckpt")
    pending = store.begin(1)
    with pending.open("state.pt") as f:
        f.write(pickle.dumps(_Exploit(marker), protocol=2))
    info = pending.commit()
    with pytest.raises(CheckpointError, match="refused to load"):
        restore(info)
    assert not marker.exists()


def test_restore_refuses_an_uncommitted_directory(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    pending = store.begin(3)
    capture(extra={"a": 1}).write(pending)
    with pytest.raises(CheckpointError, match="is not a checkpoint directory"):
        restore(pending.path)
    # A writer that died between the rename and the marker leaves a step directory without one.
    step_dir = pending.path.rename(tmp_path / "step-00000003")
    with pytest.raises(CheckpointError, match="is writing, not committed; only committed checkpoints are read"):
        restore(step_dir)


def test_restore_into_a_model_of_another_shape_says_so(tmp_path: Path) -> None:
    info = save(CheckpointStore(tmp_path), 1, capture(torch.nn.Linear(4, 4)))
    with pytest.raises(CheckpointError, match="the model state does not fit the model given"):
        restore(info, model=torch.nn.Linear(4, 5))
    with pytest.raises(CheckpointError, match="holds no optimizer state"):
        restore(info, optimizer=torch.optim.SGD(torch.nn.Linear(4, 4).parameters(), lr=0.1))


def _flatten(value):
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, tuple(value.shape), value.tolist())
    if isinstance(value, dict):
        return {k: _flatten(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_flatten(v) for v in value]
    return value


def test_capture_copies_every_kind_of_cpu_tensor_by_value() -> None:
    base = torch.randn(6, 5, dtype=torch.complex64)
    with torch.inference_mode():
        made_in_inference = torch.arange(4.0)
    tensors = {
        "plain": torch.randn(64, 33),
        "bf16": torch.randn(7, 3).to(torch.bfloat16),
        "ints": torch.arange(10, dtype=torch.int64),
        "bools": torch.tensor([True, False, True]),
        "empty": torch.zeros(0, 3),
        "scalar": torch.tensor(2.5),
        "transposed": torch.randn(5, 9).t(),  # not contiguous
        "sliced": torch.randn(20)[3:17:2],  # an offset and a stride
        "conjugate": base.conj(),  # a conjugate view: its bytes are not its value
        "negative": base.conj().imag,  # a negative view
        "inference": made_in_inference,
        "parameter": torch.nn.Parameter(torch.randn(3)),
    }
    expected = {name: t.detach().resolve_conj().resolve_neg().clone() for name, t in tensors.items()}
    buffers = HostBuffers()
    capture(model=tensors, buffers=buffers)  # the second capture copies into the buffers the first allocated
    snapshot = capture(model=tensors, buffers=buffers)
    for name, want in expected.items():
        got = snapshot.state["model"][name]
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want), name
        if want.numel():
            assert got.untyped_storage().data_ptr() != tensors[name].untyped_storage().data_ptr(), name
    tensors["plain"].add_(1)  # the training goes on: the snapshot keeps what it copied
    assert torch.equal(snapshot.state["model"]["plain"], expected["plain"])


def test_the_tensor_records_a_restore_reads_into_their_own_storages_are_found_without_a_seek(tmp_path: Path) -> None:
    """The record offsets taken from the zip's central directory alone are where each record's bytes start.

    Were torch.save to pad its local headers otherwise, every tensor would still load, but copied
    once more: this says so before a restore gets slower unnoticed.
    """
    import struct
    import zipfile

    from trackway.checkpoints.manager import CheckpointManager
    from trackway.checkpoints.torch_state import _zip_records

    model = torch.nn.Sequential(*[torch.nn.Linear(256 + i, 300) for i in range(4)])
    with CheckpointManager(tmp_path, async_save=False) as manager:
        manager.save(1, model=model, optimizer=torch.optim.Adam(model.parameters()))
    state = tmp_path / "step-00000001" / "state.pt"
    found = []
    with open(state, "rb") as f, zipfile.ZipFile(f) as archive:
        for entry in archive.infolist():
            f.seek(entry.header_offset)
            name_length, extra_length = struct.unpack("<HH", f.read(30)[26:30])
            found.append((entry.header_offset + 30 + name_length + extra_length, entry.file_size))
    hinted = _zip_records(state)
    assert len(hinted) == 4 and set(hinted) <= set(found)
