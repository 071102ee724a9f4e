"""A rank that stops stepping is named: while the others step on (an event), and in the stall's evidence."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from trackway.cli.errors import run_app
from trackway.cli.main import app
from trackway.supervisor.watchers import rank_positions, rank_stalled

SCRIPT = Path(__file__).resolve().parent / "scripts" / "rank_stops_stepping.py"
NOW = 10_000.0


def _beat(step, moved_ago, beat_ago=1.0, **extra):
    return {"t": NOW - beat_ago, "step": step, "progress_t": NOW - moved_ago, "pid": 1, **extra}


def test_a_rank_whose_step_stopped_while_another_moved_on_is_named_though_its_heartbeat_beats():
    beats = {0: _beat(95, 2.0), 1: _beat(40, 720.0)}
    assert rank_stalled(beats, NOW, window=300) == (
        "rank 1 stopped stepping: last stepped at step 40 (12 min ago) while rank 0 is at 95 (stepped 2 s ago)")
    # Its heartbeat stopped as well (the process is gone or stuck holding the GIL): said too.
    beats[1] = _beat(40, 720.0, beat_ago=700.0)
    assert rank_stalled(beats, NOW, window=300).endswith("; its heartbeat stopped too, 12 min ago")


@pytest.mark.parametrize("beats", [
    {0: _beat(95, 2.0), 1: _beat(95, 3.0)},  # both stepping
    {0: _beat(41, 720.0), 1: _beat(40, 725.0)},  # DDP: one hung rank holds them all, nobody moved on
    {0: _beat(95, 2.0), 1: _beat(40, 720.0, closed=True)},  # rank 1 finished: its quiet is not a hang
    {0: _beat(95, 2.0), 1: _beat(None, 720.0)},  # rank 1 never logged a step: nothing to compare
    {0: _beat(95, 2.0)},
])
def test_ranks_that_step_together_or_are_done_are_not_named(beats):
    assert rank_stalled(beats, NOW, window=300) is None


def test_a_stall_says_which_rank_the_others_are_ahead_of():
    assert rank_positions({0: _beat(41, 700.0), 1: _beat(40, 720.0), 2: _beat(41, 700.0)}, NOW) == (
        "rank 1 last stepped at step 40 (12 min ago) while ranks 0, 2 are at 41")
    assert rank_positions({0: _beat(41, 700.0), 1: _beat(41, 705.0)}, NOW) == (
        "every rank that logged (0, 1) last stepped at step 41 (12 min ago)")
    assert rank_positions({0: _beat(41, 700.0)}, NOW) is None


def test_the_supervisor_names_the_rank_that_stopped_stepping_in_its_events_and_the_stall(home, sqlite_url, capsys,
                                                                                        monkeypatch):
    monkeypatch.setenv("TRACKWAY_DB", sqlite_url)
    Path("trackway.toml").write_text("[supervisor]\nstall_seconds = 4\n[resources.local]\ngrace_seconds = 1\n")

    def cli(*args: str):
        capsys.readouterr()
        code = run_app(app, list(args))
        return code, capsys.readouterr().out

    code, _ = cli("submit", "--name", "two-ranks", "--", sys.executable, str(SCRIPT))
    assert code == 0
    attempts = json.loads(cli("attempts", "two-ranks", "--json")[1])
    assert [a["termination_reason"] for a in attempts] == ["stalled", "completed"]
    evidence = json.dumps(attempts[0]["termination_evidence"])
    assert "rank 1 last stepped at step 3 (" in evidence and "while rank 0 is at 29" in evidence
    explained = cli("explain", "two-ranks/1")[1]
    assert "rank 1 stopped stepping: last stepped at step 3 (" in explained
    # Both ranks' values are kept, rank 0's shown unless asked.
    code, out = cli("metrics", "two-ranks", "--key", "loss", "--rank", "1", "--json")
    assert code == 0 and json.loads(out)[-1]["value"] == pytest.approx(1.0 + 1 / 40)
