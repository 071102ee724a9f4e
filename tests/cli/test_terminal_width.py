"""Every listing fits an 80-column terminal: the least important columns go first, text is shortened with a
visible ellipsis, and a number is shown whole or not at all. Piped output is plain text at its natural width.

Listings are rendered three ways: in-process through trackway's own console set to 80 columns, as
`python -m trackway` subprocesses with COLUMNS=80 and piped, and under a real 80-column pseudo-terminal.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
from rich.cells import cell_len

from trackway.cli import render
from trackway.cli.render import KEY, Column, Listing

PY = sys.executable
NEUTRAL = str(Path(__file__).parent / "scripts" / "neutral.py")
EVALUATOR = str(Path(__file__).resolve().parents[1] / "evals" / "scripts" / "evaluator.py")
LONG = "a-rather-long-experiment-name-for-the-listing"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# A number with a fraction, as a cell shows it: a cut one would end in a bare digit or a dot.
DECIMAL = re.compile(r"\d+\.\d*%?")


@pytest.fixture
def at_80(monkeypatch):
    """trackway's consoles behave as on an 80-column terminal (without colour, for reading back)."""
    for console in (render.console, render.err_console):
        monkeypatch.setattr(console, "_width", 80)
        monkeypatch.setattr(console, "fits_width", True)


def fits(text: str, width: int = 80) -> str:
    """`text`, after checking that no line of it is wider than `width` cells.

    Two exceptions, kept on one line so that copying from the terminal (which folds them on screen)
    gives them without a newline in the middle: a line suggesting a command, and a line whose one long
    word (a path, a hash) is on a line of its own after its label.
    """
    for line in text.splitlines():
        words = line.split()
        own_line = bool(words) and cell_len(words[-1]) > width // 2 and cell_len(line) - cell_len(words[-1]) < width // 2
        assert cell_len(line) <= width or "`trackway " in line or own_line, f"{cell_len(line)} cells: {line!r}"
    return text


def test_a_long_path_is_never_broken_inside_a_word():
    from trackway.cli.render import hanging

    path = "/tmp/pytest-of-root/pytest-12/popen-gw0/test_a_long_name0/home/runs/r1234567890/attempts/1/output.log"
    lines = hanging("  log           ", f"{path} (3 lines)", 80)
    # Whole on one line (past the width: the terminal folds it for the eye), the rest wrapped under it.
    assert lines[0] == f"  log           {path}" and lines[1].split() == ["(3", "lines)"], lines


def shown_or_shortened(text: str, value: str) -> None:
    """`value` appears whole, or shortened around a visible ellipsis: what is left of it is its own beginning
    and end (never cut silently)."""
    if value in text:
        return
    cut = re.findall(re.escape(value[:4]) + r"\S*", text)
    assert cut, (value, text)
    for shown in cut:
        head, ellipsis, tail = shown.partition("…")
        assert ellipsis and value.startswith(head) and value.endswith(tail), (value, shown, text)


def two_runs(cli, tmp_path) -> None:
    """A long-named run preempted once and resumed; a run that crashed and was resumed by hand with --set."""
    config = tmp_path / "cfg.toml"
    config.write_text("lr = 0.05\nstep_delay = 0.05\nbatch_size = 32\n")
    with_config = ("--config", str(config), "--", PY, NEUTRAL, "30")
    assert cli("submit", "--name", LONG, *with_config, "--preempt-at", "12").code == 0
    assert cli("submit", "--name", "flaky", *with_config, "--fail-at", "5").code == 1
    assert cli("resume", "flaky", "--set", "batch_size=8").code == 0


