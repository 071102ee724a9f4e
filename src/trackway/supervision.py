"""The supervisor as trackway's commands run it: the control loop (supervisor/) with the duties of the layers above it.

The loop drives attempts; two things it does each tick belong to packages that build on it:
experiments are moved on (a test run that ended is gated, a full run that ended is judged:
experiments/progress.py) and what needs a person is told (reports/notify.py). They reach the
loop as `Duty`s from here, so that `supervisor/` never imports the packages above it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from trackway.executors.base import Executor
from trackway.ledger import Ledger
from trackway.reports.notify import Notifier
from trackway.settings import Settings
from trackway.supervisor.loop import Supervisor


class AdvanceExperiments:
    """Gate experiments whose test run ended, judge those whose full run did, start batches' next members."""

    def tick(self, supervisor: Supervisor) -> Iterable[tuple[str, str]]:
        # Imported here: most commands that tick never have an experiment in flight.
        from trackway.experiments.batch import advance_batches
        from trackway.experiments.progress import advance

        lines = advance(supervisor.ledger, supervisor.settings, supervisor.executor).lines
        # After the members' own moves: a member that just concluded makes room for the next.
        return [*lines, *advance_batches(supervisor.ledger, supervisor.settings, supervisor.executor)]

    def settle(self, timeout: float) -> None:
        """Nothing outlives a tick here."""


class JudgeExpectations:
    """Judge the runs' own criteria (`submit --expect`) that can still change, as metrics and evaluations land."""

    def tick(self, supervisor: Supervisor) -> Iterable[tuple[str, str]]:
        from trackway.experiments.expectations import judge_due

        judge_due(supervisor.ledger)
        return ()

    def settle(self, timeout: float) -> None:
        """Nothing outlives a tick here."""


class Notify:
    """What needs a person ([notify] in trackway.toml), recorded each tick; sent on a thread of its own where this process delivers.

    The settings are read from the supervisor at each tick (a background supervisor reloads them).
    """

    def __init__(self, ledger: Ledger, deliver: bool = True) -> None:
        self.notifier = Notifier(ledger, deliver)

    def tick(self, supervisor: Supervisor) -> Iterable[tuple[str, str]]:
        self.notifier.tick(supervisor.settings)
        return ()

    def settle(self, timeout: float) -> None:
        self.notifier.wait(timeout)


def supervisor_for(ledger: Ledger, settings: Settings,
                   executor_for: Callable[[str], Executor] | None = None, deliver: bool = True) -> Supervisor:
    """A control loop over `ledger` that also moves experiments on and tells what needs telling.

    `deliver=False` (a read-only command's tick) records messages but never claims one to send:
    `undelivered` says how many it left for a deliverer.
    """
    return Supervisor(ledger, settings, executor_for, duties=(AdvanceExperiments(), JudgeExpectations(), Notify(ledger, deliver)))


def undelivered(supervisor: Supervisor) -> int:
    """How many messages this supervisor's ticks recorded without sending them (it does not deliver)."""
    return sum(duty.notifier.recorded for duty in supervisor.duties
               if isinstance(duty, Notify) and not duty.notifier.delivers)
