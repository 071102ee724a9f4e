"""The memory preflight at submit: run it on the resources the run may go to, say it, refuse under --strict.

What it says goes to the submitter's console and into the run's receipt (`runs.preflight`);
placement (resources/placement.py) then passes over the resources it predicts to OOM. A strict
refusal happens before anything is recorded: the user sees one line, the ledger nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from trackway.errors import InputError
from trackway.resources.reading_progress import reading_progress
from trackway.resources.run_preflight import preflight_run, preflight_values, record
from trackway.settings import Settings

if TYPE_CHECKING:
    from trackway.ledger import Ledger
    from trackway.resources.preflight import Report, TargetVerdict


def submit_preflight(
    ledger: Ledger, settings: Settings, config: dict[str, Any] | None, *, strict: bool, resource: str | None,
    cwd: Path, gpus: int, model_family: str | None = None, console: Console | None = None,
) -> str | None:
    """The receipt's preflight record (JSON), or None when the run declares no model and batch shape."""
    mode = "strict" if strict else settings.preflight_mode
    if mode == "off":
        return None
    found = preflight_values(config, settings.preflight_keys)
    if found is None:
        if strict:
            raise InputError("--strict: expected the run's config to declare its model and batch shape for the memory "
                             "preflight (a [preflight] section, or trackway.toml's [preflight] keys)")
        return None
    values, name = found
    base_dir = cwd  # relative paths (seq_lengths, data, model_config) as for --data: from where submit runs
    pool = _pool(settings, resource)

    def correction(family: str | None, precision: str):
        from trackway.resources.calibration import correction_for

        with ledger.read() as conn:
            return correction_for(conn, family, precision)

    source = values.get("seq_lengths") or values.get("data")
    with reading_progress(console, base_dir / source if isinstance(source, str) else None) as advance:
        report = preflight_run(values, name, base_dir, pool, correction, world_size=gpus, model_family=model_family,
                               progress=advance)
    if mode == "strict":
        _refuse_if_oom(report, resource)
    if console is not None:
        _say(console, report, named=bool(resource and resource != "auto"))
    return record(report, values, mode, base_dir)


def _pool(settings: Settings, resource: str | None):
    from trackway.resources.placement import candidates

    if resource and resource != "auto":
        return [settings.resource(resource)]
    return candidates(settings)


def _refuse_if_oom(report: Report, resource: str | None) -> None:
    judged = report.targets
    if not judged:
        raise InputError("--strict: no resource this run may go to declares its GPU (gpu or gpu_memory_gb in "
                         "trackway.toml), so the memory preflight cannot judge it")
    if any(row.verdict != "OOM" for row in judged):
        return
    names = ", ".join(f"{row.target.name} ({row.target.capacity_gib:g} GiB, {row.at['max'][1]:.2f})" for row in judged)
    fix = _first_fix(judged)
    raise InputError(f"--strict: the memory preflight predicts OOM on {names}: {report.peak_gib:.1f} GiB per GPU at "
                     f"the longest batch{fix}; `trackway preflight` shows the breakdown")


def _first_fix(rows: list[TargetVerdict]) -> str:
    fixes = [row.fixes[0] for row in rows if row.fixes]
    return f"; it fits with {fixes[0].change}" if fixes else ""


def _say(console: Console, report: Report, named: bool) -> None:
    from rich.text import Text

    def say(line: str) -> None:
        console.print(Text(line, style="dim"), highlight=False, soft_wrap=True)

    say(f"trackway: memory preflight: {report.summary()}")
    nowhere = all(row.verdict == "OOM" for row in report.targets)
    for row in report.targets:
        if row.verdict == "OOM":
            fix = f"; it fits with {row.fixes[0].change}" if row.fixes else ""
            fate = ("asked for by name, it runs there anyway" if named
                    else "as would every resource it may go to: it runs anyway, `submit --strict` refuses" if nowhere
                    else "selection passes it over")
            say(f"trackway: {row.target.name} would run out of memory ({fate}){fix}")
    if not report.targets:
        say("trackway: memory preflight: no resource this run may go to declares its GPU (gpu or gpu_memory_gb), so "
            "nothing was judged")
