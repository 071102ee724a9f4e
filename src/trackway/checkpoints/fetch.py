"""A checkpoint in an object store as a verified local directory: for evaluators on another machine.

An evaluation seed of a run whose checkpoints live in an object store is pinned to the
checkpoint's URL (`s3://bucket/prefix/RUN/step-00001234`). Its command is started through

    python -m trackway.checkpoints.fetch -- COMMAND...

which downloads that checkpoint into a local cache (every byte hashed against the manifest
before it is committed there: object_store.RemoteCheckpointStore.download), then runs COMMAND
with $TRACKWAY_CHECKPOINT set to the local directory and $TRACKWAY_CHECKPOINT_URL to where it was
read, so an evaluator reads a directory exactly as it does on the training machine. A copy
already in the cache is used again only while it is committed and its manifest is the remote
one's. The cache is $TRACKWAY_CACHE_DIR/checkpoints, else ~/.cache/trackway/checkpoints.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from trackway.checkpoints.layout import CheckpointError, parse_step
from trackway.checkpoints.store import CheckpointStore


def cache_root() -> Path:
    base = os.environ.get("TRACKWAY_CACHE_DIR")
    return (Path(base) if base else Path.home() / ".cache" / "trackway") / "checkpoints"


def local_copy(url: str, root: Path | None = None) -> Path:
    """The committed, verified local directory holding the checkpoint at `url` (downloaded when needed)."""
    from trackway.checkpoints.object_store import RemoteCheckpointStore

    parent, _, name = url.rstrip("/").rpartition("/")
    step = parse_step(name)
    if step is None or not parent:
        raise CheckpointError(f"{url}: expected a checkpoint's URL ending in /step-N")
    remote = RemoteCheckpointStore(parent)
    wanted = remote.get(step)
    if wanted is None or not wanted.state.readable:
        state = "not in the store" if wanted is None else wanted.state.value
        raise CheckpointError(f"checkpoint {url} is {state}; only committed checkpoints are read")
    cache = CheckpointStore((root or cache_root()) / hashlib.sha256(parent.encode()).hexdigest()[:20])
    held = cache.get(step)
    if held is not None and held.state.readable and _manifest_sha256(held.path) == wanted.manifest_sha256 \
            and not cache.verify(held):
        return held.path
    return remote.download(wanted, into=cache).path


def _manifest_sha256(directory: Path) -> str | None:
    try:
        return hashlib.sha256((directory / "MANIFEST.json").read_bytes()).hexdigest()
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print("usage: python -m trackway.checkpoints.fetch -- COMMAND...", file=sys.stderr)
        return 2
    url = os.environ.get("TRACKWAY_CHECKPOINT", "")
    if "://" in url:
        try:
            path = local_copy(url)
        except CheckpointError as exc:
            print(f"trackway: {exc}", file=sys.stderr, flush=True)
            return 1
        print(f"trackway: checkpoint {url} verified into {path}", file=sys.stderr, flush=True)
        os.environ["TRACKWAY_CHECKPOINT_URL"] = url
        os.environ["TRACKWAY_CHECKPOINT"] = str(path)
    try:
        os.execvp(args[0], args)
    except OSError as exc:
        print(f"trackway: cannot start {args[0]}: {exc}", file=sys.stderr, flush=True)
        return 127


if __name__ == "__main__":
    sys.exit(main())
