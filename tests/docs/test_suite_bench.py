"""bench/bench_suite.py times the command `make test` runs: it reads pytest's arguments from the Makefile's recipe."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from bench_suite import suite_command  # noqa: E402


def test_the_bench_times_the_suite_as_the_makefile_runs_it():
    args = suite_command()
    recipe = (ROOT / "Makefile").read_text(encoding="utf-8").split("test: $(STAMP) services\n", 1)[1].split("\n")[0]
    assert recipe.endswith(" -m pytest " + " ".join(f'"{a}"' if " " in a else a for a in args))
    assert "not slow" in args  # the slow trials are bench_trials.py's, not the suite's


def test_a_changed_recipe_is_followed_and_a_missing_one_is_said(tmp_path):
    makefile = tmp_path / "Makefile"
    makefile.write_text("test: $(STAMP) services\n\tFOO=1 $(PY) -m pytest -n 3 -m \"not slow\" -x\n\nother:\n")
    assert suite_command(makefile) == ["-n", "3", "-m", "not slow", "-x"]
    makefile.write_text("test: $(STAMP) services\n\techo no pytest here\n\nother:\n\t$(PY) -m pytest\n")
    with pytest.raises(SystemExit, match="no `\\$\\(PY\\) -m pytest` line"):
        suite_command(makefile)
