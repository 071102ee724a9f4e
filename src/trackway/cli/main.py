"""The `trackway` command: global options and the command table, each command imported only when it runs.

Every command pays for what it imports before it does anything, so the top level imports Typer and
nothing else: `trackway --help` lists the commands from `COMMANDS` (the summaries people see), and
`trackway runs` imports the one module that defines `runs`. `tests/cli/test_lazy_commands.py`
keeps the table equal to what the modules register.
"""

from __future__ import annotations

import importlib
import sys

import typer
from typer.core import TyperGroup

from trackway.cli.errors import run_app


class Entry:
    """Owns one command's place in the table: the module that registers it and its one-line summary."""

    __slots__ = ("module", "summary")

    def __init__(self, module: str, summary: str) -> None:
        self.module = module
        self.summary = summary


# In the order `--help` lists them. The summary is the first sentence of the command's help.
COMMANDS: dict[str, Entry] = {
    "init": Entry("init_cmd", "Create trackway's home, migrate the ledger, and write a commented trackway.toml here."),
    "submit": Entry("submit_cmd", "Submit COMMAND as a run: capture its receipt, start an attempt and follow it (exit 0 iff it completed)."),
    "resume": Entry("submit_cmd", "Start a new attempt of RUN, from its latest committed checkpoint (exit 0 iff it completes)."),
    "runs": Entry("runs_cmd", "List runs, newest first (evaluation seeds, kind eval, only with --kind eval or all)."),
    "attempts": Entry("runs_cmd", "List attempts (the receipts), of one run or of all runs."),
    "show": Entry("runs_cmd", "Show a run with its receipt and attempts, or one attempt's full receipt."),
    "cancel": Entry("runs_cmd", "End a run: SIGTERM to its attempts' process groups, SIGKILL after the grace period."),
    "logs": Entry("logs_cmd", "Print an attempt's output log; with -f follow the run across its attempts."),
    "sql": Entry("sql_cmd", "Run a read-only query (PostgreSQL dialect; transpiled for SQLite)."),
    "metrics": Entry("metrics_cmd", "Show a run's metrics: a summary per key, or every point of one key."),
    "checkpoints": Entry("checkpoints_cmd", "List a run's checkpoints as storage holds them: state, step, size and lineage; set-aside ones with why."),
    "gc": Entry("checkpoints_cmd", "Apply checkpoint retention in one pass: what is not kept is superseded, then deleted (marker first)."),
    "compare": Entry("compare_cmd", "Runs side by side: the config keys that differ, code and data, final and best metrics, state and cost."),
    "evals": Entry("evals_cmd", "The run's checkpoints with their evaluations: step, progress, each metric per seed and aggregated."),
    "resources": Entry("resources_cmd", "List the resources runs may go to, with live availability (free GPUs, jobs running and pending)."),
    "preflight": Entry("preflight_cmd", "Estimate peak GPU memory per GPU at the median, p99 and longest batch, judge it per GPU, and rank the fixes."),
    "supervise": Entry("supervise_cmd", "Drive every unfinished run: notice ends, classify them, decide by policy, resume what should resume."),
    "explain": Entry("explain_cmd", "A run's attempts and decisions, then one attempt in full: config, data, placement, checkpoints, retries, evaluations and what happens next."),
    "eval": Entry("evals_cmd", "Evaluate a checkpoint (`trackway eval RUN@STEP --spec FILE`), show an evaluation, compare two."),
    "report": Entry("report_cmd", "Reports over the ledger."),
    "experiment": Entry("experiments_cmd", "Plan, start, show and report experiments: a hypothesis, a test run that gates the full run, a verdict."),
    "serve": Entry("serve_cmd", "Serve the REST API over this ledger: jobs, metrics, checkpoints, evaluations, explain, experiments, SQL, events."),
    "notify": Entry("notify_cmd", "Notifications: each message's state and each destination's delivery."),
    "approve": Entry("agents_cmd", "Start a run an agent submitted that waits for a person's approval, or --refuse it with --why."),
    "mcp": Entry("agents_cmd", "Serve trackway's tools to an agent over MCP on stdin/stdout: resources, budget, submit, wait, explain, metrics, logs, cancel, sql."),
    "token": Entry("token_cmd", "Named API tokens for `trackway serve`, each with a role: add, list, revoke."),
    "experiments": Entry("experiments_cmd", "List experiments with their status and verdict; --chain EXP prints the iterations around EXP."),
    "schema": Entry("schema_cmd", "Print the JSON Schema of trackway.toml: every table and field, what each expects, unknown keys refused."),
}


class LazyCommands(TyperGroup):
    """A command group that imports a command's module the first time the command is looked up."""

    def list_commands(self, ctx: typer.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: typer.Context, cmd_name: str) -> typer.core.TyperCommand | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            self._load(COMMANDS[cmd_name].module)
        return self.commands.get(cmd_name)

    def _load(self, module_name: str) -> None:
        module = importlib.import_module(f"trackway.cli.{module_name}")
        holder = typer.Typer(rich_markup_mode=None)
        module.register(holder)
        loaded = typer.main.get_group(holder)
        for name, command in loaded.commands.items():
            self.add_command(command, name)

    def load_all(self) -> dict[str, typer.core.TyperCommand]:
        """Every command, imported (for documentation checks; the CLI itself never needs this)."""
        for entry in COMMANDS.values():
            self._load(entry.module)
        return dict(self.commands)

    def format_commands(self, ctx: typer.Context, formatter) -> None:
        # The summaries from the table: listing the commands must not import them.
        limit = formatter.width - 6 - max(len(name) for name in COMMANDS)
        rows = [(name, _shortened(entry.summary, limit)) for name, entry in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _shortened(summary: str, limit: int) -> str:
    """`summary` cut at a word to fit `limit` columns, with an ellipsis when cut."""
    if len(summary) <= limit:
        return summary
    return summary[: max(limit - 3, 1)].rsplit(" ", 1)[0].rstrip(",;:") + "..."


app = typer.Typer(
    name="trackway",
    cls=LazyCommands,
    help="Training runs that leave tracks: submit, supervise and explain ML training attempts.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.callback()
def _global(
    ctx: typer.Context,
    db: str = typer.Option(None, "--db", help="Ledger URL (sqlite:///PATH or postgresql+psycopg://...). Default: $TRACKWAY_DB, trackway.toml, then $TRACKWAY_HOME/ledger.db."),
    home: str = typer.Option(None, "--home", help="trackway's home directory. Default: $TRACKWAY_HOME or ./.trackway."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
) -> None:
    from trackway.cli.context import AppContext

    ctx.obj = AppContext(home=home, db=db, debug=debug)


def main() -> None:
    sys.exit(run_app(app))


if __name__ == "__main__":
    main()
