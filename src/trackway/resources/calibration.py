"""Corrections learnt from reality: a run's measured GPU peak against the preflight's estimate, kept per model
family and precision, and applied to later estimates (which then say so).

The SDK records `torch.cuda.max_memory_allocated` and `max_memory_reserved` per device as
`cuda_memory` events (sdk/cuda_memory.py). Reserved memory is what the caching allocator held,
so it is what an OOM is measured against; neither counts the CUDA context, so the factor is
measured reserved / (estimate − context), and scales everything but the context.
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import Connection, insert, select

from trackway.ledger.reader import Reader
from trackway.ledger.schema import memory_calibrations
from trackway.resources import memory_peak
from trackway.resources.memory_peak import MeasuredPeak
from trackway.resources.memory_model import GIB
from trackway.resources.preflight import Correction


def measured_peak(conn: Connection, run_id: str, attempt_id: str | None = None) -> MeasuredPeak | None:
    """The run's highest measured GPU memory peak (or one attempt's); the query is `memory_peak.measured_peak`'s."""
    return memory_peak.measured_peak(Reader.over(conn), run_id, attempt_id)


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
