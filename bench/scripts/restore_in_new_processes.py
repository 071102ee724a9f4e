"""The restore of bench_checkpoint_speed.py's (e), as a resume does it: once, in a process that has done nothing else yet.

`python restore_in_new_processes.py ROOT MEGABYTES ROUNDS` prints one JSON object: for each trial,
the seconds of each round.

This process imports torch and trackway and then only forks: each trial runs in a child of its own,
so its tensors land in new pages, as in a trainer that starts after a preemption (a process that
restored before may reuse freed memory that is already mapped, which no resume can). The child
builds the model and the optimizer a resume builds (Adam without state yet), then times one of:

    restore     CheckpointManager(ROOT).restore_latest(model=, optimizer=): pick, verify, load, load_state_dict
    torch.load  torch.load(state.pt, weights_only=True) of the same file
    blake3      the file's BLAKE3 over its bytes already in memory, on one core (what a restore must hash)

The file is read once first, so that it is in the page cache; round 0 warms the rest and is
dropped; the rounds rotate which trial goes first.
"""

import json
import os
import sys
import time
from pathlib import Path

import torch
from blake3 import blake3

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_checkpoint_speed import fresh_trainer  # noqa: E402

from trackway.checkpoints.manager import CheckpointManager  # noqa: E402

TRIALS = ("restore", "torch.load", "blake3")


def one_trial(trial: str, root: Path, megabytes: int) -> float:
    model, optimizer = fresh_trainer(megabytes)  # what a resume builds before it restores
    state_file = root / "step-00000001" / "state.pt"
    if trial == "blake3":
        data = state_file.read_bytes()
        started = time.perf_counter()
        blake3(data).hexdigest()
        return time.perf_counter() - started
    started = time.perf_counter()
    if trial == "restore":
        restored = CheckpointManager(root).restore_latest(model=model, optimizer=optimizer)
        seconds = time.perf_counter() - started
        assert restored is not None and restored.step == 1 and optimizer.state, "the restore loaded nothing"
        return seconds
    torch.load(state_file, weights_only=True)
    return time.perf_counter() - started


def in_a_child(trial: str, root: Path, megabytes: int) -> float:
    """One trial in a forked child (this process ran no torch op, so the child starts torch's threads anew)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.close(read_end)
            os.write(write_end, json.dumps(one_trial(trial, root, megabytes)).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as answer:
        reply = answer.read()
    _, status = os.waitpid(pid, 0)
    if status != 0 or not reply:
        raise SystemExit(f"the {trial} trial's process failed (wait status {status})")
    return json.loads(reply)


def main() -> None:
    root, megabytes, rounds = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    with open(root / "step-00000001" / "state.pt", "rb") as f:
        while f.read(8 << 20):
            pass
    seconds: dict[str, list[float]] = {trial: [] for trial in TRIALS}
    for round_ in range(rounds + 1):
        for i in range(len(TRIALS)):
            trial = TRIALS[(round_ + i) % len(TRIALS)]
            took = in_a_child(trial, root, megabytes)
            if round_:
                seconds[trial].append(took)
    print(json.dumps(seconds))


if __name__ == "__main__":
    main()
