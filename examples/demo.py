"""The end-to-end demo on the embedded defaults: SQLite ledger, local executor, a tiny PyTorch model on CPU.

Run it with `make demo`. Every step is a real `trackway` command; what it prints is what a user sees:

1. a reference run trains the tiny model uninterrupted, with an eval spec attached: every
   committed checkpoint is evaluated on 80 additions (examples/evals/arith.toml);
2. the same run again, sent SIGTERM half-way (what a spot reclaim or a Slurm preemption sends):
   it checkpoints, exits as `preempted`, and the supervisor resumes it from its last committed
   checkpoint to the same final loss as the reference;
3. an OOM that the policy refuses to retry blindly, explained;
4. the reference run's evaluations: pass@1 and pass@2 rising across checkpoints, escalation to
   three seeds once pass@1 clears 10%, and one injected evaluator crash retried while training
   was never touched;
5. the receipts, checkpoints, metrics, waste report and the seed query over the ledger;
6. when a Slurm answers here (scripts/ensure-slurm.sh brings up the local test cluster), the same
   model as a `full` run that selection sends to the Slurm resource, preempted by a job in the
   `high` partition that needs its GPUs, resumed to the reference's final loss; `explain` shows
   the placement and why the resource was chosen;
7. two experiments on the reference: a hypothesis (a doubled learning rate gets to the reference's
   final loss sooner and ends lower) whose test run passes its checks before its full run starts,
   concluded `supported`; then, from it, one (halving the batch) concluded `rejected` and reverted;
   their reports and the chain of iterations;
8. the memory preflight on the case that motivated it: Llama-2-7B under FSDP over 8 GPUs,
   micro-batch 4, dynamic padding of lognormal lengths cut at 4096. It fits at the median on an
   H100, runs out of memory at the longest batch on an A100 and an H100, fits on an H200, and
   ranks the changes that would make it fit.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.rule import Rule

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
STEPS = 300
CRASH_STEP = 150  # the demo injects one evaluator crash at this checkpoint (first attempt only)
console = Console()

SEED_QUERY = (
    "select termination_reason, count(*) as attempts, sum(gpu_seconds) / 3600 as gpu_hours "
    "from training_attempts where model_family = 'reasoning' and started_at >= now() - interval '7 days' "
    "group by termination_reason order by gpu_hours desc;"
)


def trackway(*args: str, check: bool = True, quiet: bool = False, cwd: Path = ROOT,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    shown = " ".join(shlex.quote(a) for a in args)
    if not quiet:
        console.print(Rule(f"[bold]trackway {shown}", align="left"))
    result = subprocess.run(
        [sys.executable, "-m", "trackway", *args], cwd=cwd, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env={**os.environ, **env} if env else None,
    )
    if not quiet:
        sys.stdout.write(result.stdout)
        sys.stdout.flush()
    if check and result.returncode != 0:
        raise SystemExit(f"demo: `trackway {shown}` exited {result.returncode}:\n{result.stdout}")
    return result


def created(*args: str) -> str:
    """`trackway ARGS` shown as `trackway()` shows it; returns the id it printed on stdout (stderr says the rest)."""
    console.print(Rule(f"[bold]trackway {' '.join(shlex.quote(a) for a in args)}", align="left"))
    result = subprocess.run([sys.executable, "-m", "trackway", *args], cwd=ROOT, text=True, capture_output=True)
    sys.stdout.write(result.stdout + result.stderr)
    sys.stdout.flush()
    if result.returncode != 0:
        raise SystemExit(f"demo: `trackway {' '.join(args)}` exited {result.returncode}")
    return result.stdout.split()[0]


def as_json(*args: str, **where):
    return json.loads(trackway(*args, "--json", quiet=True, **where).stdout)


def demo_eval_spec() -> Path:
    """examples/evals/arith.toml with the demo's injected crash, written beside the demo's data.

    `workdir` keeps the spec's relative paths (evaluator code, task set) where they were.
    """
    text = (EXAMPLES / "evals" / "arith.toml").read_text()
    command = 'command = ["{python}", "../eval_arith.py"]'
    assert command in text, "examples/evals/arith.toml changed its command; update the demo"
    text = text.replace(command, f'command = ["{{python}}", "../eval_arith.py", "--crash-at-step", "{CRASH_STEP}"]')
    spec = ROOT / ".trackway" / "demo" / "arith-with-a-crash.toml"
    spec.write_text(f'workdir = "{EXAMPLES / "evals"}"\n' + text)
    return spec


BEST_QUERY = (
    "select checkpoint, step, mean as pass_at_1, seeds, evaluator_version from checkpoint_evals "
    "where run_name = '{run}' and metric = 'pass@1' order by mean desc limit 1;"
)


def submit_args(name: str, corpus: Path) -> list[str]:
    return [
        "--name", name, "--project", "demo", "--model-family", "reasoning", "--kind", "test",
        "--config", "examples/tiny.toml", "--set", f"train.steps={STEPS}", "--data", str(corpus),
        "--", sys.executable, "examples/train_tiny.py", "--data-file", str(corpus),
    ]


def wait_for(what: str, check, timeout: float = 120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise SystemExit(f"demo: gave up waiting for {what}")


def final_loss(name: str) -> float:
    return as_json("metrics", name, "--key", "loss")[-1]["value"]


SLURM_DIR = ROOT / ".trackway" / "demo" / "slurm"
SLURM_NODE_LOCK = Path(tempfile.gettempdir()) / "trackway-tests-slurm-node.lock"
# The demo's own project directory for step 6: a workstation for tests, the Slurm cluster for full runs.
SLURM_TOML = """\
# Written by examples/demo.py (step 6): this machine for test runs, the local Slurm for full runs.
[resources.local]
executor = "local"
use_for = ["test"]

