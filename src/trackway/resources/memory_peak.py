"""The GPU memory peak a run measured: the SDK's `cuda_memory` events read back, through a plain reader."""

from __future__ import annotations

import json
from dataclasses import dataclass

from trackway.ledger.reader import Reader


@dataclass(frozen=True)
class MeasuredPeak:
    """The largest peak any device of any attempt of a run recorded."""

    reserved: int
    allocated: int
    device: str
    total: int | None
    attempt_id: str


def measured_peak(reader: Reader, run_id: str, attempt_id: str | None = None) -> MeasuredPeak | None:
    """The highest `max_memory_reserved` (with that device's allocated peak) of the run's attempts, or of one;
    None when none was recorded."""
    params = {"run_id": run_id}
    sql = ("SELECT attempt_events.attempt_id, attempt_events.payload FROM attempt_events"
           " JOIN attempts ON attempts.attempt_id = attempt_events.attempt_id"
           " WHERE attempts.run_id = :run_id AND attempt_events.kind = 'cuda_memory'")
    if attempt_id is not None:
        sql += " AND attempt_events.attempt_id = :attempt_id"
        params["attempt_id"] = attempt_id
    best: MeasuredPeak | None = None
    for row in reader.dicts(sql, params):
        for device in _devices(row["payload"]):
            if best is None or device["max_reserved_bytes"] > best.reserved:
                best = MeasuredPeak(int(device["max_reserved_bytes"]), int(device.get("max_allocated_bytes") or 0),
                                    str(device.get("name") or f"cuda:{device.get('device', '?')}"),
                                    device.get("total_bytes"), row["attempt_id"])
    return best


def _devices(payload: str | None) -> list[dict]:
    try:
        devices = json.loads(payload or "{}").get("devices") or []
    except (json.JSONDecodeError, AttributeError):
        return []
    return [d for d in devices if isinstance(d, dict) and isinstance(d.get("max_reserved_bytes"), (int, float))]
