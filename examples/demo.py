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
5. the receipts, checkpoints, metrics, waste report and the seed query over the ledger.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
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


def trackway(*args: str, check: bool = True, quiet: bool = False) -> subprocess.CompletedProcess:
    shown = " ".join(shlex.quote(a) for a in args)
    if not quiet:
        console.print(Rule(f"[bold]trackway {shown}", align="left"))
    result = subprocess.run(
        [sys.executable, "-m", "trackway", *args], cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    if not quiet:
        sys.stdout.write(result.stdout)
        sys.stdout.flush()
    if check and result.returncode != 0:
        raise SystemExit(f"demo: `trackway {shown}` exited {result.returncode}:\n{result.stdout}")
    return result


def as_json(*args: str):
    return json.loads(trackway(*args, "--json", quiet=True).stdout)


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
    console.print(Rule("[bold]done", align="left"))
    console.print(f"the ledger is at .trackway/ledger.db; try `trackway attempts {interrupted} --json`.")
    if ref_loss != resumed_loss:
        raise SystemExit("demo: the resumed run did not reproduce the uninterrupted final loss")
    pass1 = [r["metrics"]["pass@1"]["mean"] for r in rows]
    if not pass1[-1] > pass1[0] or any(r["state"] != "completed" for r in rows):
        raise SystemExit(f"demo: evaluations did not complete with pass@1 rising: {pass1}")
    if [a["termination_reason"] for a in as_json("attempts", reference)] != ["completed"]:
        raise SystemExit("demo: evaluations touched the training run's attempts")


if __name__ == "__main__":
    main()
