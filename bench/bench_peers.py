"""trackway's log call beside its peers': wandb, mlflow, aim and tensorboardX, measured the same way.

The measurement is bench_sdk.py's (its `_timed`, `_stats`, `_metrics` and `append_stats` are imported, not copied):
each row is a fresh interpreter that logs STEPS steps of 5 scalars, timing every call with
perf_counter_ns, and in the same process, just before and just after, appends the same
(step, time, copy of the dict) tuple to a list: the least a logging call can do, the baseline.
Per row: mean µs per step, p99, p99.9, the longest single call, and the time the peer's own
finish/close takes (everything it buffered made durable: it writes the points, or waits for the
process or thread that does).

Rows, each through the peer's ordinary API, with its own store in a fresh directory:

- trackway: `trackway.init()` run alone (no supervisor), `run.log(d, step)`, `run.finish()`;
  in trackway's own environment (the interpreter running this script), against an SQLite ledger
  that already exists, in a small git work tree, as bench_sdk.py's trainer.
- wandb: `wandb.init(mode="offline")`, `run.log(d, step=i)`, `run.finish()`.
- mlflow (file store, and an sqlite:/// tracking URI): `mlflow.start_run()`,
  `mlflow.log_metrics(d, step=i)`, `mlflow.end_run()`.
- aim: `aim.Run(repo=DIR)`, `run.track(d, step=i)`, `run.close()`.
- tensorboardX: `SummaryWriter(DIR)`, 5 × `add_scalar(key, value, i)` per step, `close()`.

Console capture and background system-metrics sampling are turned off where a peer has them
(wandb console="off", aim capture_terminal_logs=False and system_tracking_interval=None), as
trackway's row runs with install_hooks=False: the rows compare the log path alone.

The peers are not trackway's dependencies: they live in their own virtual environment,
bench/.peers-venv, made on the first run (pinned versions, PACKAGES below; torch held at the
CPU build on disk by a constraint, should a peer ever pull it). A peer that does not install or
import is a row "not installed (reason)" and does not fail the bench. Rows run in a rotated order
round after round (so every peer sees the same load), after one untimed warm-up round; figures
are medians over the rounds. A peer whose STEPS log calls would take longer than --budget-s a round
(120 s; mlflow's sqlite store commits every call) logs as many steps as its warm-up says fit, and
its row says how many.

Exits non-zero only when trackway's own row misses issue 12's log-call targets: mean ≤ 1 µs, and
the longest call ≤ 2× the longest list.append call in the same process.

    python bench/bench_peers.py [--steps N] [--repeats N] [--peers wandb,mlflow,...] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# bench_sdk imports nothing but the standard library at its top, so the peers' interpreters import it too.
from bench_sdk import KEYS, STEPS, _metrics, _stats, _timed, append_stats, bracketed  # noqa: E402

VENV = HERE / ".peers-venv"
MARKER = VENV / ".installed.json"
# The CPU build of torch lies on this machine's disk; none of the pinned peers needs torch (pip
# install --dry-run resolves them without it), and the constraint keeps any that would from
# pulling a multi-GB CUDA build.
TORCH_PIN = "torch==2.13.0"
PACKAGES = {  # the pip requirement each peer row needs; versions that installed from the registry
    "wandb": "wandb==0.31.0",
    "mlflow": "mlflow-skinny==3.17.2",
    "aim": "aim==3.29.1",
    "tensorboardX": "tensorboardX==2.6.5",
}
# Row name → (package key in PACKAGES, or None for trackway itself).
ROWS = {
    "trackway": None,
    "wandb": "wandb",
    "mlflow-file": "mlflow",
    "mlflow-sqlite": "mlflow",
    "aim": "aim",
    "tensorboardX": "tensorboardX",
}
LABELS = {
    "trackway": "trackway {v}, run.log",
    "wandb": "wandb {v} offline, run.log",
    "mlflow-file": "mlflow-skinny {v} file store, log_metrics",
    "mlflow-sqlite": "mlflow-skinny {v} sqlite, log_metrics",
    "aim": "aim {v}, run.track",
    "tensorboardX": "tensorboardX {v}, 5× add_scalar",
}
QUICK_STEPS = 5_000
WARM_UP_STEPS = 2_000
# Seconds of log calls one row may spend per round. A peer slower than that per STEPS (mlflow's
# sqlite store commits each call: ~10 ms a step here, 100k steps would be ~20 minutes a round) logs
# fewer steps, as many as its warm-up round says fit, in thousands; the table says how many.
LOG_BUDGET_S = 120.0
WORKER_TIMEOUT_S = 1800


def _say(message: str) -> None:
    print(f"[bench_peers] {message}", file=sys.stderr, flush=True)


# -- one row in a fresh interpreter -------------------------------------------------------------------------
# Each opener imports its peer (timed apart from its init), starts a run writing under `directory`,
# and returns (log(payload, step), finish(), version). Bound methods are handed over as they are
# where the peer's signature takes (payload, step) positionally, so no wrapper frame is timed.


def _version(distribution: str) -> str:
    import importlib.metadata

    return importlib.metadata.version(distribution)


def _open_trackway(directory: Path):
    import trackway

    run = trackway.init(config={"lr": 3e-4, "steps": STEPS}, install_hooks=False)
    return run.log, run.finish, _version("trackway")


def _open_wandb(directory: Path):
    import wandb

    settings = {"console": "off", "silent": True, "x_disable_stats": True}
    try:
        settings_obj = wandb.Settings(**settings)
    except Exception:  # a version without one of these settings: the defaults
        settings_obj = wandb.Settings(console="off")
    run = wandb.init(mode="offline", dir=str(directory), project="bench", config={"lr": 3e-4, "steps": STEPS},
                     settings=settings_obj)
    return run.log, run.finish, _version("wandb")


def _open_mlflow(directory: Path, uri: str):
    import mlflow

    if uri.startswith("file:"):
        # mlflow 3 refuses its file store ("maintenance mode") unless told this; it still ships it.
        os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    mlflow.set_tracking_uri(uri)
    mlflow.start_run()
    mlflow.log_params({"lr": 3e-4, "steps": STEPS})
    log_metrics = mlflow.log_metrics  # (metrics, step=None, ...): step is its second parameter
    return log_metrics, mlflow.end_run, _version("mlflow-skinny")


def _open_aim(directory: Path):
    import aim

    run = aim.Run(repo=str(directory), experiment="bench", system_tracking_interval=None,
                  capture_terminal_logs=False)
    run["hparams"] = {"lr": 3e-4, "steps": STEPS}
    track = run.track

    def log(payload: dict, step: int) -> None:
        track(payload, step=step)  # a dict tracks each key as its own metric

    return log, run.close, _version("aim")


def _open_tensorboardx(directory: Path):
    import tensorboardX

    writer = tensorboardX.SummaryWriter(logdir=str(directory))
    add_scalar = writer.add_scalar

    def log(payload: dict, step: int) -> None:
        for key, value in payload.items():
            add_scalar(key, value, step)

    return log, writer.close, _version("tensorboardX")


OPENERS = {
    "trackway": _open_trackway,
    "wandb": _open_wandb,
    "mlflow-file": lambda d: _open_mlflow(d, (d / "mlruns").as_uri()),
    "mlflow-sqlite": lambda d: _open_mlflow(d, f"sqlite:///{d / 'mlflow.db'}"),
    "aim": _open_aim,
    "tensorboardX": _open_tensorboardx,
}
IMPORTS = {"trackway": "trackway", "wandb": "wandb", "mlflow-file": "mlflow", "mlflow-sqlite": "mlflow",
           "aim": "aim", "tensorboardX": "tensorboardX"}


def worker(row: str, steps: int, directory: Path) -> dict:
    """One script's life: list.append loop, import, init, log `steps` steps (timed per call), finish, list.append loop."""
    import importlib

    payloads = [_metrics(i) for i in range(steps)]
    before = append_stats(payloads, False)
    result: dict = {"row": row}
    started = time.perf_counter()
    try:
        importlib.import_module(IMPORTS[row])
    except Exception as error:  # ImportError, or a dependency that breaks at import
        return {"row": row, "status": f"not installed ({type(error).__name__}: {error})"}
    result["import"] = time.perf_counter() - started
    started = time.perf_counter()
    log, finish, version = OPENERS[row](directory)
    result["init"] = time.perf_counter() - started
    result["version"] = version
    result["steps"] = steps
    result["log"] = _stats(_timed(log, payloads, False))
    started = time.perf_counter()
    finish()
    result["finish"] = time.perf_counter() - started
    payloads = [_metrics(i) for i in range(steps)]  # afresh: a peer may have added keys to the dicts it was given
    result["append"] = bracketed(before, append_stats(payloads, False))
    result["status"] = "ok"
    return result


