"""Checkpoints: written, committed, found, verified, retained and removed so that a resume is boring.

    layout       the storage protocol's names, states and errors (writing → committed → superseded → deleted)
    durable      the filesystem operations it is built from: fsync, whole-or-nothing files, hashing reads
    digests      which digest verifies a file: its blake3 where the manifest records one, else its sha256
    verify       whether a checkpoint is committed (its marker against its manifest) and intact (every file)
    recover      the resume target, corrupt ones set aside, supersede and delete, abandoned writes cleaned up
    write        writing → committed: payload, MANIFEST.json and the COMMITTED marker, fsynced in turn
    store        CheckpointStore: the checkpoints under one run's root, over the five above
    retention    what to keep, supersede and delete, as a plan that `trackway gc --dry-run` prints
    torch_state  a PyTorch checkpoint's content, loaded with weights_only
    hashing      a payload file hashed while it is written (sha256 on a thread of its own; blake3 where asked)
    verified_read  a payload file read once for loading, hashed on a thread of its own as it is read
    prefault     the memory a restore reads into, faulted in ahead of the reader on a thread of its own
    formats      payload formats ("torch": state.pt, "safetensors": state.safetensors) and their files
    safetensors_state  a state as one safetensors file
    async_save   saving while training continues
    object_store the same protocol under an fsspec URL (s3://, gs://, file://), so checkpoints outlive the machine
    object_fs    the storage operations it needs, on fsspec and on local or mounted filesystems
    uploader     committed checkpoints uploaded there on a background thread
    manager      `run.checkpoints` in the SDK

The public entry point is `trackway.checkpoints.load(path)` (for evaluators and notebooks).
Nothing is imported at module level, so `import trackway.checkpoints.store` never pulls in torch.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["load"]


def load(path: str | os.PathLike[str], *, rank: int = 0, map_location: Any = "cpu") -> dict[str, Any]:
    """Load the PyTorch state that `run.checkpoints.save(...)` committed, after verifying it.

    `path` is a checkpoint directory (`.../checkpoints/step-00001234`, what an evaluator gets in
    `$TRACKWAY_CHECKPOINT`) or one state file inside it (`.../step-00001234/state.pt`, or
    `state.safetensors` when it was saved with format="safetensors"). The
    checkpoint must be committed (its COMMITTED marker verifies against MANIFEST.json) and every
    file the manifest lists must have its recorded size and digest (blake3, or sha256 where the
    manifest records no blake3); otherwise a
    `trackway.checkpoints.layout.CheckpointError` (a `trackway.errors.TrackwayError`) says what
    is wrong, and nothing is loaded.

    Returns the saved state as a dict, loaded with `torch.load(weights_only=True)` or, for
    safetensors, by safetensors and JSON (so loading never runs code from the file), tensors on
    `map_location` (default "cpu"; a safetensors checkpoint takes a device only):

        state = trackway.checkpoints.load(os.environ["TRACKWAY_CHECKPOINT"])
        model.load_state_dict(state["model"])

    Keys: "model", "optimizer", "scheduler", "scaler" (each None when not saved), "data_state",
    "extra", "rng" and "format". `rank` picks one rank's shard of a multi-rank save (rank 0 is
    `state.pt` or `state.safetensors`). Checkpoints written with `run.checkpoints.writing(step)` hold your own files:
    this verifies nothing for them; open the files in the directory yourself.
    """
    from pathlib import Path

    from trackway.checkpoints.formats import expected_state_files, find_state_file, hashed_on_load
    from trackway.checkpoints.layout import CheckpointCorrupt, CheckpointError, parse_step
    from trackway.checkpoints.store import CheckpointStore
    from trackway.checkpoints.torch_state import load_state
    from trackway.checkpoints.verify import check_files

    given = Path(path).expanduser()
    if given.is_file():
        directory, filename = given.parent, given.name
    else:
        directory, filename = given, None
    step = parse_step(directory.name)
    if step is None or not directory.is_dir():
        raise CheckpointError(
            f"{given}: expected a checkpoint directory (step-N under a run's checkpoints/) or a file in one")
    store = CheckpointStore(directory.parent)
    info = store.get(step)
    if info is None or info.path.resolve() != directory.resolve() or not info.state.readable:
        state = "not a checkpoint" if info is None else info.state.value
        problems = f" ({'; '.join(info.problems)})" if info is not None and info.problems else ""
        raise CheckpointError(f"checkpoint {directory} is {state}, not committed{problems}; only committed "
                              "checkpoints are read")
    listed = (info.manifest or {}).get("files") or {}
    filename = filename or find_state_file(listed, rank)
    # The state file is hashed as it is read (once, and what is parsed is what was hashed); the rest here.
    deferred = hashed_on_load(filename) & set(listed)
    problems = sum(check_files(info.path, info.step, deferred), [])
    if problems:
        raise CheckpointError(f"checkpoint {directory} does not match its manifest: {'; '.join(problems)}")
    if filename not in listed:
        raise CheckpointError(
            f"checkpoint {directory} holds no {filename or expected_state_files(rank)} (its files: "
            f"{', '.join(sorted(listed)) or 'none'}); load() reads what run.checkpoints.save() wrote")
    try:
        return load_state(directory / filename, map_location=map_location, listed=listed if deferred else None)
    except CheckpointCorrupt as exc:
        raise CheckpointError(f"checkpoint {directory} does not match its manifest: {'; '.join(exc.problems)}") \
            from None
