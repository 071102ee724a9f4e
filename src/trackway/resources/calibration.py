"""Corrections learnt from reality: a run's measured GPU peak against the preflight's estimate, kept per model
family and precision, and applied to later estimates (which then say so).

The SDK records `torch.cuda.max_memory_allocated` and `max_memory_reserved` per device as
`cuda_memory` events (sdk/cuda_memory.py). Reserved memory is what the caching allocator held,
so it is what an OOM is measured against; neither counts the CUDA context, so the factor is
measured reserved / (estimate − context), and scales everything but the context.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import Connection, insert, select

from trackway.ledger.schema import attempt_events, attempts, memory_calibrations
from trackway.resources.memory_model import GIB
from trackway.resources.preflight import Correction


@dataclass(frozen=True)
class MeasuredPeak:
    """The largest peak any device of any attempt of a run recorded."""

    reserved: int
    allocated: int
    device: str
    total: int | None
    attempt_id: str


def measured_peak(conn: Connection, run_id: str, attempt_id: str | None = None) -> MeasuredPeak | None:
    """The highest `max_memory_reserved` (with that device's allocated peak) of the run's attempts, or of one;
    None when none was recorded."""
    query = (
        select(attempt_events.c.attempt_id, attempt_events.c.payload)
        .join(attempts, attempts.c.attempt_id == attempt_events.c.attempt_id)
        .where(attempts.c.run_id == run_id, attempt_events.c.kind == "cuda_memory")
    )
    if attempt_id is not None:
        query = query.where(attempt_events.c.attempt_id == attempt_id)
    rows = conn.execute(query).all()
    best: MeasuredPeak | None = None
    for attempt_id, payload in rows:
        for device in _devices(payload):
            if best is None or device["max_reserved_bytes"] > best.reserved:
                best = MeasuredPeak(int(device["max_reserved_bytes"]), int(device.get("max_allocated_bytes") or 0),
                                    str(device.get("name") or f"cuda:{device.get('device', '?')}"),
                                    device.get("total_bytes"), attempt_id)
    return best


def _devices(payload: str | None) -> list[dict]:
    try:
        devices = json.loads(payload or "{}").get("devices") or []
    except (json.JSONDecodeError, AttributeError):
        return []
    return [d for d in devices if isinstance(d, dict) and isinstance(d.get("max_reserved_bytes"), (int, float))]


def correction_for(conn: Connection, model_family: str | None, precision: str) -> Correction | None:
    """The newest correction kept for the family and precision, or None."""
    if not model_family:
        return None
    row = conn.execute(
        select(memory_calibrations)
        .where(memory_calibrations.c.model_family == model_family, memory_calibrations.c.precision == precision)
        .order_by(memory_calibrations.c.calibration_id.desc())
        .limit(1)
    ).mappings().first()
    if row is None:
        return None
    return Correction(row["factor"], f"calibrated ×{row['factor']:.3f} on run {row['run_id']} "
                                     f"({model_family}, {precision}): measured {row['measured_reserved_bytes'] / GIB:.2f} "
                                     f"GiB reserved vs {row['estimated_bytes'] / GIB:.2f} GiB estimated")


def record_calibration(
    conn: Connection, model_family: str, precision: str, run_id: str, estimated_bytes: float, peak: MeasuredPeak,
    row_length: int | None,
) -> float:
    """Keep the factor measured/estimated for later estimates of the family and precision; return it."""
    factor = peak.reserved / estimated_bytes
    conn.execute(insert(memory_calibrations).values(
        model_family=model_family, precision=precision, factor=factor, run_id=run_id,
        estimated_bytes=estimated_bytes, measured_allocated_bytes=peak.allocated,
        measured_reserved_bytes=peak.reserved, row_length=row_length, created_at=datetime.now(timezone.utc),
    ))
    return factor
