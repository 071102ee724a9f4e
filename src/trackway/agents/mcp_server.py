"""`trackway mcp`: the agent tools (agents/tools.py) served over the Model Context Protocol, on the official SDK.

Every tool has a JSON schema for its arguments, answers structured content, and refuses what it
cannot take as structured content too, `{"error": {"field", "expected", "message"}}` with
`isError` set, so an agent can tell what to change without parsing prose. An argument a tool does
not have is refused the same way before the tool runs (the SDK would drop it silently, and an
agent that misspelt `time_limit_hours` would get a run without a limit).
"""

from __future__ import annotations

import inspect
import json
import re
from typing import Annotated, Any

from pydantic import Field

from trackway.agents import experiment_tools, tools
from trackway.agents.guardrails import AgentRefused
from trackway.agents.tools import AgentSession
from trackway.errors import TrackwayError

INSTRUCTIONS = (
    "trackway runs and supervises training jobs and keeps every attempt as a receipt. The loop: `resources` and "
    "`budget` to see what is free and what you may spend; `submit` a short kind='test' run of a hypothesis; `wait` for "
    "its ending; read `metrics` and `explain`; then `submit` the kind='full' run; `wait`; `explain` the ending. "
    "Every error names the argument and what was expected."
)
_FIELD = re.compile(r"^([A-Za-z_][\w.]*(?:\s*×\s*[\w.]+)?)")
_EXPECTED = re.compile(r"expected (.+)$")


def error_result(field: str | None, expected: str | None, message: str):
    from mcp import types

    payload = {"error": {"field": field, "expected": expected, "message": message}}
    return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(payload))],
                                structured_content=payload, is_error=True)


def _refusal(exc: TrackwayError):
    """A trackway error as the structured error every tool answers: the field it names and what was expected."""
    if isinstance(exc, AgentRefused):
        return error_result(exc.field, exc.expected, str(exc))
    # A check shared with the CLI names its flag (`--by 'x': ...`): here the agent sent an argument.
    message = re.sub(r"^--([a-z][a-z-]*)", lambda flag: flag[1].replace("-", "_"), str(exc))
    field = _FIELD.match(message)
    expected = _EXPECTED.search(message)
    return error_result(field[1] if field else None, expected[1].split(";")[0] if expected else None, message)