def evaluated(cli, tmp_path) -> dict:
    """A run whose step-20 checkpoint was evaluated with two seeds; its `evals --json`."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"task_id": f"t{i}", "prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n"
                             for i in range(7)))
    spec = tmp_path / "toy.toml"
    spec.write_text(f'name = "toy"\ncommand = {json.dumps([PY, EVALUATOR])}\ntask_set = "{tasks}"\n'
                    'seeds = [0, 1]\nmetrics = ["pass@1", "pass@2"]\n[decoding]\nsamples = 3\n')
    assert cli("submit", "--name", LONG, "--", PY, NEUTRAL, "30").code == 0
    result = cli("eval", f"{LONG}@20", "--spec", str(spec))
    assert result.code == 0, result.err
    return cli("evals", LONG, "--json").json()


def test_runs_attempts_show_metrics_and_report_fit_80_columns_with_their_key_columns(cli, tmp_path, at_80):
    two_runs(cli, tmp_path)
    runs = cli("runs", "--json").json()
    listed = fits(cli("runs").out)
    for run in runs:
        assert run["run_id"] in listed and run["state"] in listed and run["termination_reason"] in listed
    shown_or_shortened(listed, LONG)

    attempts = cli("attempts", "--json").json()
    listed = fits(cli("attempts").out)
    reasons = {a["attempt_id"]: a["termination_reason"] for a in attempts}
    assert sorted(reasons.values()) == ["code_error", "completed", "completed", "preempted"]
    for line in listed.splitlines():
        if line.split() and line.split()[0] in reasons:
            words = line.split()
            attempt = next(a for a in attempts if a["attempt_id"] == words[0])
            # id, state, exit code and reason on the attempt's own row
            assert words[1] == "ended" and words[-1] == attempt["termination_reason"], line
            assert str(attempt["exit_code"]) in words, line
    assert all(attempt_id in listed for attempt_id in reasons)

    shown = fits(cli("show", LONG).out)  # long values (the command, paths) wrap, never cut
    assert "preempted" in shown and "completed" in shown

    metrics = fits(cli("metrics", "flaky", "--key", "loss", "--limit", "3").out)
    points = cli("metrics", "flaky", "--key", "loss", "--limit", "3", "--json").json()
    for point in points:
        assert repr(point["value"]) in metrics  # the value as stored, whole
    fits(cli("metrics", "flaky").out)

    report = fits(cli("report", "waste", "--by", "run").out)
    shown_or_shortened(report, LONG)
    assert "flaky" in report


def test_show_prints_config_values_as_stored_from_the_attempt_that_ran_last(cli, tmp_path, at_80):
    two_runs(cli, tmp_path)
    shown = cli("show", "flaky").out
    # attempt 2 ran with `resume --set batch_size=8`; nothing is rounded (0.05 stays 0.05)
    assert "batch_size = 8" in shown and "batch_size = 32" not in shown
    assert "lr = 0.05" in shown and "step_delay = 0.05" in shown
    assert "attempt 2 ran with it" in shown
    first = cli("show", "flaky/1").out
    assert "batch_size = 32" in first and "code_error" in first
    assert cli("show", "flaky", "--json").json()["config"] == {"lr": 0.05, "step_delay": 0.05, "batch_size": 8}


def test_evaluation_listings_fit_80_columns_and_never_cut_a_metric(cli, tmp_path, at_80):
    result = evaluated(cli, tmp_path)
    (row,) = result["evaluations"]
    listed = fits(cli("evals", LONG).out)
    assert row["eval_id"] in listed and row["checkpoint"] in listed and row["state"] in listed
    for metric in row["shown_metrics"]:
        assert f"{100 * row['metrics'][metric]['mean']:.2f}%" in listed, (metric, listed)
    for number in DECIMAL.findall(listed):
        assert re.fullmatch(r"\d+\.\d\d%", number), (number, listed)

    detail = cli("eval", "show", row["eval_id"], "--json").json()
    shown = cli("eval", "show", row["eval_id"]).out
    table = "\n".join(line for line in shown.splitlines() if re.match(r"seed |─|\s*\d+\s+r[0-9a-f]{10}", line))
    fits(table)
    for seed in detail["seeds"]:
        assert seed["eval_run_id"] in shown and seed["state"] in shown
        for value in seed["metrics"].values():
            assert f"{100 * value:.2f}%" in table
    for number in DECIMAL.findall(table):
        assert re.fullmatch(r"\d+\.\d\d%", number), (number, table)

    listed = fits(cli("runs", "--kind", "eval").out)
    for seed in detail["seeds"]:
        # Shortened in the middle: the seed that tells the two apart stays readable.
        (line,) = [line for line in listed.splitlines() if line.startswith(seed["eval_run_id"])]
        name = line.split()[1]
        assert name.startswith(LONG[:5]) and "…" in name and name.endswith(f"/seed-{seed['seed']}"), line


def test_sql_shows_json_as_compact_text_beside_the_other_columns(cli, tmp_path, at_80):
    assert cli("submit", "--name", "one", "--", PY, "-c", "import sys; sys.exit(3)").code == 1
    query = "select attempt_id, termination_evidence, exit_code, termination_reason from attempts"
    (row,) = cli("sql", query, "--json").json()
    listed = fits(cli("sql", query).out)
    (line,) = [line for line in listed.splitlines() if line.startswith(row["attempt_id"])]
    # Every other column is still filled in; the JSON is cut with an ellipsis where it is too long.
    assert line.split()[-1] == row["termination_reason"] and line.split()[-2] == "3", line
    assert '{"rule"' in line and "…" in line, line
    wide = render.Listing(None, [Column("j", KEY)], [[{"a": [1, 2], "b": None}]])
    assert '{"a":[1,2],"b":null}' in wide.text(None)
    parsed = cli("sql", "select termination_evidence from attempts", "--csv").out.splitlines()
    assert parsed[1].startswith('"{""rule""')  # CSV carries the JSON text as stored


def test_a_listing_drops_columns_then_shortens_text_and_never_cuts_a_number():
    columns = [Column("id", KEY), Column("name", 50, shorten_to=8), Column("loss", 40, right=True),
               Column("note", 10, shorten_to=6), Column("reason", KEY)]
    listing = Listing(None, columns, [["r1", "a-very-long-run-name", 0.123456789, "retried twice by hand", "oom"]])
    assert listing.text(None).splitlines()[2] == "r1  a-very-long-run-name  0.123456789  retried twice by hand  oom"
    # 60 columns: the least important column gives way first, shortened with an ellipsis
    assert listing.text(60).splitlines()[2] == "r1  a-very-long-run-name  0.123456789  retried twic…  oom"
    # 48 columns: shortened to its floor it would still not fit: it goes; everything else stays whole
    assert listing.text(48).splitlines()[2] == "r1  a-very-long-run-name  0.123456789  oom"
    assert "not shown at 48 columns: note" in listing.text(48)
    # 34 columns: the number is next: dropped, never cut to 0.12
    narrower = listing.text(34)
    assert narrower.splitlines()[2] == "r1  a-very-long-run-name  oom" and "0.12" not in narrower
    assert "not shown at 34 columns: loss, note" in narrower
    # 20 columns: the name is shortened with an ellipsis; the key columns stay
    assert listing.text(20).splitlines()[2] == "r1  a-very-…  oom"
    # even the key columns do not fit: every value whole, one per line
    assert "loss    0.123456789" in listing.text(6)


# -- real processes -------------------------------------------------------------------------------


def _process(*args: str, columns: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR", "TTY_COMPATIBLE")}
    if columns:
        env["COLUMNS"] = columns
    done = subprocess.run([PY, "-m", "trackway", *args], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _in_terminal(*args: str, columns: int = 80) -> str:
    """`trackway ARGS` with stdout and stderr on a pseudo-terminal of `columns` columns; what it showed."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR")}
    env["TERM"] = "xterm-256color"
    process = subprocess.Popen([PY, "-m", "trackway", *args], stdin=subprocess.DEVNULL, stdout=follower,
                               stderr=follower, env=env)
    os.close(follower)
    data = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the terminal's other side has closed
            break
        if not chunk:
            break
        data += chunk
    os.close(leader)
    assert process.wait(timeout=120) == 0, data
    return data.decode().replace("\r\n", "\n")


def test_real_processes_fit_columns_80_a_terminal_of_80_and_pipe_plain_text_at_natural_width(cli, tmp_path):
    two_runs(cli, tmp_path)
    reasons = ["preempted", "completed", "code_error"]
    run_ids = [run["run_id"] for run in cli("runs", "--json").json()]
    listed = fits(_process("runs", columns="80"))
    assert all(run_id in listed for run_id in run_ids) and "completed" in listed and "\x1b" not in listed
    listed = fits(_process("attempts", columns="80"))
    assert all(reason in listed for reason in reasons) and "\x1b" not in listed

    on_screen = _in_terminal("attempts")
    assert "\x1b[" in on_screen  # a terminal gets styled text
    visible = fits(ANSI.sub("", on_screen))
    assert all(reason in visible for reason in reasons)

    piped = _process("runs", columns=None)
    assert "\x1b" not in piped and LONG in piped and "not shown" not in piped  # whole, nothing dropped
    assert all(line == line.rstrip() for line in piped.splitlines())  # no padding
    # As wide as its widest row: the rule under the header is the table's own width, not a console's.
    (rule,) = [line for line in piped.splitlines() if line.startswith("─")]
    assert max(cell_len(line) for line in piped.splitlines()) == cell_len(rule) > 80
