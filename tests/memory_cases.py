"""The memory preflight's motivating case (docs/memory-preflight.md §4), shared by its tests."""

from __future__ import annotations

import math
import random

from trackway.resources.seq_lengths import Lengths, lengths_from_values

# Llama-2-7B, bf16-mixed AdamW, FSDP over 8, micro-batch 4, flash attention, no activation checkpointing.
MOTIVATING = dict(layers=32, hidden=4096, heads=32, ffn=11008, vocab=32000, batch_size=4, sharding="fsdp",
                  world_size=8, flash_attention=True, max_length=4096)


def lognormal_values(count: int = 200_000, seed: int = 7) -> list[int]:
    """Lognormal lengths with median 1500 and σ 0.6 (cut at 4096 by the preflight's max_length)."""
    rng = random.Random(seed)
    return [round(rng.lognormvariate(math.log(1500), 0.6)) for _ in range(count)]


def lognormal_lengths(count: int = 200_000, seed: int = 7) -> Lengths:
    return lengths_from_values(lognormal_values(count, seed), max_length=4096)