def build_server(session: AgentSession):
    """An MCPServer whose tools act for `session.agent`."""
    from mcp.server.mcpserver import MCPServer

    known: dict[str, set[str]] = {}

    async def refuse_unknown_arguments(ctx, call_next):
        if ctx.method == "tools/call" and isinstance(ctx.params, dict):
            name, given = ctx.params.get("name"), ctx.params.get("arguments") or {}
            unknown = sorted(set(given) - known.get(name, set(given))) if isinstance(given, dict) else []
            if unknown:
                expected = ", ".join(sorted(known[name])) or "no arguments"
                return error_result(unknown[0], f"one of {expected}",
                                    f"{unknown[0]}: not an argument of {name}; expected one of {expected}")
        return await call_next(ctx)

    server = MCPServer("trackway", instructions=INSTRUCTIONS, middleware=[refuse_unknown_arguments])

    def tool(function):
        """Register `function` (its first argument the session) as a tool answering structured content."""
        signature = inspect.signature(function)
        known[function.__name__] = set(signature.parameters)
        implementation = getattr(tools, function.__name__, None) or getattr(experiment_tools, function.__name__)

        def call(**arguments: Any):
            try:
                return implementation(session, **arguments)
            except TrackwayError as exc:
                return _refusal(exc)

        call.__name__ = function.__name__
        call.__doc__ = function.__doc__
        call.__signature__ = signature.replace(return_annotation=dict[str, Any])
        call.__annotations__ = {**function.__annotations__, "return": dict[str, Any]}
        server.tool(name=function.__name__, description=function.__doc__, structured_output=True)(call)
        return function

    @tool
    def resources() -> dict[str, Any]:
        """The resources runs may go to, with what each can take now: free GPUs, jobs running and pending."""

    @tool
    def budget() -> dict[str, Any]:
        """Your GPU-hour budget: spent, held by your unfinished runs, left; and your cap on unfinished runs."""

    @tool
    def runs(mine_only: Annotated[bool, Field(description="Only the runs you started.")] = True,
             limit: Annotated[int, Field(description="At most this many runs, newest first (1 to 500).")] = 20,
             ) -> dict[str, Any]:
        """Runs newest first, each with its state, resource and GPUs."""

    @tool
    def preflight(
        config: Annotated[dict[str, Any], Field(description="The run's config, with a [preflight] section naming the "
                                                            "model and batch shape.")],
        gpu_count: Annotated[int, Field(description="GPUs the run trains on.")] = 1,
        resource: Annotated[str | None, Field(description="Judge on this declared resource only.")] = None,
        model_family: Annotated[str | None, Field(description="Use the calibration kept for this family.")] = None,
    ) -> dict[str, Any]:
        """Whether the run fits in GPU memory wherever it may go: the peak per GPU and the verdict per resource."""

    @tool
    def submit(
        script: Annotated[str, Field(description="A Python file's path relative to the server's working directory.")],
        args: Annotated[list[str] | None, Field(description="Arguments after the script.")] = None,
        kind: Annotated[str, Field(description="'test' (a short run that checks a hypothesis) or 'full'.")] = "test",
        gpu_count: Annotated[int, Field(description="GPUs in all (0 for CPU).")] = 0,
        time_limit_hours: Annotated[float | None, Field(
            description="The run's time limit in hours; needed for a run with GPUs when you have a budget.")] = None,
        name: Annotated[str | None, Field(description="A unique name to address the run by.")] = None,
        project: Annotated[str, Field(description="The project the run belongs to.")] = "default",
        config: Annotated[dict[str, Any] | None, Field(description="The run's config, kept in its receipt.")] = None,
        set: Annotated[list[str] | None, Field(description="Config overrides KEY=VALUE.")] = None,
        resource: Annotated[str | None, Field(description="A declared resource, or 'auto'.")] = None,
        expect: Annotated[list[str] | None, Field(
            description="Acceptance criteria judged as metrics land, e.g. 'final.loss < 2.0'.")] = None,
        watch: Annotated[list[str] | None, Field(
            description="Watcher thresholds KIND.KEY=VALUE, e.g. 'loss_rising.window=200 steps'.")] = None,
        dry_run: Annotated[bool, Field(
            description="Only say what would be submitted (resource, why, the script or command); record nothing.")] = False,
    ) -> dict[str, Any]:
        """Start a run of `script`, credited to you, if it fits your budget and your cap on unfinished runs."""

    @tool
    def wait(run: Annotated[str, Field(description="A run id or name, or one attempt RUN/N.")],
             timeout_s: Annotated[float, Field(description="Seconds to wait at most (above 0, at most 600).")] = 300.0,
             ) -> dict[str, Any]:
        """Wait for a run (or one attempt) to end: its state, the attempt's termination reason, evidence and the retry
        decision."""

    @tool
    def explain(ref: Annotated[str, Field(description="A run (its latest attempt) or one attempt RUN/N.")],
                ) -> dict[str, Any]:
        """Every fact about an attempt: config, placement, checkpoints, the ending with its evidence, what happens next."""

    @tool
    def metrics(run: Annotated[str, Field(description="A run id or name.")],
                key: Annotated[str, Field(description="The metric, e.g. loss.")] = "loss",
                max_points: Annotated[int, Field(description="At most this many points, evenly thinned (2 to 2000).")] = 200,
                ) -> dict[str, Any]:
        """A metric's history by step, thinned to at most `max_points` points."""

    @tool
    def logs(ref: Annotated[str, Field(description="A run (its latest attempt) or one attempt RUN/N.")],
             lines: Annotated[int, Field(description="How many lines from the end (1 to 2000).")] = 50,
             ) -> dict[str, Any]:
        """The last lines of an attempt's output."""

    @tool
    def cancel(run: Annotated[str, Field(description="One of your runs, by id or name.")]) -> dict[str, Any]:
        """End one of your own runs; its end is recorded as user_cancelled."""

    @tool
    def resume(run: Annotated[str, Field(description="One of your runs that ended without completing.")],
               set: Annotated[list[str] | None, Field(description="Config overrides KEY=VALUE from this attempt on.")] = None,
               ) -> dict[str, Any]:
        """A new attempt of one of your runs from its latest committed checkpoint, with the code it was submitted with."""

    @tool
    def report_waste(
        by: Annotated[str, Field(description="reason, run, resource or phase.")] = "reason",
        days: Annotated[float, Field(description="Attempts that started in the last DAYS days.")] = 7.0,
        kind: Annotated[str | None, Field(description="test, full, eval or all.")] = None,
    ) -> dict[str, Any]:
        """Which retries did real work: useful and wasted GPU-hours per reason, run, resource or phase."""

    @tool
    def evaluate(
        checkpoint: Annotated[str, Field(description="RUN@STEP, or RUN for its newest committed checkpoint.")],
        spec: Annotated[str, Field(description="An eval spec file (TOML) in the server's working directory.")],
        seeds: Annotated[int | None, Field(description="Run this many seeds now (the spec's first N).")] = None,
    ) -> dict[str, Any]:
        """Evaluate a committed checkpoint with pinned versions; the same checkpoint and versions again is a repeat."""

    @tool
    def eval_show(evaluation: Annotated[str, Field(description="An evaluation id.")]) -> dict[str, Any]:
        """An evaluation: checkpoint, pinned versions, each seed's state and metrics, aggregated metrics."""

    @tool
    def sql(query: Annotated[str, Field(description="One read-only statement (PostgreSQL dialect), e.g. "
                                                    "\"select * from training_attempts limit 5\".")],
            max_rows: Annotated[int, Field(description="At most this many rows (1 to 10000).")] = 200,
            ) -> dict[str, Any]:
        """A read-only query over the ledger."""

    @tool
    def experiment_new(
        title: Annotated[str, Field(description="A short title, e.g. 'double the learning rate'.")],
        hypothesis: Annotated[str, Field(description="The falsifiable statement under test.")],
        baseline: Annotated[str | None, Field(description="The run the hypothesis is measured against.")] = None,
        parent: Annotated[str | None, Field(
            description="The previous experiment: its full run is the baseline if it was supported.")] = None,
        set: Annotated[list[str] | None, Field(description="The change: config overrides KEY=VALUE.")] = None,
        expect: Annotated[list[str] | None, Field(
            description="Criteria, e.g. 'final.loss < baseline.final.loss * 0.98'.")] = None,
        name: Annotated[str | None, Field(description="A unique name to address the experiment by.")] = None,
        gpus: Annotated[int | None, Field(description="GPUs per run (default: the baseline's).")] = None,
        time_limit_hours: Annotated[float | None, Field(
            description="The full run's time limit in hours (default: the baseline's).")] = None,
        resource: Annotated[str | None, Field(description="A declared resource or 'auto'.")] = None,
        branch: Annotated[str | None, Field(
            description="The change is this branch's code against the commit the baseline ran (no `set` then).")] = None,
        commit: Annotated[str | None, Field(description="As branch, for one commit.")] = None,
    ) -> dict[str, Any]:
        """Record a hypothesis against a baseline run: its change (config overrides, or a branch's or commit's code) and
        criteria. Nothing runs yet."""

    @tool
    def experiment_start(
        experiment: Annotated[str, Field(description="A planned experiment (id or name).")],
        max_steps: Annotated[int | None, Field(description="The test run's steps (default: chosen from the config).")] = None,
        test_time_limit_hours: Annotated[float, Field(description="The test run's time limit in hours.")] = 1.0,
        budget_gpu_hours: Annotated[float | None, Field(
            description="Refuse a full run estimated above this many GPU-hours.")] = None,
        skip_test: Annotated[bool, Field(description="Submit the full run at once (recorded).")] = False,
        again: Annotated[bool, Field(description="A new test run of an experiment stopped before its full run.")] = False,
        test_resource: Annotated[str | None, Field(
            description="A declared resource for the test run alone (default: the full run's).")] = None,
        test_gpus: Annotated[int | None, Field(description="GPUs of the test run alone (default: the full run's).")] = None,
    ) -> dict[str, Any]:
        """Submit the gated test run; the full run follows when every check passes (or waits for a person)."""

    @tool
    def experiment_wait(
        experiment: Annotated[str, Field(description="An experiment (id or name).")],
        timeout_s: Annotated[float, Field(description="Seconds to wait at most (above 0, at most 600).")] = 300.0,
    ) -> dict[str, Any]:
        """Wait until the experiment concludes or stops, or its full run waits for a person; then show it."""

    @tool
    def experiment_show(experiment: Annotated[str, Field(description="An experiment (id or name).")]) -> dict[str, Any]:
        """The experiment: hypothesis, changes, criteria with their numbers, test-run checks, runs and verdict."""

    @tool
    def experiment_batch(
        baseline: Annotated[str, Field(description="The run every hypothesis is measured against.")],
        hypotheses: Annotated[list[dict[str, Any]], Field(
            description="Each {title, hypothesis, set: [KEY=VALUE], expect: [criterion]}: one change each.")],
        expect: Annotated[list[str] | None, Field(description="Criteria every hypothesis is judged by.")] = None,
        budget_gpu_hours: Annotated[float | None, Field(
            description="GPU-hours the whole batch may spend (at most what your budget has left).")] = None,
        max_running: Annotated[int, Field(description="Experiments in flight at once (at most your cap's room).")] = 2,
        test_time_limit_hours: Annotated[float, Field(description="Each test run's time limit in hours.")] = 1.0,
        name: Annotated[str | None, Field(description="A unique name for the batch.")] = None,
    ) -> dict[str, Any]:
        """Test a wave of hypotheses against one baseline: experiments sharing a budget, started as room allows."""

    @tool
    def experiment_batch_wait(
        batch: Annotated[str, Field(description="A batch id or name, or one of its experiments.")],
        timeout_s: Annotated[float, Field(description="Seconds to wait at most (above 0, at most 600).")] = 300.0,
    ) -> dict[str, Any]:
        """Wait for a batch to finish; its table: each member's change, verdict and criteria with their numbers."""

    @tool
    def experiments_chain(
        experiment: Annotated[str, Field(description="Any experiment of the chain (id or name).")],
        metric: Annotated[str, Field(description="The key metric shown per iteration.")] = "loss",
    ) -> dict[str, Any]:
        """The iterations around an experiment: each verdict, key metric, compute, and what followed."""

    # Receipts and explain texts as resources an agent can read into its context.
    def readable(function, *args: str):
        try:
            return function(session, *args)
        except TrackwayError as exc:
            return json.dumps({"error": {"message": str(exc)}})

    @server.resource("trackway://runs/{run}/explain", mime_type="text/markdown",
                     description="The run's latest attempt explained: ending, evidence, checkpoints, retries, what next.")
    def run_explained(run: str) -> str:
        return readable(tools.explain_markdown, run)

    @server.resource("trackway://runs/{run}/attempts/{number}/explain", mime_type="text/markdown",
                     description="One attempt explained.")
    def attempt_explained(run: str, number: str) -> str:
        return readable(tools.explain_markdown, f"{run}/{number}")

    @server.resource("trackway://runs/{run}/attempts/{number}/receipt", mime_type="application/json",
                     description="One attempt's receipt as the ledger holds it.")
    def attempt_receipt(run: str, number: str) -> str:
        return readable(lambda s, ref: json.dumps(tools.receipt(s, ref)), f"{run}/{number}")

    @server.prompt(description="Walk one hypothesis through trackway: test run, full run, analysis.")
    def research_loop(hypothesis: str, baseline: str) -> str:
        return RESEARCH_LOOP.format(hypothesis=hypothesis, baseline=baseline)

    return server


RESEARCH_LOOP = """You are testing a hypothesis with trackway, which runs and supervises training and keeps every attempt.

Hypothesis: {hypothesis}
Baseline run: {baseline}

1. Call `budget` and `resources`: know what you may spend and what is free now.
2. Call `experiment_new` with the baseline, ONE change as config overrides (`set`), and criteria (`expect`) that
   would show the hypothesis wrong, e.g. "final.loss <= baseline.final.loss * 0.98".
3. Call `experiment_start`: it submits a short test run; the full run follows only when every check passes.
4. Call `experiment_wait` until it concludes. If the full run waits for a person's approval, say so and stop:
   a person decides with `trackway approve RUN`.
5. Read the verdict with each criterion's numbers (`experiment_show`), the curves (`metrics`), and any failed
   attempt's ending (`explain`, or the resource trackway://runs/RUN/explain). State only what the numbers show.
6. Decide the next step: build on a supported change (`experiment_new` with `parent`), revert a rejected one,
   measure again an inconclusive one. `experiments_chain` shows the iterations so far.
"""


def serve_stdio(session: AgentSession) -> None:
    """Serve the tools on stdin/stdout until the agent hangs up."""
    import anyio

    anyio.run(build_server(session).run_stdio_async)
