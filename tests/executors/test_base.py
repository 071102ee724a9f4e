"""The executor seam: the registry and the phase predicate."""

from __future__ import annotations

import subprocess
import sys

import pytest

from trackway.errors import InputError
from trackway.executors.base import Executor, JobPhase
from trackway.executors.registry import get_executor
from trackway.executors.local import LocalExecutor


def test_get_executor_local(tmp_path):
    executor = get_executor("local", tmp_path)

    assert isinstance(executor, LocalExecutor) and isinstance(executor, Executor)
    assert executor.name == "local"


def test_unknown_executor_is_one_line_listing_the_known_ones(tmp_path):
    with pytest.raises(InputError) as raised:
        get_executor("kubernetes-ish", tmp_path)

    assert str(raised.value) == "executor 'kubernetes-ish': expected one of inline, kubernetes, local, slurm, ssh"


def test_phases():
    assert [phase.value for phase in JobPhase] == ["queued", "running", "ended", "vanished"]
    assert [phase.is_terminal() for phase in JobPhase] == [False, False, True, True]


def test_poll_many_of_the_base_loops_over_poll(tmp_path):
    from trackway.executors.base import JobHandle, JobStatus

    class Counting(Executor):
        name = "counting"
        polled: list[str] = []

        def submit(self, request):
            raise NotImplementedError

        def poll(self, handle):
            self.polled.append(handle.job_id)
            return JobStatus(phase=JobPhase.RUNNING)

        def cancel(self, handle):
            pass

        def logs(self, handle):
            return tmp_path

    executor = Counting()
    handles = [JobHandle("counting", str(n), tmp_path) for n in (1, 2, 3)]

    assert executor.poll_many(handles) == {str(n): JobStatus(phase=JobPhase.RUNNING) for n in (1, 2, 3)}
    assert executor.polled == ["1", "2", "3"]


def test_slurm_is_registered_and_imported_on_use(tmp_path):
    code = (
        "import sys; from trackway.executors.registry import get_executor; "
        "assert 'trackway.executors.slurm' not in sys.modules; "
        f"print(type(get_executor('slurm', __import__('pathlib').Path({str(tmp_path)!r}))).__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()

    assert out == "SlurmExecutor"


def test_shim_module_stays_import_light():
    code = (
        "import sys, trackway.executors.local_shim, trackway.executors.base; "
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('sqlalchemy', 'rich', 'typer', 'pydantic', 'psutil', 'alembic'))))"
    )
    heavy = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()

    assert heavy == ""
