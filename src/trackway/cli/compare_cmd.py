"""`trackway compare RUN RUN...`: runs side by side: config, code and data that differ, final metrics, cost, criteria."""

from __future__ import annotations

import typer

from trackway.cli.context import app_context
from trackway.cli.render import KEY, Column, console, fact, plain, print_json, say, short_sha, table


def compare(
    ctx: typer.Context,
    refs: list[str] = typer.Argument(..., metavar="RUN RUN...", help="Two or more runs (ids or names); the first is "
                                     "the one the others' metrics are measured against."),
    show_all: bool = typer.Option(False, "--all", help="Every config key, not only those that differ."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Runs side by side: the config keys that differ, code and data, final and best metrics, state and cost."""
    from trackway.cli.runs_cmd import reconcile
    from trackway.display import span
    from trackway.reports.compare import compare as facts_of

    app = app_context(ctx)
    reconcile(app)
    with app.ledger.read() as conn:
        facts = facts_of(conn, list(refs))
    if as_json:
        print_json(facts)
        return
    runs = facts["runs"]
    names = [r["name"] or r["run_id"] for r in runs]
    # Narrow terminals keep the first runs: the baseline and those right after it.
    columns = [Column("", KEY)] + [Column(name, KEY if i < 2 else 100 - i, right=True) for i, name in enumerate(names)]

    def row(label: str, values) -> tuple:
        return (label, *values)

    console.print(table("runs", columns, [
        row("state", (r["state"] + (f" ({r['ended_as']})" if r["ended_as"] and r["ended_as"] != r["state"] else "")
                      for r in runs)),
        row("steps", (_n(r["steps"]) for r in runs)),
        row("attempts", (str(r["attempts"]) for r in runs)),
        row("wall", (span(r["wall_hours"] * 3600) if r["wall_hours"] is not None else "not ended" for r in runs)),
        row("compute", (f"{r['compute_hours']:.3g} {r['compute']}-h" for r in runs)),
        row("cost", (f"${r['cost_usd']:.2f}" for r in runs)),
    ]))
    shown = facts["config"] if show_all else [entry for entry in facts["config"] if not entry["same"]]
    title = (f"config: {len(facts['config']) - facts['config_same']} key(s) differ, {facts['config_same']} the same"
             + ("" if show_all or not facts["config_same"] else " (--all shows them)"))
    if shown:
        console.print(table(title, [Column("key", KEY)] + columns[1:],
                            [row(entry["key"], (_value(v) for v in entry["values"])) for entry in shown]))
    else:
        say(console, plain(title, style="bold"))
    code = facts["code"]
    same = {True: "the same", False: "differs", None: "not known (no git commit recorded)"}[code["same"]]
    say(console, plain(f"code: {same}", style="bold"))
    for name, entry in zip(names, code["runs"]):
        fact(console, name, (f"{entry['repo']} @ {entry['branch'] or 'detached'} {short_sha(entry['commit'])}"
                             + (f" + uncommitted diff {short_sha(entry['uncommitted_diff'])}"
                                if entry["uncommitted_diff"] else "")) if entry["commit"] else "not a git repository")
    data = facts["data"]
    declared = any(data["manifests"])
    say(console, plain(f"data: {'the same' if data['same'] else 'differs'}" if declared else "data: none declared",
                       style="bold"))
    for name, digest in zip(names, data["manifests"] if declared else ()):
        fact(console, name, short_sha(digest) if digest else "no data declared")
    if facts["metrics"]:
        console.print(table(f"metrics: final (best), and the difference from {names[0]}", [Column("metric", KEY)]
                            + columns[1:], [row(m["key"], (_metric(entry, i) for i, entry in enumerate(m["runs"])))
                                            for m in facts["metrics"]]))
    for name, r in zip(names, runs):
        for judged in r["expectations"]:
            fact(console, name, f"expect {judged['state']}: {judged['criterion']} ({judged['why']})")
        if r["experiment"]:
            e = r["experiment"]
            fact(console, name, f"the {e['role']} run of experiment {e['experiment_id']} ({e['title']}): "
                                f"{e['verdict'] or e['status']}")


def _n(value) -> str:
    return "not known" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def _value(value) -> str:
    import json

    return value if isinstance(value, str) else json.dumps(value)


def _metric(entry: dict, index: int) -> str:
    if entry["final"] is None:
        return "not logged"
    said = f"{_n(entry['final'])} ({_n(entry['best'])})"
    if index and entry["delta"] is not None:
        pct = f", {entry['delta_pct']:+.1f}%" if entry["delta_pct"] is not None else ""
        said += f" {entry['delta']:+.4g}{pct}"
    return said


def register(app: typer.Typer) -> None:
    app.command("compare")(compare)
