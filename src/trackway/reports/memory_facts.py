"""What explain says about an attempt's GPU memory: the preflight's estimate at submit, the measured peak, and
an OOM's own numbers side by side, so a reader sees how far the estimate was from what happened."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from trackway.ledger.reader import Reader
from trackway.resources.memory_peak import measured_peak
from trackway.resources.memory_model import GIB
from trackway.resources.oom_evidence import parse_oom
from trackway.taxonomy import TerminationReason


def memory_facts(reader: Reader | Any, run: Mapping[str, Any], attempt: Mapping[str, Any], evidence: list[str]) -> dict | None:
    """The memory facts of `attempt`, or None when there are none (no preflight, no GPU peak, no OOM numbers).

    `reader`: a plain `Reader`, or a SQLAlchemy connection the same SQL runs through.
    """
    reader = Reader.of(reader)
    facts: dict[str, Any] = {}
    again = _preflight_at_launch(reader, attempt)
    if again is not None or run.get("preflight"):
        # The attempt's own when `resume --set` changed its config: the submitted one would judge another config.
        recorded = json.loads(again or run["preflight"])
        report = recorded["report"]
        where = attempt.get("resource") or run["resource"]
        target = next((t for t in report["targets"] if t["name"] == where), None)
        longest = report["points"]["max"]
        facts["preflight"] = {
            "peak_gib": report["peak_gib"], "context_gib": longest["gib"]["context"], "median_gib": report["points"]["median"]["gib"]["total"],
            "row_length": longest["row_length"], "tokens": longest["tokens"], "mode": recorded.get("mode"),
            "setup": report["setup"], "calibrated": (report.get("correction") or {}).get("source"),
            "resource": where, "verdict": target["verdict"] if target else None,
            "ratio": target["at"]["max"]["ratio"] if target else None,
            "when": "at this attempt's launch, for its config" if again is not None else "at submit",
        }
    peak = measured_peak(reader, run["run_id"], attempt["attempt_id"])
    if peak is not None:
        facts["measured"] = {"reserved_gib": peak.reserved / GIB, "allocated_gib": peak.allocated / GIB,
                             "device": peak.device}
    if attempt.get("termination_reason") == TerminationReason.OOM.value:
        numbers = parse_oom(evidence)
        if numbers is not None:
            facts["oom"] = numbers.to_json() | {"text": numbers.text()}
    return facts or None


def _preflight_at_launch(reader: Reader, attempt: Mapping[str, Any]) -> str | None:
    """The preflight of the config this attempt ran, when `resume --set` changed it (on this attempt or an earlier one)."""
    from trackway.resources.run_preflight import PREFLIGHT_AT_LAUNCH_EVENT

    payload = reader.scalar(
        "SELECT attempt_events.payload FROM attempt_events JOIN attempts ON attempts.attempt_id = attempt_events.attempt_id"
        " WHERE attempts.run_id = :run_id AND attempts.attempt_number <= :number AND attempt_events.kind = :kind"
        " ORDER BY attempts.attempt_number DESC",
        {"run_id": attempt["run_id"], "number": attempt["attempt_number"], "kind": PREFLIGHT_AT_LAUNCH_EVENT})
    return json.loads(payload).get("preflight") if payload else None


def memory_lines(facts: dict | None) -> list[str]:
    """The facts as lines, the estimate beside what was measured."""
    if not facts:
        return []
    lines = []
    estimate = facts.get("preflight")
    if estimate:
        judged = (f"; on {estimate['resource']}: {estimate['verdict']} {estimate['ratio']:.2f}"
                  if estimate["verdict"] else f"; {estimate['resource']} declares no GPU memory, so it was not judged")
        lines.append(f"preflight {estimate.get('when', 'at submit')} ({estimate['mode']}): {estimate['peak_gib']:.1f} GiB per GPU at the longest "
                     f"batch ({estimate['tokens']:,.0f} tokens in rows of {estimate['row_length']:,.0f}), "
                     f"{estimate['median_gib']:.1f} at the median{judged}"
                     + (f" ({estimate['calibrated']})" if estimate["calibrated"] else ""))
    measured = facts.get("measured")
    if measured:
        line = (f"measured peak: {measured['reserved_gib']:.2f} GiB reserved, {measured['allocated_gib']:.2f} GiB "
                f"allocated by PyTorch on {measured['device']}")
        if estimate:
            # The CUDA context and NCCL are outside what PyTorch's allocator counts.
            line += (f"; the estimate without the {estimate['context_gib']:g} GiB of context was "
                     f"{estimate['peak_gib'] - estimate['context_gib']:.2f} GiB")
        lines.append(line)
    oom = facts.get("oom")
    if oom:
        line = f"the OOM: {oom['text']}"
        if oom.get("reserved_bytes") is not None:
            needed = (oom["reserved_bytes"] + oom["asked_bytes"]) / GIB
            line += f"; PyTorch needed at least {needed:.2f} GiB"
            if estimate:
                line += f" against the preflight's {estimate['peak_gib']:.1f} GiB"
        lines.append(line)
    return lines

