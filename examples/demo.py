"""The end-to-end demo on the embedded defaults: SQLite ledger, local executor, a tiny PyTorch model on CPU.

Run it with `make demo`. Every step is a real `trackway` command; what it prints is what a user sees.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.rule import Rule

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
console = Console()

SEED_QUERY = (
    "select termination_reason, count(*) as attempts, sum(gpu_seconds) / 3600 as gpu_hours "
    "from training_attempts where model_family = 'reasoning' and started_at >= now() - interval '7 days' "
    "group by termination_reason order by gpu_hours desc;"
)


def trackway(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    shown = " ".join(shlex.quote(a) for a in args)
    console.print(Rule(f"[bold]trackway {shown}", align="left"))
    result = subprocess.run(
        [sys.executable, "-m", "trackway", *args], cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    sys.stdout.write(result.stdout)
    sys.stdout.flush()
    if check and result.returncode != 0:
        raise SystemExit(f"demo: `trackway {shown}` exited {result.returncode}")
    return result


def main() -> None:
    corpus = ROOT / ".trackway" / "demo" / "corpus.txt"
    subprocess.run([sys.executable, str(EXAMPLES / "make_corpus.py"), str(corpus)], check=True)
    trackway("init")
    name = f"tiny-lm-{time.strftime('%Y%m%d-%H%M%S')}"
    submitted = trackway(
        "submit", "--name", name, "--project", "demo", "--model-family", "reasoning", "--kind", "test",
        "--config", "examples/tiny.toml", "--set", "train.steps=300", "--data", str(corpus),
        "--", sys.executable, "examples/train_tiny.py", "--data-file", str(corpus),
    )
    run_id = next(line for line in submitted.stdout.splitlines() if line.startswith("r") and " " not in line)
    trackway("logs", f"{name}/1")
    trackway("runs", "--limit", "5")
    trackway("show", name)
    trackway("sql", SEED_QUERY)
    console.print(Rule("[bold]done", align="left"))
    console.print(f"run {run_id} ({name}) is in the ledger at .trackway/ledger.db; try `trackway attempts {name} --json`.")


if __name__ == "__main__":
    main()
