"""The memory preflight of a submitted run: read from its config, judged on the resources it may go to, kept
in its receipt, and used by selection to pass over the resources it would run out of memory on.

A run's config declares the question in a `[preflight]` section (the keys of `trackway preflight`'s
options, `batch_size` for `--batch-size`), or trackway.toml's `[preflight] keys` says where the
config already holds each one (`batch_size = "train.batch_size"`). trackway.toml's `[preflight]
mode` is `warn` (the default: say it, and still run where nothing fits), `strict` (`submit
--strict`: refuse, before anything is recorded, a run that would run out of memory wherever it
may go) or `off`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trackway.errors import InputError
from trackway.settings.resources import Resource

if TYPE_CHECKING:
    from trackway.resources.preflight import Correction, Report
    from trackway.resources.seq_lengths import Progress

# The estimate itself (resources/preflight.py and what it imports) is imported where a preflight runs:
# placement reads recorded verdicts through this module on every supervisor's start-up.



# The attempt event holding the preflight for a config `resume --set` changed (supervisor/launch.py writes it,
# reports/memory_facts.py reads it): the run's own `preflight` judged the submitted config.
PREFLIGHT_AT_LAUNCH_EVENT = "preflight_at_launch"

def preflight_values(
    config: Mapping[str, Any] | None, keys: Mapping[str, str],
) -> tuple[dict[str, Any], Callable[[str], str]] | None:
    """The preflight's values from a run config, and how an error names each; None when it declares none.

    The keys trackway.toml maps come first and the config's own `[preflight]` section over them, so
    `--set train.micro_batch=2` changes the preflight of a config whose batch is mapped.
    """
    if not isinstance(config, Mapping):
        return None
    section = config.get("preflight")
    if section is not None and not isinstance(section, Mapping):
        raise InputError("--config [preflight]: expected a table of the preflight's keys (batch_size, layers, ...)")
    mapped = {key: found for key, dotted in keys.items() if (found := _lookup(config, dotted)) is not None}
    values = {**mapped, **(section or {})}
    if not values:
        return None

    def name(key: str) -> str:
        if key in mapped and key not in (section or {}):
            return f"--config {keys[key]} (trackway.toml [preflight] keys.{key})"
        return f"--config [preflight] {key}"

    return values, name


def _lookup(config: Mapping[str, Any], dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def preflight_run(
    values: dict[str, Any], name: Callable[[str], str], base_dir: Path, resources: Iterable[Resource],
    correction_for: Callable[[str | None, str], Correction | None] | None = None, world_size: int | None = None,
    model_family: str | None = None, progress: Progress | None = None,
) -> Report:
    """The run's preflight against the GPUs of `resources` (those whose memory is known)."""
    from trackway.resources.gpu_catalog import resource_targets
    from trackway.resources.preflight import run_preflight
    from trackway.resources.preflight_spec import read_spec

    if world_size and world_size > 1 and "world_size" not in values:
        values = {**values, "world_size": world_size}
    spec = read_spec(values, name, base_dir, progress)
    if spec.model_family is None and model_family:
        spec = replace(spec, model_family=model_family)  # the run's --model-family
    correction = correction_for(spec.model_family, spec.setup.precision) if correction_for else None
    return run_preflight(spec, resource_targets(resources), correction)


def record(report: Report, values: Mapping[str, Any], mode: str, base_dir: Path) -> str:
    """What the receipt keeps: the values asked, the mode, and the answer."""
    return json.dumps({"mode": mode, "values": dict(values), "base_dir": str(base_dir), "report": report.to_json()},
                      default=str)


def peak_gib(recorded: str | None) -> tuple[float, str] | None:
    """The recorded estimate at the longest batch, and the mode, from a run's `preflight` column."""
    if not recorded:
        return None
    data = json.loads(recorded)
    return float(data["report"]["peak_gib"]), data.get("mode", "warn")


def summary_of(recorded: str | None) -> str | None:
    """One line from a run's `preflight` column: `warn: 89.0 GiB per GPU at the longest batch (4 × 4,096 tokens):
    h100box OOM 1.12, h200box FITS 0.63`."""
    if not recorded:
        return None
    data = json.loads(recorded)
    report = data["report"]
    longest = report["points"]["max"]
    verdicts = ", ".join(f"{t['name']} {t['verdict']} {t['at']['max']['ratio']:.2f}" for t in report["targets"])
    return (f"{data.get('mode', 'warn')}: {report['peak_gib']:.1f} GiB per GPU at the longest batch "
            f"({longest['tokens']:,.0f} tokens, rows of {longest['row_length']:,.0f})"
            + (f": {verdicts}" if verdicts else ": no resource declares its GPU memory")
            + (" (calibrated)" if report.get("correction") else ""))
