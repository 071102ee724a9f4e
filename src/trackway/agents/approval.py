"""A person's approval of an agent's run: `trackway approve RUN` starts it, `--refuse` ends it before anything ran.

A run that waits (its agent's `[agents.NAME] approve_full_runs` or `approve_over_gpu_hours`) is
recorded whole at submit, receipt and all, with `approval = "awaiting"` and no attempt: the
supervisor passes it over (supervisor/loop.py's orphaned_runs) and it holds its place in the
agent's cap and budget. Approving starts attempt 1 from the receipt as submitted, credited to the
person who approved; refusing ends the run `cancelled` with the person's reason, no compute spent.
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import update

from trackway.errors import InputError
from trackway.ledger import Ledger
from trackway.ledger.records import resolve_run
from trackway.ledger.schema import runs
from trackway.settings import Settings
from trackway.taxonomy import Approval, RunState

AWAITING, APPROVED, REFUSED = Approval.AWAITING.value, Approval.APPROVED.value, Approval.REFUSED.value


def _awaiting(conn, ref: str):
    run = resolve_run(conn, ref)
    if run["approval"] != AWAITING:
        said = {None: "it needed none", APPROVED: f"it was approved already ({run['approval_note']})",
                REFUSED: f"it was refused already ({run['approval_note']})"}.get(run["approval"], run["approval"])
        raise InputError(f"RUN {ref!r}: expected a run awaiting approval; {said}")
    return run


def approve(ledger: Ledger, settings: Settings, ref: str, by: str, executor_for) -> str | None:
    """Mark `ref` approved by `by` and start its first attempt (from its receipt); the attempt's id."""
    from trackway.supervisor.launch import start_attempt

    now = datetime.now(timezone.utc)
    with ledger.write() as conn:
        run = _awaiting(conn, ref)
        # Taken under the write lock, only while still awaiting: two people approving at once start it once.
        taken = conn.execute(update(runs).where(runs.c.run_id == run["run_id"], runs.c.approval == AWAITING).values(
            approval=APPROVED, approval_at=now,
            approval_note=f"approved by {by}; had waited for: {run['approval_note']}")).rowcount
    if not taken:
        raise InputError(f"RUN {ref!r}: expected a run awaiting approval; another person decided it meanwhile")
    return start_attempt(ledger, settings, run["run_id"], executor_for, first=True,
                         started_by=f"{by}, approving {run['submitted_by']}", code_from="receipt")


def refuse(ledger: Ledger, ref: str, by: str, why: str) -> str:
    """End `ref` cancelled, refused by `by` for `why`, before anything ran; its id."""
    if not why.strip():
        raise InputError("--why: expected the reason the run is refused, e.g. --why 'too costly for a guess'")
    now = datetime.now(timezone.utc)
    with ledger.write() as conn:
        run = _awaiting(conn, ref)
        conn.execute(update(runs).where(runs.c.run_id == run["run_id"], runs.c.approval == AWAITING).values(
            approval=REFUSED, approval_at=now, approval_note=f"refused by {by}: {why.strip()}",
            state=RunState.CANCELLED.value, ended_at=now))
    return run["run_id"]
