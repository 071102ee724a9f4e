"""Checkpoints that outlive the machine: the protocol on a real S3 (moto's server) and on a file:// volume.

Every case runs on both backends. After each fault (a writer killed anywhere in an upload, a
marker without its manifest, two writers on one step, a truncated or altered object) a new host's
`restore_latest()` must load the newest checkpoint that really committed, whole, and say what it
skipped and where it read it; nothing partial is ever committed into its cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from trackway.checkpoints.layout import MANIFEST, MARKER, CheckpointError, CheckpointState
from trackway.checkpoints.manager import CheckpointManager
from trackway.checkpoints.object_store import (
    CRASH_POINTS,
    RemoteCheckpoint,
    RemoteCheckpointStore,
    RemoteStoreError,
    UploadLost,
)
from trackway.checkpoints.retention import RetentionPolicy
from trackway.checkpoints.store import CheckpointStore
from trackway.checkpoints.torch_state import FORMAT
from trackway.checkpoints.uploader import Uploader

WRITER = Path(__file__).parent / "scripts" / "remote_writer.py"
SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture(params=["s3", "file"])
def url(request, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A run's remote checkpoint root: on S3 (credentials and endpoint from the environment), or a file:// volume."""
    if request.param == "file":
        return f"file://{tmp_path / 'volume' / 'run-1'}"
    server = request.getfixturevalue("s3_server")
    for name, value in server.env.items():
        monkeypatch.setenv(name, value)
    return f"s3://{server.bucket('ckpt')}/runs/run-1"


