"""The command table `--help` lists without importing the commands says what the commands themselves say."""

from __future__ import annotations

import os
import subprocess
import sys

import typer

from trackway.cli.main import COMMANDS, app


def _first_sentence(help_text: str) -> str:
    paragraph = " ".join(help_text.strip().split("\n\n")[0].split())
    for index, char in enumerate(paragraph):
        if char == "." and (index + 1 == len(paragraph) or paragraph[index + 1] == " "):
            return paragraph[: index + 1]
    return paragraph


def _reporting(report: str) -> list[str]:
    """The argv that runs a trackway command (its words follow) and then prints `report`, Python read off its
    process (what it imported), as the last line of stderr; it exits with the command's code."""
    return [sys.executable, "-c",
            "import sys; from trackway.cli.errors import run_app; from trackway.cli.main import app; "
            f"code = run_app(app, sys.argv[1:]); print({report}, file=sys.stderr); sys.exit(code)"]


def _isolated(tmp_path) -> dict[str, str]:
    """An environment whose trackway home (its SQLite ledger) is under `tmp_path`, starting no background supervisor."""
    env = {**os.environ, "TRACKWAY_HOME": str(tmp_path / "home"), "TRACKWAY_BACKGROUND_SUPERVISOR": "0"}
    env.pop("TRACKWAY_DB", None)
    return env


def test_the_table_lists_every_command_with_its_own_first_sentence():
    commands = typer.main.get_command(app).load_all()  # type: ignore[attr-defined]
    assert sorted(commands) == sorted(COMMANDS), "a module registers a command the table does not list (or the reverse)"
    for name, command in commands.items():
        assert COMMANDS[name].summary == _first_sentence(command.help or ""), f"COMMANDS[{name!r}].summary is stale"


def test_help_and_a_command_import_only_what_they_use():
    probe = _reporting(
        "sorted({m.split('.')[0] for m in sys.modules} & {'sqlalchemy', 'sqlglot', 'torch', 'alembic'}), "
        "sorted(m for m in sys.modules if m.startswith('trackway.cli.') and m.endswith('_cmd'))"
    )
    help_run = subprocess.run([*probe, "--help"], capture_output=True, text=True, check=True)
    assert "submit" in help_run.stdout and "explain" in help_run.stdout
    assert help_run.stderr.strip() == "[] []", "--help imported what it does not need: " + help_run.stderr

    init_help = subprocess.run([*probe, "init", "--help"], capture_output=True, text=True, check=True)
    assert "trackway.toml" in init_help.stdout
    assert "'trackway.cli.init_cmd'" in init_help.stderr and "runs_cmd" not in init_help.stderr


def test_help_summaries_fit_the_terminal_and_say_when_they_are_cut(tmp_path):
    env_width = {"COLUMNS": "80", "TRACKWAY_HOME": str(tmp_path)}
    import os

    out = subprocess.run([sys.executable, "-m", "trackway", "--help"], capture_output=True, text=True, check=True,
                         env={**os.environ, **env_width}).stdout
    lines = out.split("Commands:")[1].strip().splitlines()
    assert len(lines) == len(COMMANDS)
    assert all(len(line) <= 80 for line in lines), lines
    explain = next(line for line in lines if line.strip().startswith("explain"))
    assert explain.rstrip().endswith("..."), "a cut summary must end with an ellipsis"


def test_show_runs_and_explain_read_a_sqlite_ledger_without_sqlalchemy(tmp_path):
    """`show` had come to import SQLAlchemy through the run's criteria (0.29 s instead of 0.10 s a call); `explain`
    read the ledger through SQLAlchemy (0.33 s, 3.7x `show`)."""
    env = _isolated(tmp_path)
    done = subprocess.run([sys.executable, "-m", "trackway", "submit", "--name", "quick", "--expect", "final.loss < 2",
                           "--", sys.executable, "-c", "pass"], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    probe = _reporting("sorted({m.split('.')[0] for m in sys.modules} & {'sqlalchemy', 'alembic'})")
    for command in (["show", "quick"], ["runs"], ["explain", "quick"], ["explain", "quick/1", "--json"]):
        shown = subprocess.run([*probe, *command], capture_output=True, text=True, env=env,
                               cwd=tmp_path, timeout=120)
        assert shown.returncode == 0 and shown.stderr.strip().splitlines()[-1] == "[]", (command, shown.stderr)


def test_a_submit_with_nothing_to_check_builds_no_settings_models_and_a_bad_table_is_still_refused(tmp_path):
    """A submit imported pydantic for an absent [retry] and no --watch, and YAML, statistics and NVML's bindings on a
    machine without a driver: 0.91 s of CPU, 0.70 s without them (`farm-bench --vs`, 2026-11-30)."""
    env = _isolated(tmp_path)
    probe = _reporting("sorted({m.split('.')[0] for m in sys.modules} & {'pydantic', 'yaml', 'statistics'})")

    def submit(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*probe, "submit", *args, "--", sys.executable, "-c", "pass"],
                              capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)

    (tmp_path / "home").mkdir()
    assert submit("--name", "first").returncode == 0  # the first command checks trackway.toml and remembers it
    plain = submit("--name", "plain")
    assert plain.returncode == 0 and plain.stderr.strip().splitlines()[-1] == "[]", plain.stderr

    watched = submit("--name", "watched", "--watch", "loss_rising.window=3 parsecs")
    assert watched.returncode == 2 and "--watch loss_rising.window" in watched.stderr, watched.stderr

    (tmp_path / "trackway.toml").write_text("[retry.reasons.oom]\nbudget = -1\n")
    refused = submit("--name", "refused")
    assert refused.returncode == 2, refused.stderr
    assert "trackway.toml [retry]: [reasons.oom] budget -1: expected a whole number of retries" in refused.stderr


def test_a_detached_submit_launches_without_loading_the_control_loop(tmp_path):
    """`submit --detach` leaves its run to a background supervisor: the loop it never ticks (watchers, evaluations,
    notifications) is not imported. 0.74 s of CPU before, 0.72 s after (`farm-bench --vs`, 11 pairs, 2026-11-30)."""
    env = _isolated(tmp_path)
    (tmp_path / "home").mkdir()
    done = subprocess.run([*_reporting("'trackway.supervisor.loop' in sys.modules"), "submit", "--detach", "--name",
                           "left", "--", sys.executable, "-c", "pass"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0 and done.stderr.strip().splitlines()[-1] == "False", done.stderr
    assert done.stdout.strip(), "the run's id is printed"
    runs = subprocess.run([sys.executable, "-m", "trackway", "runs", "--json"], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)
    assert '"left"' in runs.stdout, runs.stdout  # recorded, and its attempt launched by the local executor
