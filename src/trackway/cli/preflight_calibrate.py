"""`trackway preflight --calibrate RUN`: the run's measured GPU peak against its estimate, kept as a correction."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trackway.cli.context import AppContext
from trackway.cli.jsonout import print_json
from trackway.errors import InputError
from trackway.resources.memory_model import GIB

LENGTH_KEYS = ("seq_lengths", "data", "length_field", "steps")


def calibrate_run(app: AppContext, ref: str, options: dict[str, Any], at_length: int | None, as_json: bool,
                  option_name: Callable[[str], str]) -> None:
    """Record the correction a run's measured GPU peak gives its family; `option_name` names a key as typed here.

    `option_name` comes from the command (preflight_cmd.py), which owns its options' spelling, so this
    module never imports the command that imports it.
    """
    from trackway.ledger.records import resolve_run
    from trackway.resources.calibration import measured_peak, record_calibration

    with app.ledger.read() as conn:
        run = resolve_run(conn, ref)
        peak = measured_peak(conn, run["run_id"])
    if peak is None:
        raise InputError(f"--calibrate {ref}: no measured GPU peak: its attempts recorded no cuda_memory event (the SDK "
                         "records torch.cuda's max_memory_allocated/reserved when the script uses CUDA)")
    recorded = json.loads(run["preflight"]) if run["preflight"] else None
    estimated, row_length, precision, family_given = _estimate(recorded, options, at_length, ref, option_name)
    family = options.get("model_family") or run["model_family"] or family_given
    if not family:
        raise InputError(f"--model-family: expected the model family to keep the correction for (run {ref} has none)")
    with app.ledger.write() as conn:
        factor = record_calibration(conn, family, precision, run["run_id"], estimated, peak, row_length)
    facts = {
        "run_id": run["run_id"], "model_family": family, "precision": precision, "factor": factor,
        "measured_reserved_gib": peak.reserved / GIB, "measured_allocated_gib": peak.allocated / GIB,
        "device": peak.device, "attempt_id": peak.attempt_id, "estimated_gib": estimated / GIB,
        "row_length": row_length, "error": factor - 1.0,
    }
    if as_json:
        print_json(facts)
        return
    from trackway.cli.render import console, say

    say(console, f"{run['run_id']}: measured {peak.reserved / GIB:.2f} GiB reserved ({peak.allocated / GIB:.2f} GiB "
                 f"allocated) on {peak.device} in {peak.attempt_id}; estimated {estimated / GIB:.2f} GiB at padded "
                 f"length {row_length:,} (without the context)")
    say(console, f"the estimate was {abs(factor - 1):.1%} {'low' if factor > 1 else 'high'}: later estimates for "
                 f"{family}, {precision} are scaled by {factor:.3f} and say so (`--uncalibrated` ignores it)")


def _estimate(
    recorded: dict | None, options: dict[str, Any], at_length: int | None, ref: str, option_name: Callable[[str], str],
) -> tuple[float, int, str, str | None]:
    """Bytes estimated (uncorrected, without the context), the padded length, the precision and the family."""
    from trackway.resources.preflight_spec import read_spec

    if recorded is not None and at_length is None:
        longest = recorded["report"]["points"]["max"]
        factor = (recorded["report"].get("correction") or {}).get("factor", 1.0)
        gib = longest["gib"]
        return ((gib["total"] - gib["context"]) / factor * GIB, int(longest["row_length"]),
                recorded["report"]["precision"], recorded["report"].get("model_family"))
    if recorded is not None:
        values, base_dir = dict(recorded["values"]), Path(recorded["base_dir"])

        def name(key: str) -> str:
            return f"run {ref}'s [preflight] {key}"
    else:
        name = option_name
        values = {k: v for k, v in options.items() if v is not None and k != "model_family"}
        base_dir = Path.cwd()
        if "layers" not in values and "model_config" not in values:
            raise InputError(f"--calibrate {ref}: the run has no preflight in its receipt; give the model and batch "
                             "(--layers --hidden --heads --vocab or --model-config, --batch-size, --max-length ...)")
    if at_length is not None:
        values = {k: v for k, v in values.items() if k not in LENGTH_KEYS} | {"max_length": at_length, "padding": "fixed"}
    spec = read_spec(values, name, base_dir)
    from trackway.resources.preflight import run_preflight

    shape, breakdown = run_preflight(spec, []).points["max"]  # uncorrected: no calibration is passed
    return breakdown.total - breakdown.context, int(shape.row_length), spec.setup.precision, spec.model_family
