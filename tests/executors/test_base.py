"""The executor seam: the registry and the phase predicate."""

from __future__ import annotations

import subprocess
import sys

import pytest

from trackway.errors import InputError
from trackway.executors.base import Executor, JobPhase, get_executor
from trackway.executors.local import LocalExecutor


def test_get_executor_local(tmp_path):
    executor = get_executor("local", tmp_path)

    assert isinstance(executor, LocalExecutor) and isinstance(executor, Executor)
    assert executor.name == "local"


def test_unknown_executor_is_one_line_listing_the_known_ones(tmp_path):
    with pytest.raises(InputError) as raised:
        get_executor("kubernetes-ish", tmp_path)

    assert str(raised.value) == "executor 'kubernetes-ish': expected one of inline, local"


def test_phases():
    assert [phase.value for phase in JobPhase] == ["running", "ended", "vanished"]
    assert [phase.is_terminal() for phase in JobPhase] == [False, True, True]


def test_shim_module_stays_import_light():
    code = (
        "import sys, trackway.executors.local_shim, trackway.executors.base; "
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('sqlalchemy', 'rich', 'typer', 'pydantic', 'psutil', 'alembic'))))"
    )
    heavy = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()

    assert heavy == ""
