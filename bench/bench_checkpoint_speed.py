"""Checkpoint speed on a ≥ 200 MB PyTorch state (model + Adam): the protocol's cost, and what async saving blocks.

Targets (issue 12), against a plain `torch.save(state, f)` + `f.flush()` + `os.fsync()` of the same
captured state ("plain save"), every figure a median over rounds that run it in turn with the
plain save (the order rotates each round, files are removed between runs, untimed):
  (a) the protocol's synchronous save, torch payload (temp dir → serialize, hashing as it
      writes → fsync → manifest → marker → renames → directory fsyncs) ≤ 1.05× the plain save;
  (b) the same with the safetensors payload ≤ 0.8× the plain save;
  (c) the async manager.save's blocking time (what the training thread waits for: the copy into
      host buffers) ≤ 0.1× the plain save.
Restore (issue 39), against `torch.load(state.pt, weights_only=True)` of the same file, interleaved:
  (d) `restore_latest(model=, optimizer=)` of that checkpoint (pick, verify every byte against the
      manifest, load, load_state_dict) read from storage, as a restore after a save reads it (the
      writer drops the file's pages from the page cache as it writes; a new host has none)
      ≤ 1.3× torch.load read from storage (both start with the file out of the page cache);
  (e) the same with the file in the page cache, as a resume runs it: once, in a new process
      (scripts/restore_in_new_processes.py: each trial in a process of its own, whose tensors are
      new pages), ≤ 1.3× the slower of torch.load in such a process and the digest a restore checks
      (the state file's BLAKE3, checkpoints/digests.py) of the file's bytes already in memory, on
      one core: a verified restore hashes every byte.
      For reference, untargeted: the same repeated in this one process, where each restore and
      torch.load may reuse memory the previous one freed (a loop over checkpoints, say); there
      the restore's hashing and load_state_dict's copy are not hidden behind new pages' faults.
For reference, untargeted: torch's own copy_ of the state into preallocated tensors (what (c)
would block with torch's copy in place of the capture's streaming stores), safetensors' own
save_file + fsync of the same tensors, a synchronous manager.save (capture + protocol save),
and, on a machine with a GPU, the bandwidth of a capture's copy from the GPU (pinned buffers, a
copy stream of its own) and what that capture blocks.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import figure  # noqa: E402

import torch  # noqa: E402

from trackway.checkpoints.manager import CheckpointManager  # noqa: E402
from trackway.checkpoints.store import CheckpointStore  # noqa: E402
from trackway.checkpoints.torch_state import COPY, HostBuffers, Snapshot, capture  # noqa: E402

PLAIN = "plain torch.save + fsync"


def fresh_trainer(megabytes: int, device: str = "cpu") -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A model whose state with Adam's is about `megabytes`, freshly initialised, and that Adam with no state yet."""
    # Adam keeps two moments per parameter, so the state is three times the weights.
    width = 2048
    layers = max(1, round(megabytes * 2**20 / 3 / 4 / (width * width)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)]).to(device)
    return model, torch.optim.Adam(model.parameters(), lr=1e-4)


def build_state(megabytes: int, device: str = "cpu") -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """`fresh_trainer` after one step, so that Adam holds its moments."""
    model, optimizer = fresh_trainer(megabytes, device)
    model(torch.randn(4, model[0].in_features, device=device)).sum().backward()
    optimizer.step()
    return model, optimizer


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def interleaved(trials: dict[str, Callable[[], float]], repeat: int) -> dict[str, list[float]]:
    """Seconds of each trial (each times itself, leaving its cleanup untimed), run in turn round after round.

    The starting trial rotates every round, so what one run leaves the next (writeback, freed
    extents) falls on each in turn; round 0 warms the allocator and the page cache and is dropped.
    """
    names = list(trials)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(repeat + 1):
        for i in range(len(names)):
            name = names[(round_ + i) % len(names)]
            seconds = trials[name]()
            if round_:
                samples[name].append(seconds)
    return samples