# -- the peers' environment --------------------------------------------------------------------------------


def _peer_python() -> Path:
    return VENV / "bin" / "python"


def _pip(args: list[str]) -> tuple[int, str]:
    """Run pip in the peers' venv, its output shown on stderr as it comes; the exit status and its last lines."""
    tail: deque[str] = deque(maxlen=15)
    process = subprocess.Popen(
        [str(_peer_python()), "-m", "pip", "install", "--disable-pip-version-check", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_clean_env(),
    )
    assert process.stdout is not None
    for line in process.stdout:
        if "is ignored: it is neither a file nor a directory" in line:
            continue  # pip's note for each name a local mirror lacks: noise, hundreds of lines
        sys.stderr.write(f"  pip | {line}")
        sys.stderr.flush()
        tail.append(line.rstrip())
    return process.wait(), "\n".join(tail)


def _reason(output: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith("ERROR")] or output.splitlines()[-1:]
    return (lines[0] if lines else "pip failed").split(" (from versions:")[0][:160]


def ensure_peers(reinstall: bool) -> dict[str, str]:
    """Make bench/.peers-venv once (a marker records it); the packages that did not install, with why."""
    wanted = {"python": sys.version.split()[0], "packages": PACKAGES, "torch": TORCH_PIN}
    if not reinstall and MARKER.exists():
        try:
            marker = json.loads(MARKER.read_text())
        except ValueError:
            marker = {}
        if marker.get("wanted") == wanted and _peer_python().exists():
            return marker.get("failed", {})
    _say(f"installing the peers into {VENV.relative_to(HERE.parent)} (once; a few minutes): "
         + " ".join(PACKAGES.values()))
    if VENV.exists():
        shutil.rmtree(VENV)
    made = subprocess.run([sys.executable, "-m", "venv", str(VENV)], capture_output=True, text=True)
    if made.returncode != 0:
        reason = f"venv: {(made.stderr.strip().splitlines() or ['failed'])[-1]}"
        return {name: reason for name in PACKAGES}  # no marker: tried again next time
    constraints = VENV / "constraints.txt"
    constraints.write_text(f"{TORCH_PIN}\n")
    failed: dict[str, str] = {}
    _say("step 1/2: all the peers in one resolution")
    code, output = _pip(["-c", str(constraints), *PACKAGES.values()])
    if code != 0:
        _say("that failed; step 2/2: one peer at a time")
        for index, (name, requirement) in enumerate(PACKAGES.items(), 1):
            _say(f"  {index}/{len(PACKAGES)}: {requirement}")
            code, output = _pip(["-c", str(constraints), requirement])
            if code != 0:
                failed[name] = f"pip: {_reason(output)}"
    else:
        _say("step 2/2: nothing more to do")
    MARKER.write_text(json.dumps({"wanted": wanted, "failed": failed}, indent=1))
    _say("peers installed" + (f"; not installed: {', '.join(failed)} (--reinstall to try again)" if failed else ""))
    return failed


def _clean_env() -> dict[str, str]:
    """This environment without what points an interpreter at trackway's venv."""
    env = dict(os.environ)
    for name in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"):
        env.pop(name, None)
    return env


# -- this process: rounds and the table --------------------------------------------------------------------


def _run_worker(row: str, steps: int, tree: Path, runs: Path, env: dict[str, str], timeout: float) -> dict:
    directory = runs / f"{row}-{time.monotonic_ns()}"
    directory.mkdir()
    out = directory.parent / f"{directory.name}.json"
    python = sys.executable if row == "trackway" else str(_peer_python())
    row_env = env if row == "trackway" else {**_clean_env(), "WANDB_SILENT": "true", "WANDB_DIR": str(directory)}
    try:
        done = subprocess.run([python, __file__, "--worker", row, str(steps), str(directory), str(out)],
                              cwd=tree, env=row_env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"row": row, "status": f"failed (timed out after {timeout:.0f} s)"}
    finally:
        shutil.rmtree(directory, ignore_errors=True)  # the peer's store: a few MB each, and many of them
    if done.returncode != 0 or not out.exists():
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        return {"row": row, "status": f"failed (exit {done.returncode}: {(lines or ['no output'])[-1][:160]})"}
    return json.loads(out.read_text())


def _median(results: list[dict], *path: str) -> float:
    values = []
    for result in results:
        for name in path:
            result = result[name]
        values.append(result)
    return statistics.median(values)


def _summary(results: list[dict]) -> dict:
    """Medians over the rounds of each figure; a row whose every round failed keeps the first reason."""
    ok = [result for result in results if result.get("status") == "ok"]
    if not ok:
        return {"status": results[0]["status"] if results else "not run"}
    summary: dict = {"status": "ok", "version": ok[0]["version"], "steps": ok[0]["steps"], "rounds": len(ok)}
    if len(ok) < len(results):
        summary["failed_rounds"] = [result["status"] for result in results if result.get("status") != "ok"]
    for figure in ("mean", "p99", "p999", "max"):
        summary.setdefault("log", {})[figure] = _median(ok, "log", figure)
        summary.setdefault("append", {})[figure] = _median(ok, "append", figure)
    for name in ("finish", "init", "import"):
        summary[name] = _median(ok, name)
    summary["samples"] = ok
    return summary


def _targets(trackway: dict) -> tuple[bool, dict]:
    if trackway.get("status") != "ok":
        return False, {"mean": None, "max": None}
    mean_met = trackway["log"]["mean"] <= 1e-6
    max_met = trackway["log"]["max"] <= 2 * trackway["append"]["max"]
    return mean_met and max_met, {"mean": mean_met, "max": max_met}


def _table(summaries: dict[str, dict], met: dict, steps: int, repeats: int) -> None:
    from rich.console import Console
    from rich.table import Table

    from _common import _shown

    table = Table(title=f"the log call beside the peers: {steps:,} steps × {KEYS} scalars, one call a step, "
                  f"median of {repeats} round{'s' if repeats != 1 else ''}", show_lines=False)
    for column in ("figure", "value", "baseline", "ratio", "target", "met"):
        table.add_column(column, justify="left" if column == "figure" else "right")
    for row, summary in summaries.items():
        if summary["status"] != "ok":
            table.add_row(row, summary["status"], "", "", "", "MISSED" if row == "trackway" else "")
            continue
        label = LABELS[row].format(v=summary["version"])
        if summary["steps"] != steps:
            label += f" ({summary['steps']:,} steps)"
        if summary.get("failed_rounds"):
            label += f" ({summary['rounds']} of {summary['rounds'] + len(summary['failed_rounds'])} rounds)"
        for figure, name in (("mean", "mean per step"), ("p99", "p99"), ("p999", "p99.9"), ("max", "longest call")):
            value, baseline = summary["log"][figure], summary["append"][figure]
            base_name = "longest list.append" if figure == "max" else "list.append"
            target, verdict = "", ""
            if row == "trackway" and figure in met:
                target = "≤ 1.00 µs" if figure == "mean" else "≤ 2x"
                verdict = {None: "", True: "yes", False: "MISSED"}[met[figure]]
            table.add_row(f"{label}: {name}", _shown(value, "s"), f"{_shown(baseline, 's')} ({base_name})",
                          f"{value / baseline:.2f}x" if baseline else "", target, verdict)
        table.add_row(f"{label}: finish/close", _shown(summary["finish"], "s"), "", "", "", "")
        table.add_section()
    Console(width=200).print(table)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, help=f"steps per row (default {STEPS:,}; --quick: {QUICK_STEPS:,})")
    parser.add_argument("--repeats", type=int, help="rounds, each row once per round (default 3; --quick: 1)")
    parser.add_argument("--peers", help=f"comma-separated rows to run, of: {', '.join(ROWS)} "
                        "('mlflow' is both of its rows; trackway always runs)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: few steps, one round, no warm-up round")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--reinstall", action="store_true", help="make bench/.peers-venv afresh")
    parser.add_argument("--budget-s", type=float, default=LOG_BUDGET_S,
                        help="seconds of log calls a row may spend per round; a slower peer logs fewer steps, "
                        f"as its warm-up round says fit (default {LOG_BUDGET_S:g}; 0: no limit)")
    parser.add_argument("--timeout", type=float, default=WORKER_TIMEOUT_S, help="seconds one row may take")
    args = parser.parse_args(argv)
    steps = args.steps or (QUICK_STEPS if args.quick else STEPS)
    repeats = args.repeats or (1 if args.quick else 3)
    rows = list(ROWS)
    if args.peers:
        asked = {word.strip() for word in args.peers.split(",") if word.strip()}
        unknown = {word for word in asked if word not in ROWS and word != "mlflow"}
        if unknown:
            parser.error(f"unknown peers: {', '.join(sorted(unknown))} (known: {', '.join(ROWS)}, mlflow)")
        rows = [row for row in ROWS if row == "trackway" or row in asked
                or (ROWS[row] == "mlflow" and "mlflow" in asked)]

    # Here, not at the top: a worker runs in the peers' venv, which has neither SQLAlchemy nor rich.
    from bench_sdk import _git_tree

    from trackway.ledger import open_ledger

    wall_started = time.perf_counter()
    failed_installs = ensure_peers(args.reinstall) if any(ROWS[row] for row in rows) else {}
    loads = [os.getloadavg()[0]]
    _say(f"{len(rows)} rows × {repeats} rounds of {steps:,} steps; load average at start {loads[0]:.2f}")
    results: dict[str, list[dict]] = {row: [] for row in rows}
    skipped: dict[str, str] = {}
    for row in rows:
        if ROWS[row] in failed_installs:
            skipped[row] = f"not installed ({failed_installs[ROWS[row]]})"
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        tree = tmp / "project"
        _git_tree(tree)
        runs = tmp / "runs"
        runs.mkdir()
        home = tmp / "home"
        db_url = f"sqlite:///{home / 'ledger.db'}"
        open_ledger(db_url).dispose()  # the ledger exists already, as after the first `trackway` command
        env = {**os.environ, "TRACKWAY_HOME": str(home), "TRACKWAY_DB": db_url,
               "TRACKWAY_CACHE_DIR": str(tmp / "cache")}
        env.setdefault("TRACKWAY_HEARTBEAT_S", "5")
        env.pop("TRACKWAY_ATTEMPT_ID", None)  # a script run alone
        live = [row for row in rows if row not in skipped]
        row_steps = {row: steps for row in live}
        if not args.quick:
            # Untimed: fills trackway's environment cache, makes each peer's first store, finds the
            # peers that do not import before three rounds of them, and what a step costs each.
            _say("warm-up round")
            for row in live:
                warm = min(steps, WARM_UP_STEPS)
                result = _run_worker(row, warm, tree, runs, env, args.timeout)
                if result["status"] != "ok":
                    skipped[row] = result["status"]
                    _say(f"  {row}: {result['status']}")
                    continue
                per_step = result["log"]["mean"]
                _say(f"  {row}: mean {per_step * 1e6:.2f} µs over {warm:,} steps")
                if args.budget_s and per_step * steps > args.budget_s:
                    row_steps[row] = max(1_000, int(args.budget_s / per_step) // 1_000 * 1_000)
                    _say(f"  {row}: {steps:,} steps would take ~{per_step * steps:.0f} s a round; "
                         f"{row_steps[row]:,} steps fit --budget-s {args.budget_s:g}")
            live = [row for row in live if row not in skipped]
        for round_ in range(repeats):
            order = live[round_ % len(live):] + live[:round_ % len(live)] if live else []
            for row in order:
                loads.append(os.getloadavg()[0])
                started = time.perf_counter()
                result = _run_worker(row, row_steps[row], tree, runs, env, args.timeout)
                results[row].append(result)
                shown = (f"mean {result['log']['mean'] * 1e6:.2f} µs, max {result['log']['max'] * 1e3:.2f} ms, "
                         f"finish {result['finish']:.2f} s" if result["status"] == "ok" else result["status"])
                _say(f"round {round_ + 1}/{repeats} {row}: {shown} ({time.perf_counter() - started:.0f} s)")
    loads.append(os.getloadavg()[0])
    summaries = {row: ({"status": skipped[row]} if row in skipped else _summary(results[row])) for row in rows}
    ok, met = _targets(summaries["trackway"])
    wall = time.perf_counter() - wall_started
    load = {"start": loads[0], "end": loads[-1], "min": min(loads), "max": max(loads),
            "median": statistics.median(loads)}
    if args.json:
        print(json.dumps({"steps": steps, "keys": KEYS, "repeats": repeats, "wall_s": wall, "load_average_1m": load,
                          "python": sys.version.split()[0], "rows": summaries, "targets_met": met, "ok": ok},
                         indent=1))
    else:
        _table(summaries, met, steps, repeats)
        print(f"load average (1 min) at start {load['start']:.2f}, at end {load['end']:.2f}, "
              f"between rows {load['min']:.2f}–{load['max']:.2f} (median {load['median']:.2f}); wall {wall:.0f} s")
        if summaries["trackway"]["status"] != "ok":
            print(f"missed: trackway's row did not run: {summaries['trackway']['status']}")
        wording = {"mean": "mean per step ≤ 1 µs", "max": "longest call ≤ 2x the longest list.append"}
        for figure, verdict in met.items():
            if verdict is False:
                print(f"missed: trackway run.log {wording[figure]}")
        capped = [row for row, summary in summaries.items() if summary.get("steps", steps) != steps]
        if capped:
            print(f"fewer steps ({', '.join(capped)}): {steps:,} would take longer than --budget-s "
                  f"{args.budget_s:g} of log calls a round")
        if ok:
            print("trackway's log-call targets met")
    return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        row, steps, directory, out = sys.argv[2:6]
        try:
            outcome = worker(row, int(steps), Path(directory))
        except Exception as error:  # the peer's own failure: a row, not a crash of the bench
            outcome = {"row": row, "status": f"failed ({type(error).__name__}: {str(error)[:160]})"}
        Path(out).write_text(json.dumps(outcome, default=str))
        sys.exit(0)
    sys.exit(main(sys.argv[1:]))
