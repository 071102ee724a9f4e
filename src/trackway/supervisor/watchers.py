"""Watchers over a running attempt's spool: today, the stall check (no heartbeat or no new step).

Pure functions of what the spool says and the time; the control loop acts on what they return.
"""

from __future__ import annotations

from typing import Any

STALL_MARKER = "stalled.json"


def stall_evidence(heartbeat: dict[str, Any] | None, started_at: float, now: float, stall_seconds: float) -> str | None:
    """Why the attempt counts as stalled, or None. Scripts without the SDK write no heartbeat and are not judged."""
    if heartbeat is None or "t" not in heartbeat:
        return None
    beat = float(heartbeat["t"])
    if now - beat > stall_seconds:
        return f"no heartbeat for {now - beat:.0f} s (stall window {stall_seconds:g} s); last step {heartbeat.get('step')}"
    progress = heartbeat.get("progress_t")
    since = float(progress) if progress is not None else started_at
    if now - since > stall_seconds:
        return (
            f"heartbeat alive but no new step for {now - since:.0f} s (stall window {stall_seconds:g} s); "
            f"last step {heartbeat.get('step')}"
        )
    return None