def _spread(samples: list[float]) -> str:
    return f"{min(samples) * 1000:.0f}..{max(samples) * 1000:.0f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=240)
    parser.add_argument("--repeat", type=int, default=11)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--restore-only", action="store_true", help="only (d) and (e), the restore figures")
    args = parser.parse_args()

    model, optimizer = build_state(args.megabytes)
    if args.restore_only:
        sys.exit(0 if all(restore_figures(model, optimizer, args.repeat, args.dir, args.megabytes)) else 1)
    as_torch = capture(model, optimizer, buffers=HostBuffers())
    as_safetensors = capture(model, optimizer, buffers=HostBuffers(), format="safetensors")
    flat = {name: t for part in as_safetensors.layout.parts for name, t in zip(part.names, part.tensors)}
    print(f"state: {as_torch.nbytes / 1e6:.0f} MB (model + Adam), {args.repeat} interleaved rounds; "
          f"load average {os.getloadavg()[0]:.2f} on {len(os.sched_getaffinity(0))} cores; "
          f"captures copy CPU tensors with {COPY}", flush=True)

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        plain_file, library_file = root / "plain.pt", root / "library.safetensors"
        store = CheckpointStore(root / "protocol")
        manager = CheckpointManager(root / "manager")
        steps = iter(range(1, 10**9))

        def plain() -> float:
            def save() -> None:
                with open(plain_file, "wb") as f:
                    torch.save(as_torch.state, f)
                    f.flush()
                    os.fsync(f.fileno())

            seconds = timed(save)
            plain_file.unlink()
            return seconds

        def protocol(snapshot: Snapshot) -> Callable[[], float]:
            def run() -> float:
                def save() -> None:
                    pending = store.begin(1)
                    snapshot.write(pending)
                    pending.commit()

                seconds = timed(save)
                shutil.rmtree(store.get(1).path)
                return seconds

            return run

        def library() -> float:
            from safetensors.torch import save_file

            def save() -> None:
                save_file(flat, library_file)
                fd = os.open(library_file, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)

            seconds = timed(save)
            library_file.unlink()
            return seconds

        def manager_save(blocking: bool) -> Callable[[], float]:
            def run() -> float:
                seconds = timed(lambda: manager.save(next(steps), model=model, optimizer=optimizer, blocking=blocking))
                manager.wait()
                for info in manager.list():
                    shutil.rmtree(info.path)
                return seconds

            return run

        # For scale: torch's own copy of every tensor into tensors allocated before (the capture streams its stores).
        sources = as_torch.tensors
        copies = [torch.empty_like(t) for t in sources]

        def copy_once() -> float:
            def copy() -> None:
                for target, source in zip(copies, sources):
                    target.copy_(source)

            return timed(copy)

        samples = interleaved({
            PLAIN: plain,
            "copy": copy_once,
            "torch": protocol(as_torch),
            "safetensors": protocol(as_safetensors),
            "library": library,
            "blocked": manager_save(blocking=False),
            "sync": manager_save(blocking=True),
        }, args.repeat)
        manager.close()
    medians = {name: statistics.median(values) for name, values in samples.items()}
    base = medians[PLAIN]
    met = [
        figure("(a) protocol save, torch payload (hash, manifest, marker)", medians["torch"],
               baseline=base, baseline_name=PLAIN, target_ratio=1.05),
        figure("(b) protocol save, safetensors payload", medians["safetensors"],
               baseline=base, baseline_name=PLAIN, target_ratio=0.8),
        figure("(c) async manager.save: time the training thread blocks", medians["blocked"],
               baseline=base, baseline_name=PLAIN, target_ratio=0.1),
    ]
    figure("    torch's copy_ of every tensor into preallocated ones (reference)", medians["copy"], baseline=base,
           baseline_name=PLAIN)
    figure("    safetensors' save_file + fsync (reference)", medians["library"], baseline=base, baseline_name=PLAIN)
    figure("    synchronous manager.save (capture + protocol save)", medians["sync"], baseline=base,
           baseline_name=PLAIN)
    print("    spread: " + ", ".join(f"{name} {_spread(values)}" for name, values in samples.items()), flush=True)
    met += restore_figures(model, optimizer, args.repeat, args.dir, args.megabytes)
    if torch.cuda.is_available():
        gpu_copy(args.megabytes, args.repeat)
    else:
        print("    no GPU here: the copy from GPU memory (pinned buffers, own stream) was not measured", flush=True)
    print(f"    load average at the end {os.getloadavg()[0]:.2f}", flush=True)
    if not all(met):
        sys.exit(1)


