"""Write the demo's eval task set: additions ("12+7=" → "19"), one JSON task per line, deterministic for a seed.

Owns the task set `examples/eval_arith.py` scores and `examples/evals/arith.toml` names. The
operands come from the same range as the training corpus (examples/make_corpus.py), so the
tasks are in distribution: the tiny model has seen most of these exact sums while training,
and the eval measures how well 300 steps taught it to complete "a+b=". Pairs are distinct,
so no task is counted twice.

    python examples/make_arith_tasks.py examples/evals/arith_tasks.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def tasks(n: int, seed: int, max_operand: int = 49) -> list[dict]:
    pairs = [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)]
    if n > len(pairs):
        raise SystemExit(f"only {len(pairs)} distinct pairs with operands 0..{max_operand}; asked for {n}")
    chosen = random.Random(seed).sample(pairs, n)
    return [
        {"task_id": f"add-{i:03d}", "prompt": f"{a}+{b}=", "answer": str(a + b)}
        for i, (a, b) in enumerate(chosen)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--tasks", type=int, default=80)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-operand", type=int, default=49, help="largest operand (the corpus uses 49)")
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(task, separators=(",", ":")) for task in tasks(args.tasks, args.seed, args.max_operand)]
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} tasks to {args.out}")


if __name__ == "__main__":
    main()
