"""`trackway resources`: the resources trackway.toml declares, with what each can take now and how long asking took."""

from __future__ import annotations

import typer

from trackway.cli.context import app_context
from trackway.cli.jsonout import print_json


def resources(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List the resources runs may go to, with live availability (free GPUs, jobs running and pending)."""
    from trackway.resources.availability import look_up, resource_record
    from trackway.resources.placement import candidates

    app = app_context(ctx)
    declared = candidates(app.settings)
    from trackway.resources.own_queue import own_jobs

    with app.ledger.read() as conn:
        jobs = own_jobs(conn)
    found = look_up(declared, home=app.settings.home, own_jobs=jobs)
    if as_json:
        print_json([resource_record(resource, found[resource.name]) for resource in declared])
        return
    from trackway.cli.render import KEY, Column, console, err_console, table

    rows = []
    for resource in declared:
        row = found[resource.name]
        gpus = "-" if row.total_gpus is None else f"{row.free_gpus}/{row.total_gpus}"
        model = resource.gpu or row.gpu_model or ""
        memory = resource.gpu_memory_gb if resource.gpu_memory_gb is not None else row.gpu_memory_gb
        jobs = "-" if row.running_jobs is None else f"{row.running_jobs}/{row.pending_jobs}"
        tiers = " ".join(f"{tier.name}≤{tier.max_hours:g}h" for tier in resource.qos)
        rows.append([
            resource.name, resource.executor, gpus if row.reachable else "unreachable", model,
            "" if memory is None else f"{memory:g}", jobs, f"{resource.cost_per_gpu_hour:.2f}",
            ",".join(resource.use_for), tiers, f"{row.lookup_ms:.0f}",
        ])
    console.print(table(
        None,
        [Column("resource", KEY), Column("executor", 80), Column("gpus free", 90, right=True), Column("gpu", 50, shorten_to=8),
         Column("gb", 40, right=True), Column("run/pend", 70, right=True), Column("$/gpu-h", 30, right=True),
         Column("use for", 20, shorten_to=6), Column("qos", 35, shorten_to=8), Column("ms", 15, right=True)],
        rows,
    ))
    for resource in declared:
        row = found[resource.name]
        if not row.reachable:
            err_console.print(f"{resource.name}: {row.error}", highlight=False, markup=False)
            continue
        for pool in row.pools or ():
            asked = "requested not known" if pool["requested"] is None else f"{pool['requested']} requested"
            console.print(f"{resource.name} ({resource.namespace}) pool {pool['name']}: {pool['allocatable']} GPUs "
                          f"allocatable, {asked}, {pool['nodes']} node{'s' if pool['nodes'] != 1 else ''}",
                          highlight=False, markup=False)
        if row.note:
            err_console.print(f"{resource.name}: {row.note}", highlight=False, markup=False)
    if not app.settings.resources:
        err_console.print(app.hint("no [resources.NAME] in trackway.toml: runs go to this machine "
                                   "(`trackway init` writes a commented example)"), highlight=False)


def register(app: typer.Typer) -> None:
    app.command("resources")(resources)
