"""What every integration shares: one run per process, and moving a framework's directory in place."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

_RUN: Any = None


def current_run(run: Any = None, **init_kwargs: Any) -> Any:
    """The run this process reports to: the one given, else one `trackway.init()` shared by all integrations."""
    global _RUN
    if run is not None:
        _RUN = run
        return run
    if _RUN is None:
        from trackway.sdk.run import init

        _RUN = init(**init_kwargs)
    return _RUN


def adopt_into(source: Path, target: Path) -> None:
    """Move every entry of `source` into `target` (renames: the files are stored once), then drop `source`."""
    target.mkdir(parents=True, exist_ok=True)
    for entry in sorted(source.iterdir()):
        dest = target / entry.name
        try:
            os.replace(entry, dest)
        except OSError:  # another filesystem: move (copy then delete), still one copy in the end
            shutil.move(str(entry), str(dest))
    source.rmdir()


def numeric(metrics: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if hasattr(value, "item"):
            try:
                value = value.item()
            except (ValueError, RuntimeError):
                continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        out[key] = float(value)
    return out
