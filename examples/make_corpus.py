"""Write the demo's training corpus: lines of small additions ("12+7=19"), deterministic for a seed.

The tiny model learns to continue "a+b=" with the sum; later the evaluator asks it exactly that.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path


def corpus_lines(n: int, seed: int, max_operand: int = 49) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        lines.append(f"{a}+{b}={a + b}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--lines", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(corpus_lines(args.lines, args.seed)) + "\n")
    print(f"wrote {args.lines} lines to {args.out}")


if __name__ == "__main__":
    main()