def restore_figures(model: torch.nn.Module, optimizer: torch.optim.Optimizer, repeat: int, where: Path | None,
                    megabytes: int) -> list[bool]:
    """(d) and (e): restore_latest of one checkpoint against torch.load of its state file, cold and cached."""
    import hashlib

    from blake3 import blake3

    with tempfile.TemporaryDirectory(dir=where) as tmp:
        root = Path(tmp) / "restore"
        with CheckpointManager(root, async_save=False) as manager:
            manager.save(1, model=model, optimizer=optimizer)
        state_file = root / "step-00000001" / "state.pt"
        size = state_file.stat().st_size

        def evict() -> None:
            fd = os.open(state_file, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # clean pages: dropped from the page cache
            finally:
                os.close(fd)

        def restore(cold: bool) -> Callable[[], float]:
            def run() -> float:
                if cold:
                    evict()
                restored = timed(lambda: CheckpointManager(root).restore_latest(model=model, optimizer=optimizer))
                assert CheckpointManager(root).list()[0].name == "step-00000001"  # nothing set aside
                return restored

            return run

        def load(cold: bool) -> Callable[[], float]:
            def run() -> float:
                if cold:
                    evict()
                return timed(lambda: torch.load(state_file, weights_only=True))

            return run

        data = state_file.read_bytes()
        samples = interleaved({
            "restore cold": restore(True), "torch.load cold": load(True),
            "restore": restore(False), "torch.load": load(False),
            "sha256": lambda: timed(lambda: hashlib.sha256(data).hexdigest()),
            "blake3": lambda: timed(lambda: blake3(data).hexdigest()),
        }, repeat)
        fresh = new_processes(root, megabytes, repeat)
    medians = {name: statistics.median(values) for name, values in samples.items()}
    new = {name: statistics.median(values) for name, values in fresh.items()}
    floor = max(new["torch.load"], new["blake3"])
    floor_name = ("torch.load in a new process" if floor == new["torch.load"]
                  else "blake3 of the bytes in memory, one core")
    met = [
        figure(f"(d) restore_latest of a {size / 1e6:.0f} MB checkpoint, read from storage", medians["restore cold"],
               baseline=medians["torch.load cold"], baseline_name="torch.load, read from storage", target_ratio=1.3),
        figure(f"(e) restore_latest of a {size / 1e6:.0f} MB checkpoint, in the page cache, in a new process",
               new["restore"], baseline=floor, baseline_name=floor_name, target_ratio=1.3),
    ]
    figure("    (e) repeated in one process, memory reused (reference)", medians["restore"],
           baseline=max(medians["torch.load"], medians["blake3"]), baseline_name="the slower of torch.load and blake3 there")
    figure("    blake3 of the file's bytes in memory, one core (reference)", medians["blake3"],
           baseline=medians["torch.load"], baseline_name="torch.load")
    figure("    sha256 of the file's bytes in memory (reference: what a checkpoint without a blake3 waits for)",
           medians["sha256"], baseline=medians["torch.load"], baseline_name="torch.load")
    print("    spread: " + ", ".join(f"{name} {_spread(values)}" for name, values in samples.items())
          + "; in new processes: " + ", ".join(f"{name} {_spread(values)}" for name, values in fresh.items()), flush=True)
    return met


def new_processes(root: Path, megabytes: int, repeat: int) -> dict[str, list[float]]:
    """Seconds of restore, torch.load and blake3 of root's checkpoint, each round's each in a process of its own."""
    script = Path(__file__).resolve().parent / "scripts" / "restore_in_new_processes.py"
    done = subprocess.run([sys.executable, str(script), str(root), str(megabytes), str(repeat)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{script.name} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout)


def gpu_copy(megabytes: int, repeat: int) -> None:
    """A capture of the same state on the GPU: what it blocks, and its copy's bandwidth (queue to landed)."""
    model, optimizer = build_state(megabytes, device="cuda")
    buffers = HostBuffers()
    capture(model, optimizer, buffers=buffers).wait_ready()  # pins the buffers
    blocked, landed, nbytes = [], [], 0
    for _ in range(repeat):
        torch.cuda.synchronize()
        started = time.perf_counter()
        snapshot = capture(model, optimizer, buffers=buffers)
        blocked.append(time.perf_counter() - started)
        snapshot.wait_ready()
        landed.append(time.perf_counter() - started)
        nbytes = snapshot.nbytes
    figure("    GPU capture: time the training thread blocks", statistics.median(blocked))
    figure("    GPU capture: copy to pinned host memory", nbytes / statistics.median(landed) / 1e6, unit="MB/s",
           higher_is_better=True)


if __name__ == "__main__":
    main()
