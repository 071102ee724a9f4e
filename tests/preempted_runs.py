"""Two runs of one training command under a real supervisor: a reference, and one that gets a SIGTERM
once its log shows a given line; both driven to their end (the integrations' preempt → resume scenario).

A hang fails the test within its own deadline: every attempt still running is cancelled (SIGTERM to its
whole process tree, SIGKILL after the grace) rather than left for the suite to meet.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from trackway.ledger import open_ledger
from trackway.ledger.reader import Reader
from trackway.ledger.records import list_attempts, resolve_run
from trackway.settings import Settings, load_settings
from trackway.supervisor.launch import start_attempt
from trackway.supervisor.loop import Supervisor, handle_of
from trackway.supervisor.submit import RunSpec, submit_run


@dataclass
class Driven:
    settings: Settings
    reference: str
    preempted: str
    states: dict[str, str]
    attempts: dict[str, list[dict]]  # each run's attempts, oldest first
    losses: dict[str, list]  # each run's `loss` points
    keys: set[str]  # the metric keys the preempted run logged

    @property
    def runs(self) -> tuple[str, str]:
        return self.reference, self.preempted


def launcher_of(shim: int) -> int:
    """The command the local shim runs: its one child, leader of the command's process group."""
    return int(Path(f"/proc/{shim}/task/{shim}/children").read_text().split()[0])


def drive_preempted(sqlite_url: str, monkeypatch, command: Callable[[int], list[str]], notice_after: str,
                    deadline_s: float, to_launcher_only: bool = False) -> Driven:
    """Submit `command(0)` (the reference) and `command(1)`, SIGTERM the second once its log shows `notice_after`.

    The SIGTERM goes to the shim, which passes it to the command's whole group (every rank, as on a cancel or a
    host shutdown), or with `to_launcher_only` to the command alone (the shim's child).
    """
    monkeypatch.setenv("TRACKWAY_DB", sqlite_url)
    settings = load_settings()
    ledger = open_ledger(sqlite_url)
    supervisor = Supervisor(ledger, settings)
    runs = []
    for i in range(2):
        run_id = submit_run(ledger, settings, RunSpec(command=command(i), cwd=Path.cwd()))
        start_attempt(ledger, settings, run_id, supervisor.executor("local"))
        runs.append(run_id)
    reference, preempted = runs
    sent = ended = False
    deadline = time.monotonic() + deadline_s
    try:
        while time.monotonic() < deadline:
            supervisor.tick()
            with ledger.read() as conn:
                states = {r: resolve_run(conn, r)["state"] for r in runs}
                latest = list_attempts(conn, run_id=preempted)[-1]
            if all(s in ("completed", "failed") for s in states.values()):
                ended = True
                break
            log = Path(latest["log_path"])
            if not sent and latest["state"] == "running" and log.exists() and notice_after in log.read_text():
                shim = int(latest["executor_job_id"])
                os.kill(launcher_of(shim) if to_launcher_only else shim, signal.SIGTERM)
                sent = True
            time.sleep(0.2)
        with ledger.read() as conn:
            reader = Reader.over(conn)
            attempts = {r: [dict(a) for a in list_attempts(conn, run_id=r)] for r in runs}
            losses = {r: reader.metric_points(r, key="loss") for r in runs}
            keys = {p["key"] for p in reader.metric_points(preempted)}
    finally:
        if not ended:  # a hang: end what this test started here, not with the suite
            with ledger.read() as conn:
                for run_id in runs:
                    for attempt in list_attempts(conn, run_id=run_id):
                        if attempt["state"] == "running":
                            supervisor.executor("local").cancel(handle_of(attempt))
        ledger.dispose()
    if not ended:
        pytest.fail(f"not ended within {deadline_s:g} s (hung?): {states}")
    assert sent, f"the preempted run's log never showed {notice_after!r}"
    return Driven(settings, reference, preempted, states, attempts, losses, keys)
