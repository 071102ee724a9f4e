"""What trackway could and could not see of an attempt whose script does not use the SDK, in plain lines.

For `explain`: a script without `import trackway` sends no heartbeat, no termination note and no
checkpoint of its own; trackway sees only what the run declared at submit (log patterns, checkpoint
paths). Where each fact is stored:

- `runs.log_patterns`, `runs.checkpoint_paths`: JSON lists given at submit (or from trackway.toml);
- `metric_points` (via `metric_series`): the points the patterns read, `attempt_number` per point;
  `spool_cursors` row (attempt, `output.log`): how far the log was read;
- checkpoint storage: `step-N/MANIFEST.json` `extra.source == "checkpoint_path"` for the ones
  committed from a declared path (the ledger's `checkpoints` rows mirror them);
- `attempt_events` with rank -1 (the supervisor's): `nan_in_log`, `checkpoint_path_restored`
  ({checkpoint, restored, moved_aside}), `checkpoint_path_failed`, `log_metrics_failed`;
  SDK events have rank >= 0, so an attempt without any ran without the SDK (or died before init).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trackway.ledger.reader import Reader

SOURCE = "checkpoint_path"  # the manifest's extra.source for checkpoints committed from outside (outside_checkpoints.py)


def visibility(reader: Reader | Any, run: Mapping[str, Any], attempt: Mapping[str, Any]) -> list[str]:
    """Plain lines: what the attempt told trackway, and what trackway could not see.

    `reader`: a plain `Reader`, or a SQLAlchemy connection the same SQL runs through.
    """
    reader = Reader.of(reader)
    patterns = json.loads(run["log_patterns"]) if run["log_patterns"] else []
    paths = json.loads(run["checkpoint_paths"]) if run["checkpoint_paths"] else []
    mine = {"attempt_id": attempt["attempt_id"]}
    events = {
        row["kind"]: json.loads(row["payload"])
        for row in reader.dicts("SELECT kind, payload, rank FROM attempt_events WHERE attempt_id = :attempt_id"
                                " ORDER BY rank, seq", mine)
    }
    sdk = reader.scalar("SELECT count(*) FROM attempt_events WHERE attempt_id = :attempt_id AND rank >= 0", mine) > 0
    lines: list[str] = []
    if not sdk:
        lines.append(
            "no trackway SDK seen in this attempt: no heartbeat (a hang is not detected as stalled), "
            "no termination note (the reason comes from the exit status and the log)"
        )
    keys = [(row["key"], row["points"], row["first"], row["last"]) for row in reader.dicts(
        "SELECT metric_series.key, count(*) AS points, min(metric_points.step) AS first, max(metric_points.step) AS last"
        " FROM metric_series JOIN metric_points ON metric_points.series_id = metric_series.series_id"
        " WHERE metric_series.run_id = :run_id AND metric_points.attempt_number = :number"
        " GROUP BY metric_series.key ORDER BY metric_series.key",
        {"run_id": run["run_id"], "number": attempt["attempt_number"]})]
    points = sum(row[1] for row in keys)
    if patterns:
        what = ", ".join(f"{row[0]} (steps {row[2]}..{row[3]})" for row in keys) if keys else "none matched"
        lines.append(f"metrics from log patterns ({len(patterns)} pattern(s): {'; '.join(patterns)}): {points} point(s): {what}")
    elif not sdk:
        lines.append("metrics: none; the run has no --metric-pattern, so trackway read nothing from its output")
    if "nan_in_log" in events:
        lines.append(f"non-finite loss in the log: {events['nan_in_log'].get('message', '')}")
    if paths:
        outside = [row for row in _run_checkpoints(reader, run["run_id"]) if _is_outside(row["path"])]
        mine = [row for row in outside if row["attempt_id"] == attempt["attempt_id"]]
        newest = max(outside, key=lambda row: row["step"]) if outside else None
        lines.append(
            f"checkpoints from --checkpoint-path {', '.join(paths)}: {len(mine)} committed by this attempt, "
            f"{len(outside)} in the run" + (f" (newest {newest['name']})" if newest else "")
            + "; a checkpoint's step is the last step the log showed before the file was written"
        )
        restored = events.get("checkpoint_path_restored")
        if restored and restored.get("restored"):
            lines.append(f"restored before start: {restored.get('checkpoint')} → {', '.join(restored['restored'])}")
        elif restored and restored.get("moved_aside"):
            lines.append("started from the start: nothing was committed; left-over files moved aside: "
                         + ", ".join(restored["moved_aside"]))
        if "checkpoint_path_failed" in events:
            lines.append(f"a declared checkpoint could not be committed: {events['checkpoint_path_failed'].get('message', '')}")
    elif not sdk:
        lines.append(
            "checkpoints: none seen; the run has no --checkpoint-path, so files the script saves itself are "
            "invisible to trackway and a retry does not restore them"
        )
    if "log_metrics_failed" in events:
        lines.append(f"log patterns could not be read: {events['log_metrics_failed'].get('message', '')}")
    return lines


def _run_checkpoints(reader: Reader, run_id: str) -> list[dict]:
    return reader.dicts("SELECT step, name, path, attempt_id FROM checkpoints WHERE run_id = :run_id"
                        " AND committed_at IS NOT NULL", {"run_id": run_id})


def _is_outside(path: str) -> bool:
    try:
        manifest: Any = json.loads((Path(path) / "MANIFEST.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and (manifest.get("extra") or {}).get("source") == SOURCE

