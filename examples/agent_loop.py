"""An agent's research loop through `trackway mcp`, with a scripted policy in place of a language model.

What a coding agent does overnight, end to end on the tiny PyTorch model (CPU): read its budget and
the resources, run a baseline, test a wave of three hypotheses against it as an experiment batch
(each gated by its own test run, two at a time, sharing the agent's GPU-hour budget), read the
table of verdicts with each criterion's numbers, and choose what to build on next. Every call goes
over MCP on stdio to a real `trackway mcp --agent example` process; every run is credited to the
agent in the ledger.

    python examples/agent_loop.py [--workdir DIR]

Exit 0 when every hypothesis reached a verdict. The policy is plain Python: an agent with a
language model makes the same calls and reads the same answers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import mcp
from mcp.client.stdio import StdioServerParameters

EXAMPLES = Path(__file__).resolve().parent
TOML = """
[agents.example]
gpu_hours_budget = 5
max_running = 2
"""
CONFIG = {"model": {"embed": 16, "hidden": 32},
          "train": {"steps": 60, "batch_size": 16, "seq_len": 24, "lr": 3e-3, "seed": 0, "log_every": 5,
                    "checkpoint_every": 20}}
HYPOTHESES = [
    {"title": "lr x3", "hypothesis": "a three times larger learning rate ends lower in the same steps",
     "set": ["train.lr=0.009"]},
    {"title": "lr /3", "hypothesis": "a three times smaller learning rate ends lower in the same steps",
     "set": ["train.lr=0.001"]},
    {"title": "wider", "hypothesis": "a GRU twice as wide ends lower in the same steps", "set": ["model.hidden=64"]},
]


class Agent:
    """The client side: each tool call answered as structured content, a refusal raised with its field."""

    def __init__(self, client: mcp.Client) -> None:
        self.client = client

    async def __call__(self, tool: str, **arguments):
        result = await self.client.call_tool(tool, arguments)
        if result.is_error:
            raise RuntimeError(f"{tool} refused: {json.dumps(result.structured_content)}")
        return result.structured_content


async def research(workdir: Path) -> int:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "trackway", "mcp", "--agent", "example"], cwd=str(workdir),
        env={**os.environ, "TRACKWAY_HOME": str(workdir / ".trackway")})
    async with mcp.Client(params) as client:
        call = Agent(client)
        budget = await call("budget")
        print(f"agent {budget['agent']}: {budget['left_gpu_hours']} of {budget['gpu_hours_budget']} GPU-hours left, "
              f"at most {budget['max_running']} runs at once")
        places = await call("resources")
        print("resources: " + ", ".join(f"{r['resource']} ({r['free_gpus']} GPUs free)" for r in places["resources"]))

        submitted = await call("submit", script="train_tiny.py", args=["--data-file", "corpus.txt"], kind="full",
                               name="baseline", config=CONFIG)
        ended = await call("wait", run=submitted["run_id"], timeout_s=600)
        if ended["state"] != "completed":
            explained = await call("explain", ref=submitted["run_id"])
            print(f"baseline {ended['state']}: {explained['ended_by']}")
            return 1
        curve = await call("metrics", run="baseline", key="loss", max_points=5)
        print(f"baseline completed: loss {curve['values'][0]:.3f} → {curve['values'][-1]:.3f}")

        batch = await call("experiment_batch", baseline="baseline", hypotheses=HYPOTHESES,
                           expect=["final.loss <= baseline.final.loss"], max_running=2, name="wave1")
        print(f"batch {batch['batch_id']}: {len(batch['experiments'])} experiments, {batch['max_running']} at a time, "
              f"budget {batch['budget_gpu_hours']} GPU-hours")
        table = await call("experiment_batch_wait", batch=batch["batch_id"], timeout_s=600)
        while not table["done"]:
            table = await call("experiment_batch_wait", batch=batch["batch_id"], timeout_s=600)

        print(f"{'experiment':<14}{'change':<20}{'verdict':<14}final loss vs baseline")
        best = None
        for row in table["experiments"]:
            change = "; ".join(f"{c['key']}={c['after']}" for c in row["changes"])
            numbers = "; ".join(f"{c['left']:.4f} vs {c['right']:.4f}" for c in row["criteria"]
                                if c["left"] is not None and c["right"] is not None)
            print(f"{row['experiment_id']:<14}{change:<20}{row['verdict'] or row['status']:<14}{numbers}")
            if row["verdict"] == "supported" and row["criteria"]:
                if best is None or row["criteria"][0]["left"] < best["criteria"][0]["left"]:
                    best = row
        if best is not None:
            print(f"next: build on {best['experiment_id']} ({best['title']}): experiment_new with parent="
                  f"{best['experiment_id']}")
        else:
            print("next: no hypothesis beat the baseline; revert to it and try another direction")
        return 0 if all(row["verdict"] for row in table["experiments"]) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, help="Where the project is made (default: a new temporary directory).")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="trackway-agent-"))
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "trackway.toml").write_text(TOML)
    shutil.copy(EXAMPLES / "train_tiny.py", workdir / "train_tiny.py")
    subprocess.run([sys.executable, str(EXAMPLES / "make_corpus.py"), str(workdir / "corpus.txt"), "--lines", "4000"],
                   check=True, stdout=subprocess.DEVNULL)
    print(f"project: {workdir}")
    return asyncio.run(research(workdir))


if __name__ == "__main__":
    sys.exit(main())
