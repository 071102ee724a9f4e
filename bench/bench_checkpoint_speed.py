"""Checkpoint speed on a ≥ 200 MB PyTorch state (model + Adam): the protocol's cost, and what async saving blocks.

Targets (issue 3), measured in one run, same directory, medians of interleaved runs:
  (a) the protocol's synchronous save (temp dir → serialize with hashing → fsync → manifest →
      marker → renames → directory fsync) ≤ 1.05× a plain `torch.save(state, f)` +
      `f.flush()` + `os.fsync()` of the same captured state, the file dropped between runs;
  (b) the async save's blocking time (what the training thread waits: the copy to host
      buffers) ≤ 0.2× a synchronous save of the same state.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import report  # noqa: E402

import torch  # noqa: E402

from trackway.checkpoints.manager import CheckpointManager  # noqa: E402
from trackway.checkpoints.protocol import CheckpointStore  # noqa: E402
from trackway.checkpoints.torch_state import HostBuffers, capture  # noqa: E402


def build_state(megabytes: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    # Adam keeps two moments per parameter, so the state is three times the weights.
    width = 2048
    layers = max(1, round(megabytes * 2**20 / 3 / 4 / (width * width)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    model(torch.randn(4, width)).sum().backward()
    optimizer.step()
    return model, optimizer


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _spread(samples: list[float]) -> str:
    return f"{min(samples) * 1000:.0f}..{max(samples) * 1000:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=240)
    parser.add_argument("--repeat", type=int, default=11)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()

    model, optimizer = build_state(args.megabytes)
    snapshot = capture(model, optimizer, buffers=HostBuffers())
    print(f"state: {snapshot.nbytes / 1e6:.0f} MB (model + Adam), {args.repeat} interleaved runs each", flush=True)

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        store = CheckpointStore(root / "protocol")
        plain_file = root / "plain.pt"

        def plain_save() -> None:
            with open(plain_file, "wb") as f:
                torch.save(snapshot.state, f)
                f.flush()
                os.fsync(f.fileno())

        def protocol_save() -> None:
            pending = store.begin(1)
            snapshot.write(pending)
            pending.commit()

        def plain_round() -> float:
            seconds = timed(plain_save)
            plain_file.unlink()
            return seconds

        def protocol_round() -> float:
            seconds = timed(protocol_save)
            shutil.rmtree(store.get(1).path)
            return seconds

        plain, protocol = [], []
        for round_ in range(args.repeat + 1):
            # Alternating which goes first cancels what one run leaves the next (writeback, freed pages).
            if round_ % 2:
                plain.append(plain_round())
                protocol.append(protocol_round())
            else:
                protocol.append(protocol_round())
                plain.append(plain_round())
        # The first round warms the allocator and the page cache's free lists; it is not counted.
        plain, protocol = plain[1:], protocol[1:]
        plain_s, protocol_s = statistics.median(plain), statistics.median(protocol)
        report("(a) plain torch.save + flush + fsync", plain_s)
        met_a = report("(a) protocol save (hash, manifest, marker, fsyncs)", protocol_s, 1.05 * plain_s, plain_s)
        print(f"    spread (min..max ms): plain {_spread(plain)}, protocol {_spread(protocol)}", flush=True)

        manager = CheckpointManager(root / "manager")
        sync, blocked = [], []
        for step in range(1, 2 * (args.repeat + 1) + 1, 2):
            sync.append(timed(lambda: manager.save(step, model=model, optimizer=optimizer, blocking=True)))
            blocked.append(timed(lambda: manager.save(step + 1, model=model, optimizer=optimizer)))
            manager.wait()
            for info in manager.list():
                shutil.rmtree(info.path)
        manager.close()
        sync, blocked = sync[1:], blocked[1:]
        sync_s, blocked_s = statistics.median(sync), statistics.median(blocked)
        report("(b) synchronous manager.save (capture + protocol save)", sync_s)
        met_b = report("(b) async manager.save: time the training thread blocks", blocked_s, 0.2 * sync_s, sync_s)
        print(f"    spread (min..max ms): synchronous {_spread(sync)}, blocking {_spread(blocked)}", flush=True)
    if not (met_a and met_b):
        sys.exit(1)


if __name__ == "__main__":
    main()
