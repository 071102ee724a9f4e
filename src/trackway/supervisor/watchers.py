"""Watchers over a running attempt: stalls (no heartbeat or no new step) and trends in what it logged.

Pure functions of what the spool says and the time; the control loop acts on what they return:
a stall and a non-finite loss in the log (`nan_in_log`) always end the attempt; any other kind
does when `[supervisor] stop_on` lists it.
"""

from __future__ import annotations

from typing import Any

STOP_MARKER = "supervisor-stop.json"  # written before the supervisor ends an attempt: {kind, why}
WATCHER_KINDS = (
    "stalled", "loss_rising", "plateau", "throughput_falling", "memory_growing", "gpu_underused", "nan_in_log",
)
# Kinds that end the attempt whatever `[supervisor] stop_on` says. `nan_in_log`: a log pattern
# (supervisor/log_metrics.py) read a NaN or infinite loss-named metric, which the SDK would have
# refused (NonFiniteLoss); classified `nan_loss`.
ALWAYS_STOP = ("stalled", "nan_in_log")


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


# -- trends over the metrics a run logged ------------------------------------------------------
# Each returns a one-line finding or None. The control loop records a finding as an event on the
# attempt, once per kind, and shows it in the live status.

def loss_rising(values: list[float], window: int = 50, tolerance: float = 0.10) -> str | None:
    """The mean loss of the last `window` points is more than `tolerance` above the window before."""
    if len(values) < 2 * window:
        return None
    before = sum(values[-2 * window : -window]) / window
    after = sum(values[-window:]) / window
    if before > 0 and after > before * (1 + tolerance):
        return f"loss rising: mean {after:.4g} over the last {window} steps vs {before:.4g} before (+{100 * (after / before - 1):.0f}%)"
    return None


def plateau(values: list[float], window: int = 200, tolerance: float = 0.002) -> str | None:
    """The loss moved less than `tolerance` (relative) between the last two windows."""
    if len(values) < 2 * window:
        return None
    before = sum(values[-2 * window : -window]) / window
    after = sum(values[-window:]) / window
    if before and abs(after - before) / abs(before) < tolerance:
        return f"plateau: mean loss {after:.4g} over the last {window} steps, within {100 * tolerance:.1f}% of the {window} before"
    return None


def throughput_falling(times: list[float], window: int = 50, ratio: float = 0.5) -> str | None:
    """Steps per second over the last `window` steps fell below `ratio` of the window before."""
    if len(times) < 2 * window + 1:
        return None
    before = window / max(1e-9, times[-window - 1] - times[-2 * window - 1])
    after = window / max(1e-9, times[-1] - times[-window - 1])
    if after < ratio * before:
        return f"throughput falling: {after:.2f} steps/s over the last {window} steps vs {before:.2f} before"
    return None


def memory_growing(first_rss: int | None, rss: int | None, factor: float = 2.0, floor_bytes: int = 1 << 30) -> str | None:
    """Host memory (RSS) grew by `factor` and by at least `floor_bytes` since the attempt's first heartbeat."""
    if not first_rss or not rss:
        return None
    if rss > factor * first_rss and rss - first_rss >= floor_bytes:
        return f"host memory growing: RSS {rss / 2**30:.1f} GiB, was {first_rss / 2**30:.1f} GiB at the first heartbeat"
    return None


def gpu_underused(utilizations: list[float], threshold: int = 20, source: str = "NVML") -> str | None:
    """Every GPU of the attempt is below `threshold` % utilization right now (read from `source`)."""
    if utilizations and max(utilizations) < threshold:
        shown = ", ".join(f"{u:g}%" for u in utilizations)
        return f"GPU utilization low: {shown} (threshold {threshold}%, from {source})"
    return None
