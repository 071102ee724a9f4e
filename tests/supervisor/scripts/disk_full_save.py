"""Trains a few steps, then saves a checkpoint into DIR, a small file system that fills up, and dies of it.

`python disk_full_save.py DIR MODE`

- sdk-wrapped: with the SDK; the save's real ENOSPC is the __cause__ of a RuntimeError naming DIR,
  as a checkpointing library reports it.
- plain: no SDK; the save's real ENOSPC (an OSError naming no file) is uncaught.
- named: no SDK; raises OSError(ENOSPC, ..., DIR/model.bin), as a library that checks free space does.
"""

import errno
import os
import sys
from pathlib import Path

directory, mode = Path(sys.argv[1]), sys.argv[2]
run = None
if mode == "sdk-wrapped":
    import trackway

    run = trackway.init()
for step in range(3):
    if run is not None:
        run.log({"loss": 1.0 / (step + 1)}, step=step)
    print(f"step {step}", flush=True)


def save(path: Path) -> None:
    """Write 'weights' until the file system is full (a real ENOSPC from write())."""
    chunk = b"\0" * (64 * 1024)
    with path.open("wb") as f:
        while True:
            f.write(chunk)
            f.flush()
            os.fsync(f.fileno())


target = directory / "model.bin"
if mode == "named":
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(target))
if mode == "plain":
    save(target)
try:
    save(target)
except OSError as exc:
    raise RuntimeError(f"saving checkpoint to {directory} failed") from exc