[resources.cluster]
executor = "slurm"
partition = "test"
gpus_per_node = 2
use_for = ["test", "full"]
grace_seconds = 20
# The test cluster gives a job 256 MB unless asked (DefMemPerCPU) and enforces it: PyTorch needs more.
sbatch = ["--mem=1G"]

[selection]
full = ["cluster", "local"]
"""


def slurm_answers() -> bool:
    if shutil.which("sinfo") is None:
        return False
    try:
        return subprocess.run(["sinfo", "--noheader"], capture_output=True, timeout=5).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def on_slurm(stamp: str, corpus: Path, reference: str, ref_loss: float) -> bool:
    """Step 6: the reference's model and config as a full run on the local Slurm, preempted and resumed.

    Returns whether its final loss matched the reference's (True when there was nothing to compare).
    """
    SLURM_DIR.mkdir(parents=True, exist_ok=True)
    (SLURM_DIR / "trackway.toml").write_text(SLURM_TOML)
    # The same ledger as the rest of the demo; this directory's trackway.toml declares the resources
    # (a supervisor started elsewhere, like the background one of steps 1-4, places this run's
    # retries among them too: it reads the trackway.toml of the run's working directory).
    home = ROOT / os.environ.get("TRACKWAY_HOME", ".trackway")  # the home steps 1-5 used (from ROOT)
    where = {"cwd": SLURM_DIR, "env": {"TRACKWAY_HOME": str(home), "TRACKWAY_BACKGROUND_SUPERVISOR": "0"}}
    console.print(escape(f"in {SLURM_DIR.relative_to(ROOT)}: its trackway.toml declares `local` (test runs) and "
                         "`cluster` (the local Slurm, partition test, 2 GPUs); "
                         '[selection] full = ["cluster", "local"]'))
    name = f"tiny-lm-{stamp}-slurm"
    trackway("submit", "--detach", "--name", name, "--project", "demo", "--model-family", "reasoning", "--kind", "full",
             "--gpus", "2", "--config", str(EXAMPLES / "tiny.toml"), "--set", f"train.steps={STEPS}",
             "--data", str(corpus), "--", sys.executable, str(EXAMPLES / "train_tiny.py"), "--data-file", str(corpus),
             "--step-delay", "0.02", **where)

    def committed() -> bool:
        trackway("supervise", "--once", quiet=True, **where)
        return any(c["state"] == "committed" for c in as_json("checkpoints", name, **where))

    wait_for("a committed checkpoint on Slurm", committed, timeout=180)
    (attempt,) = as_json("attempts", name, **where)
    high = ["sbatch", "--parsable", "--partition=high", "--gres=gpu:2", "--output=/dev/null", "--wrap", "sleep 1"]
    console.print(f"{attempt['attempt_id']} runs as Slurm job {attempt['executor_job_id']} and holds both GPUs; "
                  f"`{shlex.join(high)}` asks for them in the `high` partition, which preempts `test`: Slurm sends "
                  "the job its USR1 notice, the SDK checkpoints and exits")
    high_job = subprocess.run(high, capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    console.print(f"high-priority job {high_job} submitted; `trackway supervise --once` until the run completes:")

    def completed() -> bool:
        trackway("supervise", "--once", quiet=True, **where)
        return as_json("show", name, **where)["state"] in ("completed", "failed", "cancelled")

    wait_for("the Slurm run to complete", completed, timeout=300)
    trackway("attempts", name, **where)
    explained = trackway("explain", name, check=False, **where).returncode == 0
    attempts_ = as_json("attempts", name, **where)
    reference_config, slurm_config = as_json("show", reference)["config"], as_json("show", name, **where)["config"]
    slurm_loss = final_loss(name)
    if reference_config != slurm_config:
        console.print(f"final loss on Slurm {slurm_loss:.6f}; its config differs from the reference's: not compared")
        same = True
    else:
        same = slurm_loss == ref_loss
        console.print(f"final loss: uninterrupted (step 1, local) {ref_loss:.6f}, on Slurm preempted and resumed "
                      f"{slurm_loss:.6f}: {'the same' if same else 'DIFFERENT'}")
    reasons = [a["termination_reason"] for a in attempts_]
    if reasons != ["preempted", "completed"]:
        raise SystemExit(f"demo: the Slurm run's attempts ended {reasons}, not preempted then completed")
    if not explained:
        raise SystemExit(f"demo: `trackway explain {name}` failed (its output is above)")
    return same


def experiments(reference: str) -> list[str]:
    """Step 7: two iterations on the reference run, each gated by a test run and judged by its criteria."""
    faster = created(
        "experiment", "new", "--title", "double the learning rate",
        "--hypothesis", "doubling the learning rate (3e-3 to 6e-3) reaches the reference's final loss in at most "
                        "80% of its steps, and ends at least 2% lower",
        "--baseline", reference, "--set", "train.lr=6e-3", "--no-evals",
        "--expect", "steps_to(loss, baseline.final.loss) <= 0.8 * baseline.steps",
        "--expect", "final.loss <= 0.98 * baseline.final.loss",
    )
    trackway("experiment", "start", faster)
    trackway("experiment", "report", faster)
    smaller = created(
        "experiment", "new", "--from", faster, "--title", "halve the batch",
        "--hypothesis", "halving the batch size (64 to 32) keeps the final loss within 2% of the baseline's",
        "--set", "train.batch_size=32", "--expect", "final.loss <= baseline.final.loss * 1.02",
    )
    trackway("experiment", "start", smaller)
    trackway("experiment", "show", smaller)
    trackway("experiments", "--chain", smaller)
    return [as_json("experiment", "show", e)["verdict"] for e in (faster, smaller)]


def memory_preflight() -> dict[str, str]:
    """Step 8: lengths drawn lognormal (median 1500, σ 0.6), then `trackway preflight` on them; the verdicts."""
    import math
    import random

    rng = random.Random(7)
    with tempfile.TemporaryDirectory(prefix="trackway-demo-") as folder:
        lengths = Path(folder) / "lengths.txt"
        lengths.write_text("".join(f"{round(rng.lognormvariate(math.log(1500), 0.6))}\n" for _ in range(100_000)))
        return _judged(lengths)


def _judged(lengths: Path) -> dict[str, str]:
    model = ["--layers", "32", "--hidden", "4096", "--heads", "32", "--ffn", "11008", "--vocab", "32000",
             "--batch-size", "4", "--sharding", "fsdp", "--world-size", "8", "--flash-attention",
             "--seq-lengths", str(lengths), "--max-length", "4096", "--steps", "2500",
             "--gpu", "A100-80", "--gpu", "H100", "--gpu", "H200"]
    trackway("preflight", *model)
    said = {t["name"]: t for t in as_json("preflight", *model)["targets"]}
    return {"H100 median": said["H100"]["at"]["median"]["verdict"],
            **{name: said[name]["verdict"] for name in ("A100-80", "H100", "H200")}}


def main() -> None:
    corpus = ROOT / ".trackway" / "demo" / "corpus.txt"
    subprocess.run([sys.executable, str(EXAMPLES / "make_corpus.py"), str(corpus)], check=True)
    subprocess.run([sys.executable, str(EXAMPLES / "make_arith_tasks.py"), str(corpus.parent / "arith_tasks.jsonl")],
                   check=True)
    spec = demo_eval_spec()
    trackway("init")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    reference, interrupted = f"tiny-lm-{stamp}", f"tiny-lm-{stamp}-preempted"

    console.print("\n[bold]1. A reference run, uninterrupted, each committed checkpoint evaluated[/bold]")
    args = submit_args(reference, corpus)
    trackway("submit", *args[: args.index("--")], "--eval", str(spec), *args[args.index("--"):])

    console.print("\n[bold]2. The same run, preempted half-way and resumed[/bold]")
    trackway("submit", "--detach", *submit_args(interrupted, corpus))
    wait_for(
        "two committed checkpoints",
        lambda: len([c for c in as_json("checkpoints", interrupted) if c["state"] == "committed"]) >= 2,
    )
    (attempt,) = as_json("attempts", interrupted)
    console.print(f"sending SIGTERM to {attempt['attempt_id']} (executor job {attempt['executor_job_id']}), "
                  "as a spot reclaim or a Slurm preemption would")
    os.kill(int(attempt["executor_job_id"]), signal.SIGTERM)
    wait_for("the attempt to end", lambda: as_json("attempts", interrupted)[0]["state"] == "ended")
    console.print("the supervisor decides by policy and resumes it (`trackway supervise` runs the same loop):")
    wait_for(
        "the resumed run to complete",
        lambda: trackway("supervise", "--once", quiet=True) and as_json("runs", "--limit", "2")[0]["state"] == "completed",
    )
    trackway("attempts", interrupted)
    trackway("checkpoints", interrupted)
    trackway("metrics", interrupted)
    ref_loss, resumed_loss = final_loss(reference), final_loss(interrupted)
    same = "the same" if ref_loss == resumed_loss else "DIFFERENT"
    console.print(f"final loss: uninterrupted {ref_loss:.6f}, preempted and resumed {resumed_loss:.6f}: {same}")

    console.print("\n[bold]3. An OOM is not retried blindly[/bold]")
    oom = f"tiny-lm-{stamp}-oom"
    trackway("submit", "--name", oom, "--project", "demo", "--model-family", "reasoning", "--kind", "test",
             "--", sys.executable, "examples/faults/oom.py", check=False)
    trackway("explain", oom)

    console.print("\n[bold]4. Evaluations of the reference run[/bold]")
    wait_for(
        "the reference run's evaluations to finish",
        lambda: trackway("supervise", "--once", quiet=True) and (rows := as_json("evals", reference)["evaluations"])
        and len(rows) == STEPS // 50 and all(r["state"] != "running" for r in rows),
        timeout=300,
    )
    trackway("evals", reference)
    rows = as_json("evals", reference)["evaluations"]
    crashed = next(r for r in rows if r["step"] == CRASH_STEP)
    trackway("eval", "show", crashed["eval_id"])
    trackway("eval", "compare", f"{reference}@{rows[0]['step']}", f"{reference}@{rows[-1]['step']}")
    trackway("sql", BEST_QUERY.format(run=reference))
    trackway("attempts", reference)

    console.print("\n[bold]5. Receipts and the ledger[/bold]")
    trackway("explain", f"{interrupted}/1")
    trackway("report", "waste")
    trackway("runs", "--limit", "5")
    trackway("sql", SEED_QUERY)
    console.print("\n[bold]6. The same model on the local Slurm[/bold]")
    slurm_same = True
    if slurm_answers():
        with open(SLURM_NODE_LOCK, "a") as node:  # the test cluster's one node, shared with the tests
            fcntl.flock(node, fcntl.LOCK_EX)
            slurm_same = on_slurm(stamp, corpus, reference, ref_loss)
    else:
        console.print("skipped: no Slurm answers here (`sinfo`); start the local test cluster with "
                      "`bash scripts/ensure-slurm.sh` (as root) and run `make demo` again")
    console.print("\n[bold]7. Experiments: a hypothesis, a test run that gates the full run, a verdict[/bold]")
    verdicts = experiments(reference)
    console.print("\n[bold]8. The memory preflight: will a step fit, at the median and at the longest batch?[/bold]")
    preflight = memory_preflight()
    console.print(Rule("[bold]done", align="left"))
    console.print(f"the ledger is at .trackway/ledger.db; try `trackway attempts {interrupted} --json`.")
    if ref_loss != resumed_loss:
        raise SystemExit("demo: the resumed run did not reproduce the uninterrupted final loss")
    pass1 = [r["metrics"]["pass@1"]["mean"] for r in rows]
    if not pass1[-1] > pass1[0] or any(r["state"] != "completed" for r in rows):
        raise SystemExit(f"demo: evaluations did not complete with pass@1 rising: {pass1}")
    if [a["termination_reason"] for a in as_json("attempts", reference)] != ["completed"]:
        raise SystemExit("demo: evaluations touched the training run's attempts")
    if not slurm_same:
        raise SystemExit("demo: the run preempted and resumed on Slurm did not reproduce the reference's final loss")
    if preflight != {"H100 median": "FITS", "A100-80": "OOM", "H100": "OOM", "H200": "FITS"}:
        raise SystemExit(f"demo: the memory preflight said {preflight} on the motivating case")
    if verdicts != ["supported", "rejected"]:
        raise SystemExit(f"demo: the experiments concluded {verdicts}, expected supported then rejected")


if __name__ == "__main__":
    main()
