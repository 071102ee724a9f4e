"""A watcher's window: a stretch of a series ending at its newest point, in steps or in wall time ("500 steps", "3h").

Parsed where trackway.toml is checked (settings/model.py) and where the trend tests read it
(supervisor/trends.py): one grammar, one refusal.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

_UNITS = {
    "step": ("steps", 1.0), "steps": ("steps", 1.0),
    "s": ("seconds", 1.0), "sec": ("seconds", 1.0), "secs": ("seconds", 1.0), "second": ("seconds", 1.0),
    "seconds": ("seconds", 1.0),
    "m": ("seconds", 60.0), "min": ("seconds", 60.0), "mins": ("seconds", 60.0), "minute": ("seconds", 60.0),
    "minutes": ("seconds", 60.0),
    "h": ("seconds", 3600.0), "hr": ("seconds", 3600.0), "hrs": ("seconds", 3600.0), "hour": ("seconds", 3600.0),
    "hours": ("seconds", 3600.0),
    "d": ("seconds", 86400.0), "day": ("seconds", 86400.0), "days": ("seconds", 86400.0),
}
_WINDOW = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]+)\s*$")
WINDOW_EXPECTED = 'a number of steps or a duration, such as "500 steps", "90s", "10m" or "3h"'


@dataclass(frozen=True)
class Window:
    """A stretch of a series ending at its newest point: `size` steps, or `size` seconds of wall time."""

    size: float
    unit: Literal["steps", "seconds"]

    @classmethod
    def parse(cls, text: str | int) -> Window:
        """`"500 steps"`, `"3h"`, `"90 s"`, `"10m"`, or a whole number of steps; ValueError says what was expected."""
        if isinstance(text, bool):
            raise ValueError(f"expected {WINDOW_EXPECTED}, found {text!r}")
        if isinstance(text, int):
            size, unit = float(text), "steps"
        else:
            match = _WINDOW.match(str(text))
            if match is None or match[2].lower() not in _UNITS:
                raise ValueError(f"expected {WINDOW_EXPECTED}, found {text!r}")
            unit, scale = _UNITS[match[2].lower()]
            size = float(match[1]) * scale
        if not size > 0 or not math.isfinite(size):
            raise ValueError(f"expected a window longer than 0, found {text!r}")
        return cls(size, unit)  # type: ignore[arg-type]

    def __str__(self) -> str:
        if self.unit == "steps":
            return f"{self.size:g} steps"
        for scale, name in ((86400, "d"), (3600, "h"), (60, "min")):
            if self.size >= scale and self.size % scale == 0:
                return f"{self.size / scale:g} {name}"
        return f"{self.size:g} s"


