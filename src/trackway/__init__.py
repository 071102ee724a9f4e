"""trackway: training runs that leave tracks. This module exports the SDK's names and the read API (`Api`).

The names are imported on first use (PEP 562), so that `trackway ...` on the command line and
`import trackway.something` pay nothing for the SDK they do not use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"

_EXPORTS = {
    "Api": "trackway.read_api",
    "BadData": "trackway.sdk.exceptions",
    "NonFiniteLoss": "trackway.sdk.exceptions",
    "SpoolPointsLost": "trackway.sdk.exceptions",
    "EXIT_PREEMPTED": "trackway.sdk.run",
    "Run": "trackway.sdk.run",
    "init": "trackway.sdk.run",
}

__all__ = ["Api", "BadData", "EXIT_PREEMPTED", "NonFiniteLoss", "Run", "SpoolPointsLost", "__version__", "init"]

if TYPE_CHECKING:
    from trackway.read_api import Api
    from trackway.sdk.exceptions import BadData, NonFiniteLoss, SpoolPointsLost
    from trackway.sdk.run import EXIT_PREEMPTED, Run, init


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'trackway' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
