"""The end-to-end demo on the embedded defaults: SQLite ledger, local executor, a tiny PyTorch model on CPU.

Run it with `make demo`. Every step is a real `trackway` command; what it prints is what a user sees:

1. a reference run trains the tiny model uninterrupted;
2. the same run again, sent SIGTERM half-way (what a spot reclaim or a Slurm preemption sends):
   it checkpoints, exits as `preempted`, and the supervisor resumes it from its last committed
   checkpoint to the same final loss as the reference;
3. an OOM that the policy refuses to retry blindly, explained;
4. the receipts, checkpoints, metrics, waste report and the seed query over the ledger.
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
    trackway("init")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    reference, interrupted = f"tiny-lm-{stamp}", f"tiny-lm-{stamp}-preempted"

    console.print("\n[bold]1. A reference run, uninterrupted[/bold]")
    trackway("submit", *submit_args(reference, corpus))

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

    console.print("\n[bold]4. Receipts and the ledger[/bold]")
    trackway("explain", f"{interrupted}/1")
    trackway("report", "waste")
    trackway("runs", "--limit", "5")
    trackway("sql", SEED_QUERY)
    console.print(Rule("[bold]done", align="left"))
    console.print(f"the ledger is at .trackway/ledger.db; try `trackway attempts {interrupted} --json`.")
    if ref_loss != resumed_loss:
        raise SystemExit("demo: the resumed run did not reproduce the uninterrupted final loss")


if __name__ == "__main__":
    main()
