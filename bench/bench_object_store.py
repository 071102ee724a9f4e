"""Checkpoints to and from an object store: trackway's upload and new-host restore against s3fs alone.

On a ~256 MiB PyTorch state (model + Adam, saved as safetensors parts: a few files) and moto's S3
server on this machine (tests/s3_server.py starts it), every figure a median over interleaved rounds
(the order alternates each round; objects and caches are removed between runs, untimed):
  (a) upload throughput of `RemoteCheckpointStore.upload` (payload under its own token with the
      local files hashed against the manifest on the side, sizes checked, manifest, conditional
      marker, read back) ≥ 0.8× that of s3fs's `put` of the same files;
  (b) for reference, untargeted: `CheckpointManager.restore_latest` on an empty cache (list, download,
      every byte hashed, local commit with fsync, load into the model) against s3fs's `get` of the
      same files.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import figure  # noqa: E402

import torch  # noqa: E402

from trackway.checkpoints.manager import CheckpointManager  # noqa: E402
from trackway.checkpoints.object_store import RemoteCheckpointStore  # noqa: E402

_SPEC = importlib.util.spec_from_file_location(
    "trackway_tests_s3_server", Path(__file__).resolve().parent.parent / "tests" / "s3_server.py")
s3_server = sys.modules.setdefault(_SPEC.name, importlib.util.module_from_spec(_SPEC))
_SPEC.loader.exec_module(s3_server)


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


def interleaved(trials: dict[str, Callable[[int], float]], repeat: int) -> dict[str, list[float]]:
    """Seconds of each trial (each times itself and cleans up untimed), in turn; round 0 warms up and is dropped."""
    names = list(trials)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(repeat + 1):
        for i in range(len(names)):
            name = names[(round_ + i) % len(names)]
            seconds = trials[name](round_)
            if round_:
                samples[name].append(seconds)
    return samples


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    model, optimizer = build_state(args.megabytes)
    with s3_server.running_moto() as server, tempfile.TemporaryDirectory() as tmp:
        os.environ.update(server.env)  # as in an attempt: s3fs and botocore read the endpoint from here
        import s3fs

        root = Path(tmp)
        saver = CheckpointManager(root / "host-a", async_save=False, format="safetensors")
        saver.save(1, model=model, optimizer=optimizer)
        saver.close()
        (local,) = saver.list()
        files = sorted(local.manifest["files"])
        nbytes = sum(entry["size"] for entry in local.manifest["files"].values())
        bucket = server.bucket("bench")
        fs = s3fs.S3FileSystem()
        print(f"checkpoint: {nbytes / 2**20:.0f} MiB in {len(files)} files ({', '.join(files)}); "
              f"{args.repeat} interleaved rounds; load average {os.getloadavg()[0]:.2f} on "
              f"{len(os.sched_getaffinity(0))} cores", flush=True)

        def trackway_upload(round_: int) -> float:
            store = RemoteCheckpointStore(f"s3://{bucket}/trackway-{round_}")
            seconds = timed(lambda: store.upload(local))
            fs.rm(f"{bucket}/trackway-{round_}", recursive=True)
            return seconds

        def s3fs_put(round_: int) -> float:
            seconds = timed(lambda: fs.put([str(local.path / f) for f in files],
                                           [f"{bucket}/put-{round_}/{f}" for f in files]))
            fs.rm(f"{bucket}/put-{round_}", recursive=True)
            return seconds

        uploads = interleaved({"trackway": trackway_upload, "s3fs": s3fs_put}, args.repeat)

        url = f"s3://{bucket}/restore"
        RemoteCheckpointStore(url).upload(local)
        fs.put([str(local.path / f) for f in files], [f"{bucket}/plain/{f}" for f in files])
        fresh_model, fresh_optimizer = build_state(args.megabytes)

        def trackway_restore(round_: int) -> float:
            cache = root / f"host-b-{uuid.uuid4().hex[:6]}"
            manager = CheckpointManager(cache, remote_url=url)
            seconds = timed(lambda: manager.restore_latest(model=fresh_model, optimizer=fresh_optimizer))
            manager.close()
            shutil.rmtree(cache)
            return seconds

        def s3fs_get(round_: int) -> float:
            target = root / f"plain-{uuid.uuid4().hex[:6]}"
            seconds = timed(lambda: fs.get([f"{bucket}/plain/{f}" for f in files], [str(target / f) for f in files]))
            shutil.rmtree(target)
            return seconds

        restores = interleaved({"trackway": trackway_restore, "s3fs": s3fs_get}, args.repeat)
        restored_ok = all(torch.equal(a, b) for a, b in zip(fresh_model.state_dict().values(),
                                                             model.state_dict().values()))

    up = {name: nbytes / statistics.median(values) / 1e6 for name, values in uploads.items()}
    down = {name: statistics.median(values) for name, values in restores.items()}
    met = [
        figure("(a) RemoteCheckpointStore.upload throughput", up["trackway"], unit="MB/s", baseline=up["s3fs"],
               baseline_name="s3fs put", target_ratio=0.8, higher_is_better=True),
    ]
    figure("(b) restore_latest on an empty cache (download, hash, commit, load)", down["trackway"],
           baseline=down["s3fs"], baseline_name="s3fs get")
    spread = ", ".join(f"{kind} {name} {min(v):.2f}..{max(v):.2f} s"
                       for kind, runs in (("upload", uploads), ("restore", restores)) for name, v in runs.items())
    print(f"    spread: {spread}; restored tensors equal the saved ones: {restored_ok}", flush=True)
    if not all(met) or not restored_ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
