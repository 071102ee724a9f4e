"""A dataset's sequence lengths, read streaming, and the padded length of a batch they lead to.

Under dynamic padding a batch is as long as its longest row, so with micro-batch b the padded
length's quantile q is the lengths' quantile q^(1/b): P(s_pad ≤ ℓ) = F(ℓ)^b. Over a whole run
some step meets the longest sample, so the memory verdict is taken at the maximum; the median
and p99 say what most steps cost.

    dynamic        rows padded to the batch's longest (group_by_length: batches of similar
                   lengths, so a step's length follows F itself; the maximum is unchanged)
    fixed          every row padded to max_length
    packed         rows packed to exactly max_length tokens: the same batch every step
    padding-free   rows concatenated (flash-attention varlen): b rows' tokens, no padding, no
                   cross-document attention; the worst batch holds b of the longest
"""

from __future__ import annotations

import bisect
import json
import random
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from trackway.errors import InputError

PADDINGS = ("dynamic", "fixed", "packed", "padding-free")
SAMPLED_BATCHES = 20_000  # padding-free: batches drawn (seeded) to find the quantiles of b rows' tokens
Progress = Callable[[int], None]  # called with bytes read since the last call


@dataclass(frozen=True)
class BatchShape:
    """One step's micro-batch on one GPU: rows of `row_length` tokens, `tokens` in all (b·s when padded)."""

    row_length: float
    tokens: float


class Lengths:
    """The distribution of sample lengths (tokens), cut at `max_length` when one is given."""

    def __init__(self, counts: Counter[int], max_length: int | None = None, proxy: bool = False):
        if not counts:
            raise InputError("sequence lengths: none were read; expected one length per sample")
        self.truncated = sum(n for length, n in counts.items() if max_length is not None and length > max_length)
        if max_length is not None:
            clipped: Counter[int] = Counter()
            for length, n in counts.items():
                clipped[min(length, max_length)] += n
            counts = clipped
        self.values = sorted(counts)
        self._cumulative: list[int] = []
        running = 0
        for value in self.values:
            running += counts[value]
            self._cumulative.append(running)
        self.count = running
        self.max_length = max_length
        self.proxy = proxy  # lengths are whitespace words, not tokens

    @property
    def longest(self) -> int:
        return self.values[-1]

    def quantile(self, p: float) -> int:
        """The smallest length ℓ with F(ℓ) ≥ p."""
        index = bisect.bisect_left(self._cumulative, p * self.count - 1e-9)
        return self.values[min(index, len(self.values) - 1)]

    def share_at_most(self, length: float) -> float:
        """F(length): the share of samples no longer than `length`."""
        index = bisect.bisect_right(self.values, length)
        return self._cumulative[index - 1] / self.count if index else 0.0

    def share_longest(self) -> float:
        """The share of samples at the longest length (those cut at max_length among them)."""
        return 1.0 - self.share_at_most(self.longest - 1)

    def steps_with_longest(self, micro_batch: int) -> float:
        """The share of steps (per GPU) whose batch holds a sample of the longest length."""
        return 1.0 - (1.0 - self.share_longest()) ** micro_batch

    def sample(self, rng: random.Random) -> int:
        index = bisect.bisect_right(self._cumulative, rng.randrange(self.count))
        return self.values[index]


def batch_shape(
    lengths: Lengths | None, q: float | None, micro_batch: int, padding: str, max_length: int | None,
    group_by_length: bool = False,
) -> BatchShape:
    """The batch at quantile `q` of steps (None: the largest batch the run can meet)."""
    if padding in ("fixed", "packed"):
        length = max_length if max_length is not None else (lengths.longest if lengths else None)
        if length is None:
            raise InputError(f"--max-length: expected a length with --padding {padding} (or the lengths to take it from)")
        return BatchShape(length, micro_batch * length)
    if lengths is None:
        if max_length is None:
            raise InputError("--seq-lengths/--data or --max-length: expected the lengths, or at least the longest")
        return BatchShape(max_length, micro_batch * max_length)
    if padding == "padding-free":
        if q is None:
            return BatchShape(lengths.longest, micro_batch * lengths.longest)
        tokens = _sampled_token_quantile(lengths, micro_batch, q)
        return BatchShape(lengths.longest, tokens)
    if q is None:
        length = lengths.longest
    else:
        length = lengths.quantile(q if group_by_length else q ** (1.0 / micro_batch))
    return BatchShape(length, micro_batch * length)


def _sampled_token_quantile(lengths: Lengths, micro_batch: int, q: float) -> float:
    rng = random.Random(0)  # the same answer every time for the same lengths
    sums = sorted(sum(lengths.sample(rng) for _ in range(micro_batch)) for _ in range(SAMPLED_BATCHES))
    return float(sums[min(int(q * len(sums)), len(sums) - 1)])


def read_lengths_file(path: Path, progress: Progress | None = None) -> Counter[int]:
    """One whole number per line (blank lines skipped); InputError naming the line of anything else."""
    counts: Counter[int] = Counter()
    for number, line in _lines(path, "--seq-lengths", progress):
        text = line.strip()
        if not text:
            continue
        try:
            value = int(text)
        except ValueError:
            raise InputError(f"--seq-lengths {path}: line {number}: expected a whole number of tokens, got {text[:40]!r}") from None
        if value < 0:
            raise InputError(f"--seq-lengths {path}: line {number}: expected a length ≥ 0, got {value}")
        counts[value] += 1
    return counts


def read_jsonl_lengths(path: Path, field: str, progress: Progress | None = None) -> tuple[Counter[int], bool]:
    """Lengths from a JSONL file's `field` (dotted for nesting): a token count, a list of token ids, or text.

    Text is measured in whitespace-separated words, a proxy for tokens (usually 1.3–1.5 tokens per
    English word); the second value says whether any length was such a proxy.
    """
    counts: Counter[int] = Counter()
    proxy = False
    keys = field.split(".")
    for number, line in _lines(path, "--data", progress):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
            for key in keys:
                value = value[key]
        except (json.JSONDecodeError, KeyError, TypeError, IndexError):
            raise InputError(f"--data {path}: line {number}: expected a JSON object with field {field!r}") from None
        if isinstance(value, bool) or not isinstance(value, (int, str, list)):
            raise InputError(f"--length-field {field!r}: line {number} of {path}: expected a token count, a list of "
                             f"token ids or text, got {type(value).__name__}")
        if isinstance(value, str):
            proxy = True
            counts[len(value.split())] += 1
        elif isinstance(value, list):
            counts[len(value)] += 1
        elif value < 0:
            raise InputError(f"--length-field {field!r}: line {number} of {path}: expected a length ≥ 0, got {value}")
        else:
            counts[value] += 1
    return counts, proxy


def _lines(path: Path, field: str, progress: Progress | None) -> Iterator[tuple[int, str]]:
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise InputError(f"{field} {path}: cannot read it ({exc.strerror or exc})") from None
    with handle:
        pending = 0
        for number, raw in enumerate(handle, start=1):
            pending += len(raw)
            if progress is not None and pending >= 1 << 20:
                progress(pending)
                pending = 0
            yield number, raw.decode("utf-8", errors="replace")
        if progress is not None and pending:
            progress(pending)


def lengths_from_values(values: Iterable[int], max_length: int | None = None) -> Lengths:
    """Lengths from numbers in hand (tests, a tokenizer run in process)."""
    return Lengths(Counter(int(v) for v in values), max_length)
