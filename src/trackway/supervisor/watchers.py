"""Watchers over a running attempt: stalls (no heartbeat or no new step), ranks left behind, trends in what it logged.

Pure functions of what the spool says and the time; the control loop acts on what they return:
a stall and a non-finite loss in the log (`nan_in_log`) always end the attempt; any other kind
does when `[supervisor] stop_on` lists it.
"""

from __future__ import annotations

from typing import Any

from trackway.settings.windows import Window
from trackway.supervisor.trends import Points, plateau, rising, slower

STOP_MARKER = "supervisor-stop.json"  # written before the supervisor ends an attempt: {kind, why}
WATCHER_KINDS = (
    "stalled", "loss_rising", "plateau", "throughput_falling", "memory_growing", "gpu_underused", "nan_in_log",
    "rank_stalled",
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


# -- ranks ------------------------------------------------------------------------------------------
# Every rank's SDK writes its own heartbeat (spool/heartbeat.json for rank 0, heartbeat-r<N>.json for the
# others) with the step it last logged and when that step moved (`progress_t`). A rank stuck in a
# collective or a data loader keeps beating (the heartbeat is a thread), so ranks are compared by their
# steps and the time each last moved, never by their heartbeats alone.


def rank_stalled(beats: dict[int, dict[str, Any]], now: float, window: float) -> str | None:
    """A rank whose step has not moved for `window` seconds while another rank stepped since: named, or None.

    Ranks that never logged a step, and ranks whose process finished (`closed`), are not judged. Under
    DDP every rank waits on the others each step, so a hung rank soon holds them all: then no rank
    stepped since and this says nothing; the stall, when it comes, names the rank behind (`rank_positions`).
    """
    moving = _stepping(beats)
    if len(moving) < 2:
        return None
    newest = max(at for _, at in moving.values())
    behind = sorted(r for r, (_, at) in moving.items() if now - at > window and newest - at > window)
    if not behind:
        return None
    rank = behind[0]
    step, at = moving[rank]
    lead = max((r for r in moving if r not in behind), key=lambda r: (moving[r][0], -r))
    beat = _number(beats[rank].get("t"))
    silent = f"; its heartbeat stopped too, {_ago(now - beat)} ago" if beat is not None and now - beat > window else ""
    others = f" (and rank(s) {', '.join(map(str, behind[1:]))})" if len(behind) > 1 else ""
    return (f"rank {rank}{others} stopped stepping: last stepped at step {step} ({_ago(now - at)} ago) while rank "
            f"{lead} is at {moving[lead][0]} (stepped {_ago(now - moving[lead][1])} ago){silent}")


def rank_positions(beats: dict[int, dict[str, Any]], now: float) -> str | None:
    """Where each rank got to, naming the ranks behind the others: what a stall's evidence adds. None for one rank."""
    if len(beats) < 2:
        return None
    moving = _stepping(beats)
    silent = sorted(r for r in beats if r not in moving and not beats[r].get("closed"))
    said = []
    if moving:
        low = min(step for step, _ in moving.values())
        behind = sorted(r for r, (step, _) in moving.items() if step == low)
        ahead = sorted((r for r in moving if r not in behind), key=lambda r: r)
        oldest = min(moving[r][1] for r in behind)
        if ahead:
            steps = sorted({moving[r][0] for r in ahead})
            where = f"is at {steps[0]}" if len(ahead) == 1 else (
                f"are at {steps[0]}" if len(steps) == 1 else f"are at steps {steps[0]}..{steps[-1]}")
            said.append(f"{_ranks(behind)} last stepped at step {low} ({_ago(now - oldest)} ago) while "
                        f"{_ranks(ahead)} {where}")
        else:
            said.append(f"every rank that logged ({', '.join(map(str, behind))}) last stepped at step {low} "
                        f"({_ago(now - oldest)} ago)")
    if silent:
        said.append(f"{_ranks(silent)} logged no step")
    stopped = sorted(r for r, beat in beats.items() if not beat.get("closed") and (at := _number(beat.get("t"))) is not None
                     and now - at > HEARTBEAT_SILENCE_S)
    for rank in stopped:
        said.append(f"rank {rank}'s heartbeat stopped {_ago(now - _number(beats[rank]['t']))} ago")
    return "; ".join(said) or None


# A rank whose heartbeat file is older than this has stopped beating (the SDK beats every 5 s).
HEARTBEAT_SILENCE_S = 60.0


def _stepping(beats: dict[int, dict[str, Any]]) -> dict[int, tuple[int, float]]:
    """(last step, when it moved) of each rank that logged a step and is not finished."""
    moving = {}
    for rank, beat in beats.items():
        step, at = beat.get("step"), _number(beat.get("progress_t"))
        if isinstance(step, int) and not isinstance(step, bool) and at is not None and not beat.get("closed"):
            moving[rank] = (step, at)
    return moving


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


# -- trends over the metrics a run logged ------------------------------------------------------
# Each returns a one-line finding or None. The control loop records a finding as an event on the
# attempt, once per kind, and shows it in the live status.

# The loss trends' windows and thresholds: `[watchers.KIND]` in trackway.toml (settings/model.py holds the
# defaults); the tests themselves are supervisor/trends.py's.
TREND_DEFAULTS: dict[str, dict[str, Any]] = {
    "loss_rising": {"window": "500 steps", "min_rise": 0.10, "min_z": 8.0},
    "plateau": {"window": "2000 steps", "min_improvement": 0.01},
    "throughput_falling": {"window": "500 steps", "ratio": 0.5},
}


def loss_trends(points: Points, settings: dict[str, dict[str, Any]] | None = None) -> list[tuple[str, str]]:
    """(kind, finding) for each trend watcher the loss series sets off: rising, flat, or slower in steps per second."""
    rule = {kind: {**defaults, **((settings or {}).get(kind) or {})} for kind, defaults in TREND_DEFAULTS.items()}
    found = []
    up = rule["loss_rising"]
    if (rise := rising(points, Window.parse(up["window"]), up["min_rise"], up["min_z"])) is not None:
        found.append(("loss_rising", f"{rise}; rule: at least +{100 * up['min_rise']:g}% and {up['min_z']:g}× the noise"))
    flat = rule["plateau"]
    if (level := plateau(points, Window.parse(flat["window"]), flat["min_improvement"])) is not None:
        found.append(("plateau", str(level)))
    pace = rule["throughput_falling"]
    if (slow := slower(points, Window.parse(pace["window"]), pace["ratio"])) is not None:
        found.append(("throughput_falling", str(slow)))
    return found


def memory_growing(first_rss: int | None, rss: int | None, factor: float = 2.0, floor_bytes: int = 1 << 30) -> str | None:
    """Host memory (RSS) grew by `factor` and by at least `floor_bytes` since the first RSS the supervisor saw."""
    if not first_rss or not rss:
        return None
    if rss > factor * first_rss and rss - first_rss >= floor_bytes:
        return (f"host memory growing: RSS {rss / 2**30:.2f} GiB, was {first_rss / 2**30:.2f} GiB at the first reading "
                f"once training stepped; rule: ×{factor:g} and +{floor_bytes / 2**30:g} GiB")
    return None


GPU_UNDERUSED_DEFAULTS = {"threshold": 70.0, "duration": "10m"}


def gpu_underused(utilizations: list[float], threshold: float = 70, source: str = "NVML",
                  low_for: float | None = None, duration: float = 0.0) -> str | None:
    """Every GPU of the attempt below `threshold` % in every reading for `duration` seconds (`low_for`: how long
    they have been; None: this reading alone)."""
    if not utilizations or max(utilizations) >= threshold:
        return None
    if low_for is not None and low_for < duration:
        return None
    shown = ", ".join(f"{u:g}%" for u in utilizations)
    lasted = f" for {_ago(low_for)}" if low_for is not None else ""
    rule = f"{duration / 60:g} min" if duration >= 120 else f"{duration:g} s"
    return f"GPU utilization low{lasted}: {shown} now (from {source}); rule: below {threshold:g}% for {rule}"
