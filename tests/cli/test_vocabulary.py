"""One vocabulary across every command a researcher reads, at 80 and at 200 columns.

A ledger with a completed CPU run, a failed one and one preempted then resumed is read through each
listing, record and report; every page is checked for the rules people found broken: GPU-hours said
of runs that had no GPU, a path broken inside a word, a Python dict or repr in human output, an end
line that says the same thing twice, a run going again shown with an ending of its own.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from trackway.cli import render

PY = sys.executable
NEUTRAL = str(Path(__file__).parent / "scripts" / "neutral.py")
REPR = re.compile(r"\{'|': |\bNone\b|\bTrue\b|\bFalse\b")


def _at(monkeypatch, width: int) -> None:
    for console in (render.console, render.err_console):
        monkeypatch.setattr(console, "_width", width)
        monkeypatch.setattr(console, "fits_width", True)


@pytest.mark.parametrize("width", [80, 200])
def test_every_page_a_researcher_reads_keeps_the_words(cli_sqlite, monkeypatch, tmp_path, width):
    config = tmp_path / "cfg.toml"
    config.write_text("[train]\nlr = 0.1\n")
    assert cli_sqlite("submit", "--name", "fine", "--config", str(config), "--", PY, NEUTRAL, "12").code == 0
    assert cli_sqlite("submit", "--name", "broken", "--", PY, NEUTRAL, "12", "--fail-at", "3").code == 1
    spot = cli_sqlite("submit", "--name", "spot", "--", PY, NEUTRAL, "12", "--preempt-at", "5")
    assert spot.code == 0
    # The end lines each command printed: each thing said once.
    for line in (text for text in spot.err.splitlines() if " ended: " in text):
        assert "none: the run ended" not in line and line.count("completed") <= 1, line
    _at(monkeypatch, width)
    logs = {a["attempt_id"]: a["log_path"] for a in cli_sqlite("attempts", "--json").json()}
    pages = {
        "runs": ["runs"], "attempts": ["attempts"], "show": ["show", "spot"], "show attempt": ["show", "spot/1"],
        "explain": ["explain", "broken"], "explain attempt": ["explain", "spot/1"], "metrics": ["metrics", "fine"],
        "checkpoints": ["checkpoints", "spot"], "evals": ["evals", "fine"], "compare": ["compare", "fine", "spot"],
        "waste": ["report", "waste", "--by", "run"], "resources": ["resources"],
    }
    for name, args in pages.items():
        result = cli_sqlite(*args)
        assert result.code == 0, (name, result.err)
        text = result.out
        # No attempt here had a GPU: no page calls their hours GPU-hours (a price per GPU-hour is a price).
        assert not re.search(r"(?<!\$/)(GPU|gpu)-h", text), (name, text)
        assert not REPR.search(text), (name, text)
        # A log path is whole on one line wherever it is shown: every one printed is a whole attempt's path.
        for word in text.split():
            if word.strip("`,").endswith("output.log"):
                assert word.strip("`,") in logs.values(), (name, "a log path broken across lines", word, text)
    # A run going again after its preemption had none of its own; at its end, the run's ending is its last one's.
    listed = {r["name"]: r for r in cli_sqlite("runs", "--json").json()}
    assert (listed["spot"]["state"], listed["spot"]["termination_reason"]) == ("completed", "completed")
    assert (listed["broken"]["state"], listed["broken"]["termination_reason"]) == ("failed", "code_error")
