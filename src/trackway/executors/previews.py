"""How a preview (`Executor.preview`, `trackway submit --dry-run`) words the parts every executor shares.

The environment is said by names, with values only for what trackway sets itself (TRACKWAY_*, the
GPU variables, the rendezvous): the submitter's own values are long, and some are secrets.
"""

from __future__ import annotations

from collections.abc import Mapping

from trackway.executors.base import LaunchRequest
from trackway.redaction import redact

# Set by trackway or the executor for the attempt: shown with their values.
_SHOWN_PREFIXES = ("TRACKWAY_", "CUDA_", "MASTER_", "NODE_RANK", "NNODES", "WORLD_SIZE", "RANK")


def shown(name: str) -> bool:
    return name.startswith(_SHOWN_PREFIXES)


def environment_lines(env: Mapping[str, str], request: LaunchRequest, added_to: str) -> list[str]:
    """`environment:` lines: the run's variables by name, trackway's own with their values (secrets masked)."""
    others = sorted(name for name in env if not shown(name))
    how = "the whole environment (the run's, as submitted)" if request.env_is_complete else f"added to {added_to}"
    lines = [f"environment: {how}; {len(others)} variable(s) of the run by name: {' '.join(others) or 'none'}"]
    lines += [f"  {name}={redact(env[name])}" for name in sorted(env) if shown(name)]
    return lines


def limit_line(time_limit_s: float | None, grace_s: float) -> str:
    if time_limit_s is None:
        return f"time limit: none (a stop is SIGTERM, then SIGKILL after the {grace_s:g} s grace)"
    return f"time limit: {time_limit_s:g} s, then SIGTERM and SIGKILL after the {grace_s:g} s grace"
