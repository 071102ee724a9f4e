"""What trackway prints from data reaches the screen as it was: brackets stay, escape codes cannot act.

rich reads `[word ...]` as markup and drops it; the rule that decided a retry (`[oom: same memory
footprint]`) and a script's `[rank0]:` lines were eaten that way. A script's ESC bytes reached the
terminal of whoever read its evidence.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from sqlalchemy import update

from trackway.ledger import open_ledger
from trackway.ledger.schema import runs

PY = sys.executable
OOM = str(Path(__file__).resolve().parents[2] / "examples" / "faults" / "oom.py")

# Torch-style rank prefixes and an escape sequence, as a failing distributed job prints them.
NOISY_CRASH = r"""
import sys
print("[rank0]: loading shard [3/8]", flush=True)
print("\x1b[2J\x1b[31mscreen cleared", flush=True)
sys.stderr.write("[rank0]: RuntimeError: boom [bad shape]\n")
sys.exit(1)
"""


def test_submit_follow_keeps_the_rule_in_brackets(cli):
    result = cli("submit", "--", PY, OOM)
    assert result.code == 1
    ended = [line for line in result.err.splitlines() if " ended: oom" in line]
    assert len(ended) == 1, result.err
    assert ended[0].endswith("[oom: same memory footprint]"), ended[0]


def test_supervise_prints_the_classifying_and_deciding_rules(cli, tmp_path):
    script = tmp_path / "crash.py"
    script.write_text(NOISY_CRASH)
    run_id = cli("submit", "--detach", "--", PY, str(script)).out.strip()
    said = ""
    for _ in range(400):  # a poll, not a timing assertion: the attempt ends when the process does
        said += cli("supervise", "--once").out
        if f"{run_id}/1 ended" in said:
            break
    (line,) = [line for line in said.splitlines() if line.startswith(f"{run_id}/1 ended")]
    (attempt,) = cli("attempts", run_id, "--json").json()
    rule = attempt["termination_evidence"]["rule"]
    decision = json.loads(attempt["retry_decision"])
    assert f"ended: {attempt['termination_reason']} [{rule}]; stop: " in line, line
    assert line.endswith(f"[{decision['rule']}]"), line


def test_show_and_explain_print_evidence_with_its_brackets_and_without_escape_codes(cli, tmp_path):
    script = tmp_path / "crash.py"
    script.write_text(NOISY_CRASH)
    run_id = cli("submit", "--", PY, str(script)).out.strip()
    for shown in (cli("show", f"{run_id}/1").out, cli("explain", run_id).out, cli("explain", run_id, "--markdown").out):
        assert "[rank0]: RuntimeError: boom [bad shape]" in shown, shown
        assert "\x1b" not in shown and "\\x1b[2J\\x1b[31mscreen cleared" in shown, shown
    logs = cli("logs", f"{run_id}/1").out  # the log itself stays byte for byte what the script wrote
    assert "\x1b[2J" in logs


def test_a_name_stored_before_names_were_checked_is_printed_harmlessly(cli, tmp_path):
    assert cli("submit", "--name", "plain", "--", PY, "-c", "pass").code == 0
    # A ledger written by an older trackway (or by hand) may hold any name: listings must still be safe.
    ledger = open_ledger(os.environ["TRACKWAY_DB"])
    with ledger.write() as conn:
        conn.execute(update(runs).values(name="[bold]x[/bold]\x1b[31mred"))
    ledger.dispose()
    listed = cli("runs").out
    assert "[bold]x[/bold]\\x1b[31mred" in listed, listed
    assert "\x1b" not in listed


def test_a_burst_of_lines_printed_at_once_reads_as_each_printed_alone():
    import io

    from trackway.cli.render import _Console, say, say_lines

    lines = ["r1/1 ended: oom [oom: same memory footprint]; stop: [default]", "\x1b[2J[rank0]: boom", ""]
    alone, together = io.StringIO(), io.StringIO()
    for line in lines:
        say(_Console(file=alone, fits_width=False, width=20), line)
    say_lines(_Console(file=together, fits_width=False, width=20), lines)
    say_lines(_Console(file=together, fits_width=False, width=20), [])  # a tick without ends prints nothing

    assert together.getvalue() == alone.getvalue()
    assert together.getvalue().splitlines()[:2] == [lines[0], "\\x1b[2J[rank0]: boom"]
