"""The safetensors payload: it comes back whole through the public loader; torn or foreign files are refused."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
from blake3 import blake3
import torch
from safetensors.torch import load_file

import trackway.checkpoints
from trackway.checkpoints.layout import MANIFEST, CheckpointError, CheckpointState
from trackway.checkpoints.manager import CheckpointManager, shard_name
from trackway.checkpoints.safetensors_state import layout, part_file
from trackway.checkpoints.store import CheckpointStore
from trackway.checkpoints.torch_state import FORMAT, capture
from trackway.errors import InputError, TrackwayError

SRC = Path(__file__).resolve().parents[2] / "src"


def training(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(), torch.nn.Linear(32, 3)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    for _ in range(3):
        model(torch.randn(8, 6)).pow(2).mean().backward()
        optimizer.step()
        scheduler.step()
    return model, optimizer, scheduler


EXTRA = {
    "bytes": b"\x00\xff", "nan": float("nan"), "inf": float("-inf"), "set": {3, "a"}, "complex": 1 - 2j,
    "dtype": torch.bfloat16, "device": torch.device("cpu"), "size": torch.Size([2, 3]), "tuple": (1, (2.5, None)),
    "int keys": {7: "seven", 1.5: True, None: [1, 2]}, "$dict": {"$tuple": "not a tag"},
    "tensors": [torch.arange(5, dtype=torch.int16), torch.zeros(0), torch.tensor(3.5, dtype=torch.float64),
                torch.ones(2, 2, dtype=torch.bfloat16), torch.tensor([True, False])],
}


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, float) and a != a:
        return isinstance(b, float) and b != b
    if isinstance(a, dict):
        return type(a) is type(b) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("blocking", [True, False], ids=["sync", "async"])
def test_a_save_comes_back_whole_through_the_public_load(tmp_path: Path, blocking: bool) -> None:
    model, optimizer, scheduler = training()
    cursor = {"epoch": 2, "order": (3, 1, 2), 5: "five"}
    with CheckpointManager(tmp_path, format="safetensors") as manager:
        manager.save(4, model=model, optimizer=optimizer, scheduler=scheduler, data_state=cursor, extra=EXTRA,
                     blocking=blocking)
    info = CheckpointStore(tmp_path).latest_committed()
    assert sorted(info.manifest["files"]) == ["state.safetensors"]

    state = trackway.checkpoints.load(info.path)
    assert state["format"] == FORMAT and state["scaler"] is None
    assert same(state["model"], model.state_dict()) and state["model"]._metadata == model.state_dict()._metadata
    assert same(state["optimizer"], optimizer.state_dict())
    assert same(state["scheduler"], scheduler.state_dict())
    assert same(state["data_state"], cursor) and same(state["extra"], EXTRA)
    assert set(state["rng"]) >= {"python", "torch", "numpy"}
    assert same(trackway.checkpoints.load(info.path / "state.safetensors"), state)

    # Any safetensors reader takes the tensors, by where they sit in the state.
    flat = load_file(info.path / "state.safetensors")
    assert torch.equal(flat["model/0.weight"], model[0].weight) and "optimizer/state/0/exp_avg" in flat


def test_restore_puts_model_optimizer_scheduler_and_rng_back(tmp_path: Path) -> None:
    model, optimizer, scheduler = training()
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    with CheckpointManager(tmp_path, format="safetensors") as manager:
        manager.save(3, model=model, optimizer=optimizer, scheduler=scheduler, data_state={"i": 9})
    draws = (random.random(), np.random.rand(), torch.rand(3))

    other, other_optimizer, other_scheduler = training(seed=99)
    random.seed(100)
    restored = CheckpointManager(tmp_path).restore_latest(model=other, optimizer=other_optimizer,
                                                          scheduler=other_scheduler)
    assert restored.step == 3 and restored.data_state == {"i": 9}
    assert (random.random(), np.random.rand()) == draws[:2] and torch.equal(torch.rand(3), draws[2])
    assert same(other.state_dict(), model.state_dict())
    assert same(other_optimizer.state_dict(), optimizer.state_dict())
    assert other_scheduler.state_dict() == scheduler.state_dict()


def test_tied_weights_are_stored_once_and_come_back_tied(tmp_path: Path) -> None:
    shared = torch.randn(4, 4)
    snapshot = capture(model={"embed": shared, "head": shared, "other": shared.clone()}, format="safetensors")
    names = [n for part in snapshot.layout.parts for n in part.names]
    assert names.count("model/embed") == 1 and "model/head" not in names
    pending = CheckpointStore(tmp_path).begin(1)
    snapshot.write(pending)
    pending.commit()
    state = trackway.checkpoints.load(tmp_path / "step-00000001")
    assert state["model"]["embed"] is state["model"]["head"]
    assert state["model"]["other"] is not state["model"]["embed"] and torch.equal(state["model"]["other"], shared)


def test_a_large_state_is_split_in_parts_hashed_side_by_side(tmp_path: Path) -> None:
    weights = OrderedDict((f"w{i}", torch.randn(256, 256 + i)) for i in range(7))
    snapshot = capture(model=weights, format="safetensors")
    snapshot.layout = layout(snapshot.state, FORMAT, parts=3)
    pending = CheckpointStore(tmp_path).begin(1)
    snapshot.write(pending)
    info = pending.commit()
    files = ["state.safetensors", "state-1.safetensors", "state-2.safetensors"]
    assert files == [part_file("state.safetensors", k) for k in range(3)]
    assert sorted(info.manifest["files"]) == sorted(files)
    sizes = [info.manifest["files"][f]["size"] for f in files]
    assert max(sizes) < 2 * min(sizes)  # dealt out by bytes
    for name in files:  # each part is a safetensors file of its own, and its digest is the file's
        data = (info.path / name).read_bytes()
        assert info.manifest["files"][name]["sha256"] == hashlib.sha256(data).hexdigest()
        load_file(info.path / name)
    assert same(trackway.checkpoints.load(info.path)["model"], weights)
    with pytest.raises(CheckpointError, match="is part 1 of a checkpoint; load its part 0, state.safetensors"):
        trackway.checkpoints.load(info.path / "state-1.safetensors")


def test_the_manifest_digest_is_the_files_for_both_payloads(tmp_path: Path) -> None:
    model, optimizer, _ = training()
    for format in ("torch", "safetensors"):
        with CheckpointManager(tmp_path / format, format=format) as manager:
            manager.save(1, model=model, optimizer=optimizer, blocking=True)
        info = CheckpointStore(tmp_path / format).latest_committed()
        manifest = json.loads((info.path / MANIFEST).read_bytes())
        for name, entry in manifest["files"].items():
            data = (info.path / name).read_bytes()
            digests = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            if format == "torch":  # one file a restore reads whole: it is checked by its blake3 (digests.py)
                digests["blake3"] = blake3(data).hexdigest()
            assert entry == digests, (format, name)
    # The torch payload is torch.save's zip (its CRC-32s left out): torch.load reads it as it is.
    state = torch.load(tmp_path / "torch" / "step-00000001" / "state.pt", weights_only=True)
    assert same(state["model"], model.state_dict())


def test_a_torn_file_is_refused_and_the_resume_falls_back(tmp_path: Path) -> None:
    model, optimizer, _ = training()
    with CheckpointManager(tmp_path, format="safetensors") as manager:
        manager.save(1, model=model, optimizer=optimizer)
        model[0].weight.data += 1
        manager.save(2, model=model, optimizer=optimizer)
    newest = tmp_path / "step-00000002" / "state.safetensors"
    with open(newest, "r+b") as f:  # torn: the tail never reached the disk
        f.truncate(newest.stat().st_size // 2)
    with pytest.raises(TrackwayError, match="does not match its manifest"):
        trackway.checkpoints.load(tmp_path / "step-00000002")

    restored_into = training(seed=5)[0]
    heard = []
    restored = CheckpointManager(tmp_path, on_restore=heard.append).restore_latest(model=restored_into)
    assert restored.step == 1 and heard[0]["fallback_from"][0]["name"] == "step-00000002"
    assert "state.safetensors" in heard[0]["fallback_from"][0]["reason"]
    assert not torch.equal(restored_into[0].weight, model[0].weight)


def test_a_writer_killed_mid_write_leaves_nothing_that_loads(tmp_path: Path) -> None:
    code = (
        "import torch\n"
        "from trackway.checkpoints.manager import CheckpointManager\n"
        f"m = CheckpointManager({str(tmp_path)!r}, format='safetensors', async_save=False)\n"
        "m.save(1, model={'w': torch.zeros(1000)})\n"
        "m.save(2, model={'w': torch.ones(3 << 20)})\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC), "TRACKWAY_CHECKPOINT_CRASH_AT": "mid_write@2"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == -signal.SIGKILL, result.stderr
    store = CheckpointStore(tmp_path)
    assert [i.step for i in store.list() if i.state is CheckpointState.COMMITTED] == [1]
    state = trackway.checkpoints.load(store.latest_committed().path)
    assert torch.equal(state["model"]["w"], torch.zeros(1000))


def test_a_safetensors_file_of_another_origin_is_not_loaded(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    pending = CheckpointStore(tmp_path).begin(1)
    save_file({"w": torch.ones(2)}, pending.path / "state.safetensors", metadata={"format": "pt"})
    info = pending.commit()
    with pytest.raises(CheckpointError, match="not a trackway PyTorch checkpoint"):
        trackway.checkpoints.load(info.path)


def test_what_safetensors_cannot_hold_is_refused_at_capture_naming_the_key() -> None:
    with pytest.raises(InputError, match=r"checkpoint extra/sparse: a torch.sparse_coo tensor .* format='torch'"):
        capture(extra={"sparse": torch.eye(3).to_sparse()}, format="safetensors")
    with pytest.raises(InputError, match=r"checkpoint model/w: a torch.complex128 tensor"):
        capture(model={"w": torch.zeros(2, dtype=torch.complex128)}, format="safetensors")



def test_the_torch_payload_still_holds_what_safetensors_cannot(tmp_path: Path) -> None:
    extra = {
        "sparse": torch.eye(3).to_sparse(), "wide": torch.ones(2, dtype=torch.complex128), "big": torch.ones(1 << 18)
    }
    with CheckpointManager(tmp_path) as manager:
        manager.save(1, extra=extra)
    state = trackway.checkpoints.load(tmp_path / "step-00000001")
    assert torch.equal(state["extra"]["sparse"].to_dense(), torch.eye(3))
    assert torch.equal(state["extra"]["wide"], extra["wide"]) and torch.equal(state["extra"]["big"], extra["big"])


def test_the_format_is_checked_and_can_change_per_save(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="checkpoint format must be one of 'torch', 'safetensors', got 'pickle'"):
        CheckpointManager(tmp_path, format="pickle")
    manager = CheckpointManager(tmp_path)
    with pytest.raises(InputError, match="got 'npz'"):
        manager.save(1, model={"w": torch.ones(1)}, format="npz")
    manager.save(1, model={"w": torch.ones(1)})
    manager.save(2, model={"w": torch.ones(1) * 2}, format="safetensors")
    manager.close()
    store = CheckpointStore(tmp_path)
    assert [sorted(i.manifest["files"]) for i in store.list()] == [["state.pt"], ["state.safetensors"]]
    assert trackway.checkpoints.load(store.get(1).path)["model"]["w"].item() == 1
    assert CheckpointManager(tmp_path).restore_latest().step == 2
    assert [shard_name(r, "safetensors") for r in (0, 3)] == ["state.safetensors", "rank-00003.safetensors"]
