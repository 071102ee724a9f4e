"""How `trackway preflight` reads on a terminal: the setup, the breakdown per batch, a verdict per GPU, the fixes."""

from __future__ import annotations

from trackway.cli.render import KEY, Column, console, say, table
from trackway.resources.memory_model import GIB
from trackway.resources.preflight import Report

PARTS = (("context", "context"), ("states", "weights, grads, optimizer"), ("gathered", "gathered layers"),
         ("activations", "activations"), ("logits", "logits + loss"))


def print_report(report: Report) -> None:
    spec = report.spec
    say(console, f"preflight: {spec.describe()}")
    lengths = spec.lengths
    if lengths is not None:
        line = (f"lengths: {lengths.count:,} samples, median {lengths.quantile(0.5):,}, longest {lengths.longest:,}"
                + (f" ({lengths.truncated:,} cut at max_length)" if lengths.truncated else "")
                + (" (whitespace words, a proxy for tokens)" if lengths.proxy else ""))
        share = report.longest_share()
        if share is not None:
            line += (f"; {share['samples_at_longest']:.1%} of samples are the longest, so {share['steps_with_longest']:.1%}"
                     " of steps per GPU meet one")
            if "expected_steps_at_longest" in share:
                line += f" (≈{share['expected_steps_at_longest']:,.0f} of {spec.steps:,} steps)"
        say(console, line)
    if report.correction is not None:
        say(console, report.correction.source)
    labels = list(report.points)
    rows = [["padded batch", *(_batch(report, label) for label in labels)]]
    for key, name in PARTS:
        values = [report.points[label][1].gib()[key] for label in labels]
        if key == "gathered" and not any(values):
            continue
        rows.append([name, *(f"{v:.2f}" for v in values)])
    rows.append(["total", *(f"{report.points[label][1].total / GIB:.2f}" for label in labels)])
    console.print()
    console.print(table(None, [Column("GiB per GPU", KEY), *(Column(label, KEY, right=True) for label in labels)], rows))
    console.print()
    verdict_rows = []
    for row in report.targets:
        verdict_rows.append([
            row.target.name, f"{row.target.capacity_gib:g}",
            *(f"{row.at[label][0]} {row.at[label][1]:.2f}" for label in labels),
            "" if row.longest_fitting is None else f"{row.longest_fitting:,}",
        ])
    console.print(table(None, [Column("GPU", KEY), Column("GiB", KEY, right=True),
                               *(Column(label, KEY) for label in labels),
                               Column(f"longest at b={spec.setup.micro_batch}", 10, right=True)], verdict_rows))
    for row in report.targets:
        if row.verdict == "FITS":
            continue
        console.print()
        say(console, f"{row.target.name}: {row.verdict} at the longest batch ({row.at['max'][1]:.2f} of "
                     f"{row.target.capacity_gib:g} GiB)" + ("; fits with, cheapest first:" if row.fixes else
                                                             "; no single change found makes it fit"))
        for number, fix in enumerate(row.fixes, start=1):
            say(console, f"  {number}. {fix.change}: {fix.peak_gib:.1f} GiB ({fix.ratio:.2f}); {fix.cost}")


def _batch(report: Report, label: str) -> str:
    shape = report.points[label][0]
    if shape.tokens == report.spec.setup.micro_batch * shape.row_length:
        return f"{report.spec.setup.micro_batch} × {shape.row_length:,.0f}"
    return f"{shape.tokens:,.0f} tokens"
