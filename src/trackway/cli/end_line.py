"""The one line every command prints when an attempt ends: its reason, how its process ended, and what comes next.

    r1/2 ended: oom (exit code 1); resume: smaller batch ... [oom: resume (1 of 2)]
    r1/1 ended: completed (exit code 0)

The decision is said only when it says something: `none` after a completion or a cancel repeats
the ending (`none: the run ended completed [completed: nothing to do]`).
"""

from __future__ import annotations

from typing import Any


def end_line(attempt_id: str, reason: str | None, decision: dict[str, Any] | None = None, *,
             exit_code: int | None = None, signal: int | None = None, process: bool = True,
             rule: str | None = None) -> str:
    """`RUN/N ended: REASON [RULE] (exit code 1); ACTION: MESSAGE [DECISION RULE]`."""
    from trackway.display import exit_text, signal_text

    line = f"{attempt_id} ended: {reason or 'not known'}"
    if rule:
        line += f" [{rule}]"
    if process:
        line += f" ({signal_text(signal) if signal is not None else exit_text(exit_code)})"
    decision = decision or {}
    action = decision.get("action") or "none"
    if action != "none":
        line += f"; {action}: {decision.get('message', '')}".rstrip(": ")
        if decision.get("rule"):
            line += f" [{decision['rule']}]"
    return line


def decision_of(end: Any) -> dict[str, Any]:
    """A supervisor's AttemptEnd decision as the dict a ledger row holds."""
    d = end.decision
    return {"action": d.action, "message": d.message, "rule": d.rule}
