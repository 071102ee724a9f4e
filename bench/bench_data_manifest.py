"""Re-resolving a run's data manifest at each launch: 10,000 unchanged files against a bare `os.stat` walk.

Every attempt's receipt names the data it read (issue 30), so the manifest is resolved again at
each launch; the cache (receipts/data_manifest.py) keeps unchanged files from being hashed again.
Targets: 10,000 unchanged files re-resolved in ≤ 0.2 s, and ≤ 1.2x a bare walk that only calls
`os.stat` on each of them (os.walk plus one stat per file), the two timed in turn. For scale: the
first resolution (every file hashed) and one after a single file changed (that file hashed again).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import figure, interleaved_medians  # noqa: E402

from trackway.receipts.data_manifest import build_data_manifest  # noqa: E402

FILES = 10_000
PER_DIR = 100


def make_dataset(root: Path) -> None:
    for d in range(FILES // PER_DIR):
        shard = root / f"shard-{d:03d}"
        shard.mkdir(parents=True)
        for f in range(PER_DIR):
            (shard / f"part-{f:03d}.jsonl").write_text(f'{{"shard": {d}, "part": {f}}}\n' * 20)
    past = time.time() - 60  # older than the cache's racy window, as data written before a run is
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            os.utime(os.path.join(dirpath, name), (past, past))


def bare_walk(root: Path) -> int:
    count = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames:
            os.stat(os.path.join(dirpath, name))
            count += 1
    return count


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        data, cache = Path(tmp) / "data", Path(tmp) / "cache"
        make_dataset(data)
        started = time.perf_counter()
        first = build_data_manifest([data], cache_dir=cache)
        first_s = time.perf_counter() - started
        assert first.hashed == FILES and len(first.files) == FILES
        again = build_data_manifest([data], cache_dir=cache)
        assert again.sha256 == first.sha256 and again.hashed == 0
        times = interleaved_medians({
            "resolve": lambda: build_data_manifest([data], cache_dir=cache),
            "walk": lambda: bare_walk(data),
        }, repeat=41)  # each round is ~70 ms; 41 of them hold the ratio to ±3% on a busy box
        changed = data / "shard-007" / "part-042.jsonl"
        changed.write_text("edited\n")
        past = time.time() - 60
        os.utime(changed, (past, past))
        started = time.perf_counter()
        edited = build_data_manifest([data], cache_dir=cache)
        edited_s = time.perf_counter() - started
        assert edited.hashed == 1 and edited.sha256 != first.sha256
    ok = figure("data manifest: first resolution, 10k files (all hashed)", first_s)
    ok &= figure("data manifest: re-resolved, 10k unchanged files", times["resolve"], target=0.2,
                 baseline=times["walk"], baseline_name="bare os.stat walk", target_ratio=1.2)
    ok &= figure("data manifest: re-resolved after one of 10k files changed", edited_s)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