def weights(step: int, variant: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(step * 100 + variant)
    return {"weight": torch.randn(8, 4, generator=generator), "bias": torch.randn(8, generator=generator)}


def blob(step: int, part: int, variant: int = 0, size: int = 48 << 10) -> bytes:
    return hashlib.sha256(f"{step}/{part}/{variant}".encode()).digest() * (size // 32)


def commit(root: Path, step: int, variant: int = 0, parts: int = 3, size: int = 48 << 10):
    """A committed local checkpoint of several files: state.pt (a model's tensors) and shards/part-N.bin."""
    pending = CheckpointStore(root).begin(step, run_id="run-1")
    state = io.BytesIO()
    torch.save({"format": FORMAT, "model": weights(step, variant), "data_state": {"step": step}}, state)
    with pending.open("state.pt") as f:
        f.write(state.getvalue())
    for part in range(parts):
        with pending.open(f"shards/part-{part}.bin") as f:
            f.write(blob(step, part, variant, size))
    return pending.commit(metrics={"loss": 1.0 / (step + 1)})


def restore_on_a_new_host(cache: Path, url: str) -> tuple[object, dict, torch.nn.Linear]:
    heard: list[dict] = []
    manager = CheckpointManager(cache, remote_url=url, on_restore=heard.append)
    model = torch.nn.Linear(4, 8)
    restored = manager.restore_latest(model=model)
    manager.close()
    return restored, heard[0], model


def same_weights(model: torch.nn.Module, expected: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(model.state_dict()[key], value) for key, value in expected.items())


def objects(store: RemoteCheckpointStore, under: str = "") -> dict[str, bytes]:
    """{path below the root: bytes} of every object the store holds (under a prefix)."""
    base = f"{store.root}/{under}".rstrip("/")
    store.fs.invalidate_cache()
    return {path[len(store.root) + 1:]: store.fs.cat_file(path) for path in store.fs.find(base)}


def run_writer(*args: str, crash: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    env.pop("TRACKWAY_CHECKPOINT_CRASH_AT", None)
    if crash:
        env["TRACKWAY_CHECKPOINT_CRASH_AT"] = crash
    return subprocess.run([sys.executable, str(WRITER), *args], env=env, capture_output=True, text=True, timeout=120)


# -- the happy path ------------------------------------------------------------------------------


def test_a_new_host_restores_the_tensors_another_host_saved(url: str, tmp_path: Path) -> None:
    uploaded: list[tuple[str, str]] = []
    first = CheckpointManager(tmp_path / "host-a", remote_url=url,
                              on_upload=lambda remote, seconds: uploaded.append((remote.name, remote.url)))
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 8)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    for step in (10, 20):
        model(torch.ones(2, 4)).sum().backward()
        optimizer.step()
        first.save(step, model=model, optimizer=optimizer, data_state={"step": step})
    first.close()
    assert uploaded == [(f"step-000000{s}", f"{url}/step-000000{s}") for s in (10, 20)]

    heard: list[dict] = []
    second = CheckpointManager(tmp_path / "host-b", remote_url=url, on_restore=heard.append)
    fresh = torch.nn.Linear(4, 8)
    fresh_optimizer = torch.optim.Adam(fresh.parameters(), lr=0.1)
    restored = second.restore_latest(model=fresh, optimizer=fresh_optimizer)
    assert restored.step == 20 and restored.data_state == {"step": 20}
    assert same_weights(fresh, model.state_dict())
    assert fresh_optimizer.state_dict()["state"][0]["exp_avg"].equal(optimizer.state_dict()["state"][0]["exp_avg"])
    assert heard == [{"name": "step-00000020", "step": 20, "source": f"{url}/step-00000020", "fallback_from": []}]
    # Only the newest came down, as an ordinary committed checkpoint with the uploader's manifest.
    (copy,) = second.list()
    original = CheckpointStore(tmp_path / "host-a").get(20)
    assert copy.state is CheckpointState.COMMITTED and second.store.verify(copy) == []
    assert (copy.path / MANIFEST).read_bytes() == (original.path / MANIFEST).read_bytes()


def test_the_cache_is_read_when_as_new_as_the_store_and_a_newer_one_is_downloaded(url: str, tmp_path: Path) -> None:
    store = RemoteCheckpointStore(url)
    for step in (10, 20):
        store.upload(commit(tmp_path / "host-a", step))
    restored, record, model = restore_on_a_new_host(tmp_path / "host-a", url)
    assert record["source"] == str(tmp_path / "host-a" / "step-00000020") and same_weights(model, weights(20))

    store.upload(commit(tmp_path / "host-b", 30))  # another host went further
    restored, record, model = restore_on_a_new_host(tmp_path / "host-a", url)
    assert (restored.step, record["source"]) == (30, f"{url}/step-00000030") and same_weights(model, weights(30))
    assert [c.step for c in CheckpointStore(tmp_path / "host-a").list()] == [10, 20, 30]


def test_upload_is_idempotent_and_lists_what_readers_trust(url: str, tmp_path: Path) -> None:
    store = RemoteCheckpointStore(url)
    local = commit(tmp_path / "host", 7)
    first = store.upload(local)
    again = store.upload(local)
    assert again.token == first.token and again.state is CheckpointState.COMMITTED
    assert (first.step, first.name, first.url) == (7, "step-00000007", f"{url}/step-00000007")
    assert first.size_bytes == local.size_bytes and first.manifest == local.manifest
    assert first.manifest_sha256 == hashlib.sha256((local.path / MANIFEST).read_bytes()).hexdigest()
    marker = json.loads(objects(store)[f"step-00000007/{MARKER}"])
    assert {k: marker[k] for k in ("step", "token", "manifest_sha256")} == {
        "step": 7, "token": first.token, "manifest_sha256": first.manifest_sha256}
    held = objects(store)
    assert sorted(held) == sorted([f"step-00000007/{MARKER}", f"step-00000007/{first.token}/{MANIFEST}",
                                   *(f"step-00000007/{first.token}/{rel}" for rel in local.manifest["files"])])
    assert held[f"step-00000007/{first.token}/{MANIFEST}"] == (local.path / MANIFEST).read_bytes()
    assert store.latest_committed().token == first.token and store.verify(first) == []
    assert store.debris() == []


# -- a writer killed anywhere ---------------------------------------------------------------------


@pytest.mark.parametrize("point", [p for p in CRASH_POINTS if p.startswith("upload_")])
def test_an_upload_killed_anywhere_is_never_restored_half_done(url: str, tmp_path: Path, point: str) -> None:
    store = RemoteCheckpointStore(url)
    store.upload(commit(tmp_path / "host-a", 10))
    commit(tmp_path / "host-a", 20)
    done = run_writer("upload", str(tmp_path / "host-a"), "20", url, crash=point)
    assert done.returncode == -signal.SIGKILL, done.stderr

    landed = point == "upload_after_marker"
    restored, record, model = restore_on_a_new_host(tmp_path / "host-b", url)
    assert restored.step == (20 if landed else 10) and record["fallback_from"] == []
    assert same_weights(model, weights(restored.step))
    assert store.get(20).state is (CheckpointState.COMMITTED if landed else CheckpointState.WRITING)
    debris = store.debris()
    assert len(debris) == (0 if landed else 1) and all(d.startswith(f"{url}/step-00000020/") for d in debris)
    assert store.clean_debris() == []  # young: it could be an upload still going on
    assert store.clean_debris(min_age_s=0) == debris
    assert store.debris() == [] and (store.get(20) is not None) == landed
    assert store.upload(CheckpointStore(tmp_path / "host-a").get(20)).state is CheckpointState.COMMITTED


def test_sigkill_while_a_large_payload_goes_up_leaves_only_debris(url: str, tmp_path: Path) -> None:
    store = RemoteCheckpointStore(url)
    store.upload(commit(tmp_path / "host-a", 10))
    commit(tmp_path / "host-a", 20, parts=6, size=8 << 20)
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    env.pop("TRACKWAY_CHECKPOINT_CRASH_AT", None)
    writer = subprocess.Popen([sys.executable, str(WRITER), "upload", str(tmp_path / "host-a"), "20", url],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and writer.poll() is None and not any(
            path.startswith("step-00000020/") for path in _names(store)):
        time.sleep(0.005)
    writer.kill()
    writer.communicate()

    # Killed while the payload went up (or, on a very fast store, just after the marker): either
    # way what a new host restores is whole, and nothing half-uploaded counts.
    restored, record, model = restore_on_a_new_host(tmp_path / "host-b", url)
    assert same_weights(model, weights(restored.step)) and record["fallback_from"] == []
    committed = store.get(20).state is CheckpointState.COMMITTED
    assert restored.step == (20 if committed else 10)
    assert bool(store.debris()) != committed


def _names(store: RemoteCheckpointStore) -> list[str]:
    store.fs.invalidate_cache()
    return [path[len(store.root) + 1:] for path in store.fs.find(store.root)]


# -- damage in the store --------------------------------------------------------------------------


def _object(store: RemoteCheckpointStore, ckpt: RemoteCheckpoint, name: str) -> str:
    return f"{store.root}/{ckpt.name}/{ckpt.token}/{name}"


def _tamper(store: RemoteCheckpointStore, ckpt: RemoteCheckpoint, how: str) -> None:
    fs = store.fs
    if how == "manifest missing":
        fs.rm_file(_object(store, ckpt, MANIFEST))
    elif how == "manifest truncated":
        fs.pipe_file(_object(store, ckpt, MANIFEST), ckpt.manifest_bytes[: len(ckpt.manifest_bytes) // 2])
    elif how == "marker torn":
        fs.pipe_file(f"{store.root}/{ckpt.name}/{MARKER}", b'{"step": 20, "tok')
    elif how == "object truncated":
        path = _object(store, ckpt, "shards/part-1.bin")
        fs.pipe_file(path, fs.cat_file(path)[:1000])
    elif how == "object missing":
        fs.rm_file(_object(store, ckpt, "state.pt"))
    elif how == "byte flipped":
        path = _object(store, ckpt, "shards/part-2.bin")
        data = bytearray(fs.cat_file(path))
        data[len(data) // 2] ^= 0xFF
        fs.pipe_file(path, bytes(data))
    fs.invalidate_cache()


@pytest.mark.parametrize("how, evidence", [
    ("manifest missing", "MANIFEST.json is missing"),
    ("manifest truncated", "but MANIFEST.json is"),
    ("marker torn", "torn or garbage marker"),
    ("object truncated", "shards/part-1.bin: 1000 bytes, manifest says"),
    ("object missing", "state.pt: missing"),
    ("byte flipped", "shards/part-2.bin: sha256"),
])
def test_a_damaged_newest_checkpoint_is_set_aside_and_the_one_before_restored(
    url: str, tmp_path: Path, how: str, evidence: str
) -> None:
    store = RemoteCheckpointStore(url)
    store.upload(commit(tmp_path / "host-a", 10))
    newest = store.upload(commit(tmp_path / "host-a", 20))
    _tamper(store, newest, how)
    # The listing's check (marker, manifest, sizes) sees all but a changed byte; the download sees that.
    seen = store.get(20)
    assert seen.state is (CheckpointState.COMMITTED if how == "byte flipped" else CheckpointState.CORRUPT)
    assert store.latest_committed().step == (20 if how == "byte flipped" else 10)

    restored, record, model = restore_on_a_new_host(tmp_path / "host-b", url)
    assert restored.step == 10 and same_weights(model, weights(10))
    (skipped,) = record["fallback_from"]
    assert skipped["name"] == "step-00000020" and evidence in skipped["reason"]
    assert skipped["set_aside_as"].startswith("step-00000020.corrupt-")
    assert skipped["path"] == f"{url}/{skipped['set_aside_as']}"
    # Nothing of step 20 was committed into the cache, and no half-written copy is left there.
    cache = tmp_path / "host-b"
    assert sorted(p.name for p in cache.iterdir() if not p.name.startswith(".debris")) == ["step-00000010"]
    # In the store: out of the resume path, its marker kept as evidence, and the objects it names
    # too (a torn marker names none: those are debris).
    assert store.get(20).state is CheckpointState.WRITING
    assert store.debris() == ([f"{url}/step-00000020/{newest.token}"] if how == "marker torn" else [])
    assert objects(store, skipped["set_aside_as"])[f"{skipped['set_aside_as']}/{MARKER}"] == seen.marker
    again, record, _ = restore_on_a_new_host(tmp_path / "host-c", url)
    assert again.step == 10 and record["fallback_from"] == []


def test_a_checkpoint_the_loader_refuses_is_set_aside_in_the_cache_and_in_the_store(url: str, tmp_path: Path) -> None:
    store = RemoteCheckpointStore(url)
    store.upload(commit(tmp_path / "host-a", 10))
    ran = tmp_path / "exploit-ran"
    local = commit(tmp_path / "host-a", 20)
    _plant_exploit(local.path, ran)
    store.upload(CheckpointStore(tmp_path / "host-a").get(20))

    restored, record, model = restore_on_a_new_host(tmp_path / "host-b", url)
    assert restored.step == 10 and same_weights(model, weights(10)) and not ran.exists()
    here, there = record["fallback_from"]
    assert here["set_aside_as"].startswith("step-00000020.refused-") and here["path"].startswith(str(tmp_path))
    assert there["set_aside_as"].startswith("step-00000020.refused-") and there["path"].startswith(url)
    assert store.latest_committed().step == 10


class _Exploit:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('owned')",))


def _plant_exploit(step_dir: Path, marker: Path) -> None:
    """Replace state.pt with a pickle that would run code, and re-seal manifest and marker to match."""
    state = step_dir / "state.pt"
    torch.save({"format": FORMAT, "model": {"weight": _Exploit(marker)}}, state, pickle_protocol=2)
    data = state.read_bytes()
    manifest = json.loads((step_dir / MANIFEST).read_text())
    manifest["files"]["state.pt"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest_bytes = (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()
    (step_dir / MANIFEST).write_bytes(manifest_bytes)
    seal = json.loads((step_dir / MARKER).read_text())
    seal["manifest_sha256"] = hashlib.sha256(manifest_bytes).hexdigest()
    (step_dir / MARKER).write_text(json.dumps(seal) + "\n")


# -- two writers, one step -----------------------------------------------------------------------


def test_two_writers_racing_for_a_step_commit_it_exactly_once(url: str, tmp_path: Path) -> None:
    store = RemoteCheckpointStore(url)
    mine, theirs = commit(tmp_path / "host-a", 5, variant=1), commit(tmp_path / "host-b", 5, variant=2)
    staged = [store.stage(mine), store.stage(theirs)]  # both payloads up, neither committed
    barrier, outcomes = threading.Barrier(2), [None, None]

    def race(i: int) -> None:
        barrier.wait()
        try:
            outcomes[i] = staged[i].commit()
        except UploadLost as exc:
            outcomes[i] = exc

    threads = [threading.Thread(target=race, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    (won,) = [o for o in outcomes if isinstance(o, RemoteCheckpoint)]
    (lost,) = [o for o in outcomes if isinstance(o, UploadLost)]
    assert lost.winner.token == won.token and store.get(5).token == won.token
    held = objects(store)
    assert [p for p in held if p.endswith(MARKER)] == [f"step-00000005/{MARKER}"]
    # Nobody's bytes were overwritten: each token holds exactly what its writer had.
    for pending, local in zip(staged, (mine, theirs)):
        for rel in local.manifest["files"]:
            assert held[f"step-00000005/{pending.token}/{rel}"] == (local.path / rel).read_bytes()
    loser = next(p for p in staged if p.token != won.token)
    assert store.debris() == [loser.url]
    restored, _, model = restore_on_a_new_host(tmp_path / "host-c", url)
    assert same_weights(model, weights(5, variant=1 if won.token == staged[0].token else 2))


def test_two_writers_with_the_same_checkpoint_both_get_it_and_leave_one_copy(url: str, tmp_path: Path) -> None:
    store = RemoteCheckpointStore(url)
    local = commit(tmp_path / "host-a", 5)
    staged = [store.stage(local), store.stage(local)]
    results = [pending.commit() for pending in staged]
    assert results[0].token == results[1].token == staged[0].token
    assert store.debris() == [] and {p.split("/")[1] for p in _names(store)} == {MARKER, staged[0].token}


def test_two_writer_processes_racing_agree_on_one_winner(url: str, tmp_path: Path) -> None:
    commit(tmp_path / "host-a", 5, variant=1)
    commit(tmp_path / "host-b", 5, variant=2)
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    env.pop("TRACKWAY_CHECKPOINT_CRASH_AT", None)
    writers = [subprocess.Popen([sys.executable, str(WRITER), "race", str(tmp_path / host), "5", url,
                                 str(tmp_path / f"ready-{host}"), str(go)], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
               for host in ("host-a", "host-b")]
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready-{h}").exists() for h in ("host-a", "host-b")) and time.monotonic() < deadline:
        assert all(w.poll() is None for w in writers)
        time.sleep(0.01)
    go.touch()
    outputs = [w.communicate(timeout=60) for w in writers]
    assert all(w.returncode == 0 for w in writers), [err for _, err in outputs]
    said = [json.loads(out) for out, _ in outputs]
    assert sorted(s["outcome"] for s in said) == ["committed", "lost"]
    assert said[0]["token"] == said[1]["token"] == RemoteCheckpointStore(url).get(5).token


# -- retention, deletion, debris -----------------------------------------------------------------


def test_prune_applies_retention_to_the_store_too(url: str, tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "host", remote_url=url)
    for step in (10, 20, 30, 40, 50):
        manager.save(step, model={"w": torch.full((4,), float(step))})
    manager.wait()
    plans = manager.prune(RetentionPolicy(keep_last=2))
    store = RemoteCheckpointStore(url)
    assert [(c.step, c.state.value) for c in store.list()] == [(40, "committed"), (50, "committed")]
    assert [c.step for c in manager.list()] == [40, 50]
    assert plans[url].delete == [10, 20, 30] and plans[str(tmp_path / "host")].delete == [10, 20, 30]
    assert {name.split("/")[0] for name in _names(store)} == {"step-00000040", "step-00000050"}
    assert store.debris() == []
    manager.close()


def test_a_delete_cut_short_reads_as_deleted_and_clean_debris_finishes_it(url: str, tmp_path: Path) -> None:
    store = RemoteCheckpointStore(url)
    for step in (10, 20):
        store.upload(commit(tmp_path / "host", step))
    done = run_writer("delete", "10", url, crash="remote_delete_after_marker")
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert store.get(10).state is CheckpointState.DELETED and store.latest_committed().step == 20
    remnant = f"{url}/step-00000010/{_token_of(store, 10)}"
    assert store.debris() == [remnant] and store.clean_debris() == [remnant]  # at any age
    assert store.get(10) is None and {n.split("/")[0] for n in _names(store)} == {"step-00000020"}


def _token_of(store: RemoteCheckpointStore, step: int) -> str:
    (token,) = {n.split("/")[1] for n in _names(store) if n.startswith(f"step-{step:08d}/")}
    return token


def test_delete_removes_the_marker_then_the_objects(url: str, tmp_path: Path) -> None:
    store = RemoteCheckpointStore(url)
    ckpt = store.upload(commit(tmp_path / "host", 3))
    with pytest.raises(CheckpointError, match="committed again"):
        store.delete(dataclasses.replace(ckpt, token="20000101T000000.000000Z-00000000"))
    assert store.supersede(ckpt).state is CheckpointState.SUPERSEDED
    store.delete(ckpt)
    assert store.list() == [] and _names(store) == []


def test_clean_debris_aborts_multipart_uploads_a_killed_writer_left(s3_server, monkeypatch, tmp_path: Path) -> None:
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    bucket = s3_server.bucket("mpu")
    client = s3_server.client()
    started = client.create_multipart_upload(Bucket=bucket, Key="run/step-00000001/20260101T000000.000000Z-aa/state.pt")
    client.upload_part(Bucket=bucket, Key=started["Key"], UploadId=started["UploadId"], PartNumber=1, Body=b"x" * 1024)
    client.create_multipart_upload(Bucket=bucket, Key="elsewhere/state.pt")
    store = RemoteCheckpointStore(f"s3://{bucket}/run")
    store.clean_debris(min_age_s=0)
    assert [u["Key"] for u in client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])] == ["elsewhere/state.pt"]


# -- the manager's uploads -----------------------------------------------------------------------


@pytest.fixture
def unanswering_s3():
    """An S3 endpoint that accepts connections and never answers: a store gone quiet."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield {"key": "k", "secret": "s", "config_kwargs": {"read_timeout": 120, "retries": {"max_attempts": 1}},
           "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{server.getsockname()[1]}", "region_name": "us-east-1"}}
    server.close()
    for conn in held:
        conn.close()


def test_save_never_waits_for_an_upload_and_wait_gives_up_on_a_silent_store(
    unanswering_s3, tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    uploaded: list[str] = []
    manager = CheckpointManager(tmp_path / "host", remote_url="s3://quiet/run", storage_options=unanswering_s3,
                                on_upload=lambda r, s: uploaded.append(r.name), upload_stall_s=1.0)
    manager.save(10, model={"w": torch.ones(4)})  # async: returns once the state is copied
    manager.save(20, model={"w": torch.ones(4)}, blocking=True)  # sync: returns once committed locally
    assert [c.step for c in manager.list() if c.state is CheckpointState.COMMITTED] == [10, 20]
    assert "made no progress" not in capfd.readouterr().err  # neither save went through the upload wait
    manager.wait()
    err = capfd.readouterr().err
    assert "checkpoint upload to s3://quiet/run made no progress for 1 s" in err
    assert "not uploaded: step-00000010, step-00000020" in err and uploaded == []
    manager.close()


def unreachable_s3_options() -> dict:
    """fsspec options for an S3 endpoint nobody listens on, asked once per call (no botocore retries)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return {"key": "k", "secret": "s", "config_kwargs": {"retries": {"max_attempts": 1}},
            "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}", "region_name": "us-east-1"}}


def test_a_failing_upload_is_retried_then_reported_and_the_checkpoint_stays_local(tmp_path: Path) -> None:
    options = unreachable_s3_options()
    told: list[str] = []
    uploader = Uploader(RemoteCheckpointStore("s3://gone/run", options), attempts=2, backoff_s=0.01, warn=told.append)
    local = commit(tmp_path / "host", 3)
    uploader.submit(local)
    assert uploader.wait() is True  # given up on: nothing left to wait for
    (said,) = told
    assert said.startswith("checkpoint step-00000003 was not uploaded to s3://gone/run: list s3://gone/run failed")
    assert said.endswith(f"(after 2 attempts); it stays committed locally at {local.path}")
    assert uploader.uploaded == [] and len(uploader.failed) == 1


def test_a_step_another_writer_committed_differently_is_reported_lost_not_retried(
    url: str, tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    heard: list[str] = []
    for host, variant in (("host-a", 1), ("host-b", 2)):
        manager = CheckpointManager(tmp_path / host, remote_url=url, on_upload=lambda r, s: heard.append(r.url))
        manager.save(5, model=weights(5, variant))
        manager.close()
    assert heard == [f"{url}/step-00000005"]
    err = capfd.readouterr().err
    assert f"checkpoint step-00000005 was not uploaded to {url}: {url}/step-00000005 was committed by another " \
           "writer" in err and f"it stays committed locally at {tmp_path / 'host-b' / 'step-00000005'}" in err
    restored, _, model = restore_on_a_new_host(tmp_path / "host-c", url)
    assert restored.step == 5 and same_weights(model, weights(5, 1))  # the first writer's


def test_a_store_that_cannot_be_reached_is_one_clear_error_naming_it(tmp_path: Path) -> None:
    options = unreachable_s3_options()
    manager = CheckpointManager(tmp_path / "host", remote_url="s3://gone/run", storage_options=options)
    with pytest.raises(RemoteStoreError) as caught:
        manager.restore_latest(model={"w": torch.ones(1)})
    message = str(caught.value)
    assert message.startswith("list s3://gone/run failed: ") and "\n" not in message


def test_an_s3_url_without_s3fs_says_what_to_install() -> None:
    code = ("import sys; sys.modules['s3fs'] = None\n"
            "from trackway.checkpoints.object_store import RemoteCheckpointStore\n"
            "RemoteCheckpointStore('s3://bucket/run')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(SRC)}, timeout=60)
    assert done.returncode != 0
    assert "CheckpointError: checkpoint store s3://bucket/run: s3:// needs a package that is not installed" \
        in done.stderr
    assert "pip install 'trackway[remote]'" in done.stderr


def _upload_in_child(store: RemoteCheckpointStore, local) -> None:
    os._exit(0 if store.upload(local).state is CheckpointState.COMMITTED else 1)


def test_the_store_works_in_a_forked_child_and_from_threads(url: str, tmp_path: Path) -> None:
    store = RemoteCheckpointStore(url)
    store.upload(commit(tmp_path / "host", 1))  # the parent's filesystem (and fsspec's IO loop) in use
    child = multiprocessing.get_context("fork").Process(target=_upload_in_child,
                                                        args=(store, commit(tmp_path / "host", 2)))
    child.start()
    child.join(120)
    assert child.exitcode == 0
    seen: list[list[int]] = []
    threads = [threading.Thread(target=lambda: seen.append([c.step for c in store.list()])) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert seen == [[1, 2]] * 4
