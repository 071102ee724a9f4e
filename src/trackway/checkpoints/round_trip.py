"""A checkpoint read back from storage right after it committed, and compared with the state it was saved from.

A test run asks for this once (`TRACKWAY_RESTORE_CHECK=1`, set by `trackway experiment start`):
a week-long run should not learn on its first preemption that its checkpoint misses the
optimizer, holds a tensor that does not round-trip, or cannot be read. The comparison is exact
(`torch.equal` per tensor, `==` per plain value) over the model, optimizer, scheduler, scaler and
data state that were given to `save()`, while training waits, so nothing has moved since.
"""

from __future__ import annotations

import math
from typing import Any

from trackway.checkpoints.layout import CheckpointInfo
from trackway.checkpoints.store import CheckpointStore


def read_back(store: CheckpointStore, info: CheckpointInfo, filename: str, given: dict[str, Any]) -> dict[str, Any]:
    """{name, step, ok, compared, problem}: `info` verified on disk, loaded, and equal to `given`'s state."""
    import torch

    from trackway.checkpoints.torch_state import load_state

    said: dict[str, Any] = {"name": info.name, "step": info.step, "ok": False, "compared": 0, "problem": None}
    problems = store.verify(info)
    if problems:
        said["problem"] = f"the checkpoint does not verify: {'; '.join(problems[:3])}"
        return said
    try:
        state = load_state(info.path / filename)
    except Exception as exc:  # noqa: BLE001 - any failure to read it back is the finding
        said["problem"] = f"cannot be loaded: {type(exc).__name__}: {exc}"[:400]
        return said
    counter = [0]
    for key, obj in given.items():
        if obj is None:
            continue
        live = obj if key == "data_state" else obj.state_dict()
        if key not in state or state[key] is None:
            said["problem"] = f"holds no {key} state"
            return said
        where = _differs(live, state[key], key, counter, torch)
        if where is not None:
            said["problem"] = f"{where} read back differs from what was saved"
            return said
    said.update(ok=True, compared=counter[0])
    return said


def _differs(live: Any, saved: Any, path: str, counter: list[int], torch: Any) -> str | None:
    """The first path where `saved` is not `live`, or None."""
    if isinstance(live, torch.Tensor):
        counter[0] += 1
        if not isinstance(saved, torch.Tensor) or live.shape != saved.shape or live.dtype != saved.dtype:
            return path
        return None if torch.equal(live.detach().cpu(), saved.cpu()) else path
    if isinstance(live, dict):
        if not isinstance(saved, dict) or set(map(str, live)) != set(map(str, saved)):
            return path
        by_text = {str(k): v for k, v in saved.items()}
        for key, value in live.items():
            found = _differs(value, saved[key] if key in saved else by_text[str(key)], f"{path}.{key}", counter, torch)
            if found is not None:
                return found
        return None
    if isinstance(live, (list, tuple)):
        if not isinstance(saved, (list, tuple)) or len(live) != len(saved):
            return path
        for i, (a, b) in enumerate(zip(live, saved)):
            found = _differs(a, b, f"{path}[{i}]", counter, torch)
            if found is not None:
                return found
        return None
    counter[0] += 1
    if isinstance(live, float) and isinstance(saved, float) and math.isnan(live) and math.isnan(saved):
        return None
    return None if live == saved else path
