"""`trackway eval` (request, show, compare) and `trackway evals`: evaluations of a run's checkpoints."""

from __future__ import annotations

import json
import time

import typer
from sqlalchemy import select
from typer.core import TyperGroup

from trackway.cli.end_line import decision_of, end_line
from trackway.cli.context import AppContext, app_context
from trackway.cli.render import (
    KEY,
    Column,
    console,
    duration,
    err_console,
    fact,
    plain,
    print_json,
    say,
    short_time,
    table,
)
from trackway.validation import checkpoint_ref

FOLLOW_INTERVAL_S = 0.25


class _DefaultToRun(TyperGroup):
    """`trackway eval CHECKPOINT --spec F` is `trackway eval run CHECKPOINT --spec F`."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


eval_app = typer.Typer(
    cls=_DefaultToRun,
    help="Evaluate a checkpoint (`trackway eval RUN@STEP --spec FILE`), show an evaluation, compare two.",
    no_args_is_help=True,
)


@eval_app.command("run")
def eval_run(
    ctx: typer.Context,
    checkpoint: str = typer.Argument(..., help="RUN@STEP, RUN@step-00000050, or RUN for its newest committed checkpoint."),
    spec: str = typer.Option(..., "--spec", help="The eval spec (TOML)."),
    seeds: int = typer.Option(None, "--seeds", help="Run this many seeds now (the spec's first N), skipping escalation."),
    detach: bool = typer.Option(False, "--detach", help="Print the evaluation id and return; the supervisor runs it."),
) -> None:
    """Evaluate a committed checkpoint with an eval spec; the same checkpoint and versions again is a repeat."""
    from trackway.cli.runs_cmd import reconcile
    from trackway.evals.launch import request_evaluation, seeds_for
    from trackway.evals.records import parse_checkpoint_ref
    from trackway.evals.spec import load_spec
    from trackway.supervisor.submit import check_eval_resource

    app = app_context(ctx)
    loaded = load_spec(spec)
    seeds_for(loaded, seeds)  # refused before a checkpoint is pinned for it
    check_eval_resource(loaded, app.settings)
    run_ref, step = parse_checkpoint_ref(checkpoint_ref(checkpoint))
    reconcile(app)
    supervisor = app.supervisor()
    request = request_evaluation(app.ledger, app.settings, run_ref, step, loaded, seed_count=seeds)
    console.print(request.eval_id, highlight=False)
    if request.repeat:
        say(err_console, app.hint(
            f"{request.eval_id} is a repeat: this checkpoint was evaluated with the same evaluator version, task set "
            f"and decoding; nothing new to run (`trackway eval show {request.eval_id}`)"
        ))
        return
    held = f"; seeds {request.held_back_seeds} wait for escalation" if request.held_back_seeds else ""
    say(err_console, f"evaluating with {loaded.name}: seeds {request.queued_seeds}{held}")
    if detach:
        from trackway.cli.supervise_cmd import ensure_background_supervisor

        ensure_background_supervisor(app)
        return
    raise typer.Exit(_follow(app, supervisor, request.eval_id))


def _follow(app: AppContext, supervisor, eval_id: str) -> int:
    from trackway.evals.records import COMPLETED, IN_FLIGHT, SEED_PENDING, resolve_evaluation, seeds_of

    started = time.monotonic()
    try:
        with err_console.status("", spinner="dots") as status:
            while True:
                for end in supervisor.tick():
                    with app.ledger.read() as conn:
                        mine = {s["eval_run_id"]: f"seed {s['seed']}" for s in seeds_of(conn, eval_id)}
                        mine.update({s["inference_run_id"]: f"seed {s['seed']} inference"
                                     for s in seeds_of(conn, eval_id) if s["inference_run_id"]})
                    if end.run_id in mine:
                        say(err_console, f"{mine[end.run_id]}: " + end_line(
                            end.attempt_id, end.reason.value, decision_of(end), process=False))
                with app.ledger.read() as conn:
                    evaluation = resolve_evaluation(conn, eval_id)
                    seeds = seeds_of(conn, eval_id)
                if evaluation["state"] != IN_FLIGHT:
                    break
                done = sum(1 for s in seeds if s["state"] != SEED_PENDING)
                status.update(f"{eval_id} {done}/{len(seeds)} seeds done {duration(time.monotonic() - started)}")
                time.sleep(FOLLOW_INTERVAL_S)
    except KeyboardInterrupt:
        from trackway.cli.supervise_cmd import ensure_background_supervisor

        err_console.print(f"stopped following; {eval_id} goes on under the supervisor", highlight=False)
        ensure_background_supervisor(app)  # this process was the one driving it
        return 130
    _print_detail(app, eval_id)
    return 0 if evaluation["state"] == COMPLETED else 1


@eval_app.command("rescore")
def eval_rescore(
    ctx: typer.Context,
    evaluation: str = typer.Argument(..., help="An evaluation id (ev…) in two phases, or one of its seed runs."),
    spec: str = typer.Option(..., "--spec", help="The eval spec (TOML) whose scoring phase (and judge) scores again."),
    detach: bool = typer.Option(False, "--detach", help="Print the evaluation id and return; the supervisor runs it."),
) -> None:
    """Score an evaluation's committed inference outputs again with a spec's scorer and judge: no generation, no GPU."""
    from trackway.cli.runs_cmd import reconcile
    from trackway.evals.launch import rescore_evaluation
    from trackway.evals.spec import load_spec
    from trackway.supervisor.submit import check_eval_resource

    app = app_context(ctx)
    loaded = load_spec(spec)
    check_eval_resource(loaded, app.settings)
    reconcile(app)
    supervisor = app.supervisor()
    request = rescore_evaluation(app.ledger, app.settings, evaluation, loaded)
    console.print(request.eval_id, highlight=False)
    if request.repeat:
        say(err_console, app.hint(
            f"{request.eval_id} is a repeat: these outputs were scored with the same scorer, judge and rubric; "
            f"nothing new to run (`trackway eval show {request.eval_id}`)"))
        return
    say(err_console, f"scoring the stored outputs of seeds {request.queued_seeds} with {loaded.name}")
    if detach:
        from trackway.cli.supervise_cmd import ensure_background_supervisor

        ensure_background_supervisor(app)
        return
    raise typer.Exit(_follow(app, supervisor, request.eval_id))


@eval_app.command("show")
def eval_show(
    ctx: typer.Context,
    evaluation: str = typer.Argument(
        ..., help="An evaluation id (ev…), a checkpoint RUN@STEP (or RUN: its newest evaluated), or a seed run."
    ),
    spec: str = typer.Option(None, "--spec", help="The spec name, when RUN@STEP was evaluated by several."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """One evaluation: checkpoint, pinned versions, decoding, per-seed metrics and attempts, sampled failures."""
    from trackway.cli.runs_cmd import reconcile
    from trackway.evals.tables import evaluation_detail

    app = app_context(ctx)
    reconcile(app)
    with app.ledger.read() as conn:
        eval_id = evaluation_id(conn, checkpoint_ref(evaluation), spec)
        if as_json:
            print_json(evaluation_detail(conn, eval_id))
            return
    _print_detail(app, eval_id)


def evaluation_id(conn, ref: str, spec_name: str | None = None) -> str:
    """The evaluation `ref` names: an evaluation id, a seed run (id or name), or a checkpoint `RUN@STEP`
    (its newest evaluation, in any state; `spec_name` chooses among specs), or `RUN` (its newest checkpoint's)."""
    from trackway.errors import Ambiguous, NotFound
    from trackway.evals.records import evaluations_of_run, parse_checkpoint_ref, resolve_evaluation
    from trackway.ledger.records import resolve_run
    from trackway.ledger.schema import runs

    seed_run = conn.execute(select(runs.c.run_id).where(runs.c.name == ref.strip())).scalar()
    try:
        return resolve_evaluation(conn, seed_run or ref)["eval_id"]
    except NotFound as exc:
        not_an_evaluation = exc
    run_ref, step = parse_checkpoint_ref(ref)
    try:
        run = resolve_run(conn, run_ref)
    except NotFound:
        # A bare word that is neither an evaluation nor a run: say it as an evaluation was asked for.
        raise (not_an_evaluation if "@" not in ref else NotFound(
            f"evaluation {ref!r}: no run {run_ref!r} (see `trackway runs`)")) from None
    found = evaluations_of_run(conn, run["run_id"], spec_name)
    if step is None and found:
        step = max(int(e["checkpoint_step"]) for e in found)
    found = [e for e in found if int(e["checkpoint_step"]) == step]
    if not found:
        with_spec = f" with spec {spec_name!r}" if spec_name else ""
        raise NotFound(
            f"evaluation {ref!r}: that checkpoint has no evaluation{with_spec} (see `trackway evals {run_ref}`)"
        )
    specs = sorted({e["spec_name"] for e in found})
    if len(specs) > 1:
        raise Ambiguous(f"evaluation {ref!r}: evaluated by several specs ({', '.join(specs)}); choose one with --spec")
    return found[-1]["eval_id"]


def _print_detail(app: AppContext, ref: str) -> None:
    from trackway.evals.tables import evaluation_detail

    with app.ledger.read() as conn:
        d = evaluation_detail(conn, ref)
    label = d["run_name"] or d["run_id"]
    say(console, plain(f"evaluation {d['eval_id']}", style="bold") + plain(f": {d['state']}"))
    facts = [
        ("checkpoint", f"{label}@{d['step']} ({d['checkpoint']}, manifest {d['checkpoint_manifest_sha256'][:12]})"),
        ("spec", f"{d['spec']} ({d['spec_path']}), trigger {d['trigger']}"),
        ("evaluator", f"{d['evaluator_version']}  {' '.join(d['command'])}"),
        ("task set", f"{d['task_set_sha256']}  {d['task_set']}" if d["task_set"] is not None
         else "bundled with the evaluator (its version covers the tasks)"),
        ("decoding", ", ".join(f"{k}={v}" for k, v in sorted(d["decoding"].items())) or "-"),
        ("time", f"{short_time(d['created_at'])} → {short_time(d['ended_at'])}"),
    ]
    if "inference" in d:
        facts[2] = ("evaluator", f"{d['evaluator_version']} (inference and scoring code)")
        for phase in ("inference", "scoring"):
            spec = d[phase]
            total = d["phase_totals"].get(phase)
            spent = ("" if total is None else f"; {total['attempts']} attempt(s), "
                     f"{total['gpu_seconds'] / 3600:.3f} GPU-h, ${total['cost_usd']:.2f}")
            where = f"{spec.get('resource') or 'the training run’s resource'}, {spec['gpus']} GPU(s)"
            served = f", server {' '.join(spec['server'])}" if spec.get("server") else ""
            facts.append((phase, f"{' '.join(spec['command'])} on {where}{served}{spent}"))
    if d.get("judge"):
        j = d["judge"]
        who = (f"{j['model']} version {j['version']}" if j.get("model")
               else f"local {' '.join(j['command'])} (code {j['code_sha256']})")
        facts.append(("judge", f"{who}; rubric {j['rubric']} ({j['rubric_sha256']})"))
    if d.get("output_fields"):
        facts.append(("output", ", ".join(
            f"{k} = {'(none)' if v is False else v}" for k, v in sorted(d["output_fields"].items()))))
    if d["escalation"]:
        e = d["escalation"]
        if e.get("decided") is None:
            what = f"waiting for seeds {e['first_seeds']} before deciding on {e['held_back']}"
        else:
            value = "no result" if e.get("value") is None else f"{e['condition'].split()[0]} = {e['value']:.4f}"
            what = (f"{value}: {'cleared' if e['decided'] == 'escalated' else 'did not clear'} {e['condition']}; "
                    + (f"ran seeds {e['held_back']}" if e["decided"] == "escalated" else f"seeds {e['held_back']} not run"))
        facts.append(("escalation", what))
    for key, value in facts:
        fact(console, key, value, 11)
    metric_names = list(d["metrics"]) or sorted({m for s in d["seeds"] for m in s["metrics"]})
    # A narrow terminal keeps the seed, its state and its metrics; counts and the attempt chain go first.
    console.print(table(
        None,
        [Column("seed", KEY, right=True), Column("run", 40), Column("state", KEY),
         Column("endings", 30, shorten_to=12), Column("samples", 20, right=True), Column("tasks", 20, right=True),
         *(Column(m, 90 - i, right=True) for i, m in enumerate(metric_names))],
        (
            (s["seed"], s["eval_run_id"], s["state"] + (f" ({s['termination_reason']})" if s["state"] == "failed" else ""),
             _endings(s),
             s["samples"], s["tasks"], *(_pct(s["metrics"].get(m)) for m in metric_names))
            for s in d["seeds"]
        ),
    ))
    for metric, agg in d["metrics"].items():
        say(console, f"  {metric}: mean {_pct(agg['mean'])} ± {_pct(agg['std'])} (min {_pct(agg['min'])}, "
                     f"max {_pct(agg['max'])}, {agg['seeds']} seed(s))")
    failures = [(s["seed"], f) for s in d["seeds"] for f in s["failures"]]
    if failures:
        console.print("  sampled failures:", highlight=False)
        for seed, failure in failures[:10]:
            extra = "".join(f", {k} {json.dumps(v, ensure_ascii=False)}" for k, v in failure.items()
                            if k not in ("task_id", "sample", "correct", "output"))
            # The evaluator's output is data: `[a]` in an answer must not vanish as markup.
            say(console, f"    seed {seed} task {failure['task_id']} sample {failure['sample']}: output "
                         f"{json.dumps(failure['output'], ensure_ascii=False)}{extra}")


def _endings(seed: dict) -> str:
    """A seed's attempt endings in order; in two phases, each phase's (`inference: completed; scoring: ...`)."""
    def chain(attempts: list[dict]) -> str:
        return " → ".join(f"{a['termination_reason'] or 'running'}" for a in attempts) or "-"

    if "phases" not in seed:
        return chain(seed["attempts"])
    return "; ".join(f"{phase}: {chain(run['attempts'])}" for phase, run in seed["phases"].items())


@eval_app.command("compare")
def eval_compare(
    ctx: typer.Context,
    a: str = typer.Argument(..., help="An evaluation id, or a checkpoint RUN@STEP."),
    b: str = typer.Argument(..., help="An evaluation id, or a checkpoint RUN@STEP."),
    spec: str = typer.Option(None, "--spec", help="The spec name, when a checkpoint was evaluated by several."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Which tasks flipped between two checkpoints' evaluations (same task set)."""
    from trackway.cli.runs_cmd import reconcile
    from trackway.evals.tables import PASS_SHARE, compare

    app = app_context(ctx)
    reconcile(app)
    with app.ledger.read() as conn:
        result = compare(conn, checkpoint_ref(a, "A"), checkpoint_ref(b, "B"), spec)
    if as_json:
        print_json(result)
        return
    for side, ref in (("a", a), ("b", b)):
        s = result[side]
        metrics = ", ".join(f"{m} {_pct(v['mean'])}" for m, v in s["metrics"].items())
        say(console, f"{side.upper()}: {ref} → {s['eval_id']} step {s['step']}: {metrics}")
    if not result["same_evaluator"]:
        console.print("note: the two evaluator versions differ; a flip may be the evaluator's doing", highlight=False)
    console.print(f"{result['tasks_compared']} tasks compared; a task passes when ≥ {PASS_SHARE:.0%} of its samples "
                  f"are correct: {len(result['gained'])} gained, {len(result['lost'])} lost", highlight=False)
    rows = [("gained", t["task_id"], _pct(t["before"]), _pct(t["after"])) for t in result["gained"]]
    rows += [("lost", t["task_id"], _pct(t["before"]), _pct(t["after"])) for t in result["lost"]]
    if rows:
        console.print(table(None, [Column("flip", KEY), Column("task", KEY, shorten_to=16),
                                   Column("correct in A", 50, right=True), Column("correct in B", 50, right=True)], rows))


def evals(
    ctx: typer.Context,
    run: str = typer.Argument(..., help="A training run id or name."),
    spec: str = typer.Option(None, "--spec", help="Only evaluations by this spec name."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The run's checkpoints with their evaluations: step, progress, each metric per seed and aggregated."""
    from trackway.cli.runs_cmd import reconcile
    from trackway.evals.tables import run_table
    from trackway.ledger.records import resolve_run
    from trackway.supervisor.retry import run_config

    from trackway.experiments.expectation_verdicts import verdict_of

    app = app_context(ctx)
    reconcile(app)
    with app.ledger.read() as conn:
        row = resolve_run(conn, run)
        run_id = row["run_id"]
        result = run_table(conn, run_id, run_config(app.settings, run_id), spec)
    # The run's own criteria (`submit --expect`): each one's verdict, and per evaluated step whether it held there.
    result["expectations"] = verdict_of(dict(row))
    judged_at = [{c["step"]: c["holds"] for c in judged["checkpoints"]} for judged in result["expectations"]]
    per_step = [i for i, judged in enumerate(result["expectations"]) if judged["checkpoints"]]
    for r in result["evaluations"]:
        r["criteria"] = {result["expectations"][i]["criterion"]: judged_at[i].get(r["step"]) for i in per_step}
    if as_json:
        print_json(result)
        return
    rows = result["evaluations"]
    if not rows:
        say(console, app.hint(
            f"{run}: no evaluations yet (submit with --eval SPEC, or `trackway eval {run}@STEP --spec FILE`)"
        ))
        _print_expectations(result["expectations"])
        return
    shown = list(dict.fromkeys(m for r in rows for m in r["shown_metrics"]))
    # A metric is a number: shown whole or not at all. Its mean outlasts its per-seed values on a
    # narrow terminal, and both outlast the evaluator version and the progress.
    metric_columns = []
    for i, m in enumerate(shown):
        metric_columns += [Column(m, 90 - i, right=True), Column(f"{m} per seed", 25 - i)]
    console.print(table(
        f"{result['run_name'] or result['run_id']}: evaluations" + (f" ({result['total_steps']} steps)" if result["total_steps"] else ""),
        [Column("checkpoint", KEY), Column("step", 20, right=True), Column("progress", 35, right=True),
         Column("spec", 60, shorten_to=10), Column("state", KEY), *metric_columns,
         *(Column(f"#{i + 1}", KEY) for i in per_step),
         Column("evaluator", 10, shorten_to=12), Column("eval", 80)],
        (
            (r["checkpoint"], r["step"], "not known" if r["progress"] is None else f"{r['progress']:.0%}", r["spec"],
             r["state"], *(cell for m in shown for cell in _cells(r, m)),
             *(_held(judged_at[i].get(r["step"])) for i in per_step), r["evaluator_version"][:19], r["eval_id"])
            for r in rows
        ),
    ))
    _print_expectations(result["expectations"])


def _held(holds: bool | None) -> str:
    return {True: "holds", False: "fails"}.get(holds, "n/a")


def _print_expectations(expectations: list[dict]) -> None:
    """The run's own criteria under the table, numbered as its columns: each one's verdict and numbers."""
    from trackway.cli.render import console, fact, plain, say

    if not expectations:
        return
    say(console, plain("expected (submit --expect)", style="bold"))
    for i, judged in enumerate(expectations):
        fact(console, f"#{i + 1}", f"{judged['state']}: {judged['criterion']} ({judged['why']})", 4)


def _cells(row: dict, metric: str) -> tuple[str, str]:
    """(mean ± spread, [each seed's value]) of one metric of one evaluation."""
    agg = row["metrics"].get(metric)
    if agg is None:
        return "-", "-"
    seeds = " ".join(_pct(values.get(metric)) for values in row["per_seed"].values())
    spread = f" ± {_pct(agg['std'])}" if agg["seeds"] > 1 else ""
    return f"{_pct(agg['mean'])}{spread}", f"[{seeds}]"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def register(app: typer.Typer) -> None:
    app.add_typer(eval_app, name="eval")
    app.command("evals")(evals)
