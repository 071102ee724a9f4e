"""The jobs trackway itself schedules on a resource (local, SSH), as its ledger knows them: running and waiting.

On these resources trackway is the only queue: nothing but its own attempts is "running" there in
its sense, and a run waits ("pending") only in its ledger, queued for a launch or a retry. Slurm's
counts come from Slurm (resources/availability.py), which also sees other people's jobs.
"""

from __future__ import annotations

from sqlalchemy import Connection, exists, func, select

from trackway.ledger.schema import attempts, runs
from trackway.taxonomy import AttemptState, RunState

OWN_QUEUE_EXECUTORS = ("local", "ssh")


def own_jobs(conn: Connection) -> dict[str, tuple[int, int]]:
    """{resource: (attempts not ended there, runs queued for it with no attempt under way)}."""
    running = dict(conn.execute(
        select(attempts.c.resource, func.count())
        .where(attempts.c.state != AttemptState.ENDED.value, attempts.c.resource.is_not(None))
        .group_by(attempts.c.resource)
    ).all())
    under_way = exists().where(attempts.c.run_id == runs.c.run_id, attempts.c.state != AttemptState.ENDED.value)
    pending = dict(conn.execute(
        select(runs.c.resource, func.count())
        .where(runs.c.state == RunState.QUEUED.value, runs.c.resource.is_not(None), ~under_way)
        .group_by(runs.c.resource)
    ).all())
    return {name: (running.get(name, 0), pending.get(name, 0)) for name in running.keys() | pending.keys()}
