"""The checkpoint protocol on real files: commit order and contents, states, listing, verification, cleanup."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from blake3 import blake3

from trackway.checkpoints.layout import (
    MANIFEST,
    MARKER,
    SUPERSEDED_MARK,
    CheckpointError,
    CheckpointState,
    new_token,
    parse_step,
    step_dir_name,
)
from trackway.checkpoints.retention import (
    RetentionPlan,
    RetentionPolicy,
    RetentionPolicyError,
    apply_retention,
    plan_retention,
)
from trackway.checkpoints.store import CheckpointStore

SRC = Path(__file__).resolve().parents[2] / "src"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def commit(store: CheckpointStore, step: int, data: bytes = b"", **metrics: float):
    with store.begin(step, run_id="r", attempt_id="a1") as pending:
        with pending.open("state.bin") as f:
            f.write(data or f"step {step}".encode())
        pending.commit(metrics=metrics)
    return pending.info


def test_step_names_sort_and_parse() -> None:
    assert step_dir_name(1234) == "step-00001234"
    assert step_dir_name(123456789) == "step-123456789"
    assert parse_step("step-00001234") == 1234
    assert parse_step("step-123456789") == 123456789
    for name in (".tmp-step-00000001-x", ".debris-step-00000001-x", "step-00000001.corrupt-20260101T000000.000000Z",
                 "step-", "step-1a", "Step-1", "step-١٢"):
        assert parse_step(name) is None, name
    with pytest.raises(CheckpointError):
        step_dir_name(-1)


def test_happy_path_commit_is_found_verified_and_laid_out(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ckpt")
    big = os.urandom(5 << 20)  # hashed on the helper thread
    with store.begin(7, run_id="run-1", attempt_id="att-2", parent="step-00000003") as pending:
        assert pending.path.name.startswith(".tmp-step-00000007-")
        with pending.open("model.bin") as f:
            f.write(big[:100])
            f.write(memoryview(big)[100:])
        info = pending.commit(metrics={"loss": 0.5}, extra={"data_cursor": 12})
    assert info.state is CheckpointState.COMMITTED and info.name == "step-00000007"
    assert sorted(os.listdir(info.path)) == [MARKER, MANIFEST, "model.bin"]
    assert os.listdir(store.root) == ["step-00000007"]  # no temp directory left behind
    assert store.latest_committed() == store.get(7) == info
    assert store.verify(info) == [] and info.size_bytes == len(big)
    assert info.committed_at is not None and info.committed_at.tzinfo is not None


def test_manifest_and_marker_contents(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    with store.begin(42, run_id="run-1", attempt_id="att-2", parent="step-00000010") as pending:
        with pending.open("a.bin") as f:
            f.write(b"abc")
        pending.commit(metrics={"loss": 1.25, "nan": float("nan")}, extra={"cursor": [1, 2]})
    directory = tmp_path / "step-00000042"
    manifest_bytes = (directory / MANIFEST).read_bytes()
    manifest = json.loads(manifest_bytes)
    assert manifest["step"] == 42 and manifest["run_id"] == "run-1" and manifest["attempt_id"] == "att-2"
    assert manifest["parent"] == "step-00000010"
    assert manifest["files"] == {"a.bin": {"size": 3, "sha256": sha(b"abc")}}
    assert manifest["metrics"] == {"loss": 1.25, "nan": "nan"}  # strict JSON: non-finite floats become text
    assert manifest["extra"] == {"cursor": [1, 2]}
    assert manifest["created_at"].endswith("+00:00")
    marker = json.loads((directory / MARKER).read_bytes())
    assert marker["manifest_sha256"] == sha(manifest_bytes)
    assert set(marker) == {"manifest_sha256", "committed_at"}


def test_listing_sorts_by_step_number_never_by_name_or_mtime(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    for step in (100, 9, 123456789, 10):
        commit(store, step)
    os.utime(tmp_path / "step-00000009", (time.time() + 10**6, time.time() + 10**6))
    assert [c.step for c in store.list()] == [9, 10, 100, 123456789]
    assert store.latest_committed().step == 123456789
    (tmp_path / "step-5").mkdir()  # a short name still sorts by its number (and is not committed)
    assert [(c.step, c.state.value) for c in store.list()][:2] == [(5, "writing"), (9, "committed")]


def test_committing_a_step_twice_returns_the_first_and_discards_the_second(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    first = commit(store, 5, b"first")
    with store.begin(5) as pending:
        with pending.open("state.bin") as f:
            f.write(b"second")
        second = pending.commit()
    assert second == first
    assert (tmp_path / "step-00000005" / "state.bin").read_bytes() == b"first"
    assert os.listdir(tmp_path) == ["step-00000005"]
    assert pending.commit() is second  # and committing the same pending again is a no-op


def test_files_in_subdirectories_and_files_dropped_in_without_open(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    with store.begin(3) as pending:
        with pending.open("model/layers/0.bin") as f:
            f.write(b"zero")
        (pending.path / "model" / "config.json").write_text('{"d": 4}')  # a framework writing its own files
        (pending.path / "extra").mkdir()
        (pending.path / "extra" / "cursor.txt").write_bytes(b"12")
    files = pending.info.manifest["files"]
    assert files == {
        "model/layers/0.bin": {"size": 4, "sha256": sha(b"zero")},
        "model/config.json": {"size": 8, "sha256": sha(b'{"d": 4}')},
        "extra/cursor.txt": {"size": 2, "sha256": sha(b"12")},
    }
    assert store.verify(pending.info) == []


def test_a_file_written_through_open_is_not_read_again_at_commit(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    pending = store.begin(1)
    with pending.open("state.bin") as f:
        f.write(b"A" * 1000)
    (pending.path / "state.bin").write_bytes(b"B" * 1000)  # behind the protocol's back, same size
    info = pending.commit()
    assert info.manifest["files"]["state.bin"]["sha256"] == sha(b"A" * 1000)  # the digest taken while writing
    on_disk, written = sha(b"B" * 1000)[:12], sha(b"A" * 1000)[:12]
    assert store.verify(info) == [f"state.bin: sha256 {on_disk}… but manifest says {written}…"]


def test_every_damaged_file_is_named_in_order_when_several_are_checked_side_by_side(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    pending = store.begin(1)
    payloads = {f"part-{i}.bin": os.urandom(1 << 20) for i in range(5)}
    for name, data in payloads.items():
        with pending.open(name, blake3=name == "part-3.bin") as f:
            f.write(data)
    info = pending.commit()
    for name in ("part-3.bin", "part-1.bin"):  # same size, one byte changed: only the digest can tell
        damaged = bytearray(payloads[name])
        damaged[12345] ^= 0x01
        (info.path / name).write_bytes(damaged)
    problems = store.verify(info)
    assert [p.split(":")[0] for p in problems] == ["part-1.bin", "part-3.bin"]
    assert problems[0].startswith("part-1.bin: sha256 ") and problems[1].startswith("part-3.bin: blake3 ")


def test_digests_from_other_processes_are_trusted_and_checked_for_size(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    token = new_token()
    rank0, rank1 = store.begin(2, token=token), store.begin(2, token=token)
    assert rank0.path == rank1.path
    with rank1.open("rank-1.bin") as f:
        f.write(b"one")
    with rank1.open("rank-1.pt", blake3=True) as f:
        f.write(b"uno")
    with rank0.open("rank-0.bin") as f:
        f.write(b"zero")
    rank0.add_digest("rank-1.bin", **rank1.digests["rank-1.bin"])
    rank0.add_digest("rank-1.pt", **rank1.digests["rank-1.pt"])
    files = rank0.commit().manifest["files"]
    assert files["rank-1.bin"] == {"size": 3, "sha256": sha(b"one")}
    assert files["rank-1.pt"] == {"size": 3, "sha256": sha(b"uno"), "blake3": blake3(b"uno").hexdigest()}
    other = store.begin(4)
    (other.path / "x.bin").write_bytes(b"xx")
    other.add_digest("x.bin", 5, sha(b"xxxxx"))
    with pytest.raises(CheckpointError, match="5 were recorded"):
        other.commit()
    with pytest.raises(CheckpointError, match="64 lowercase hex"):
        other.add_digest("y.bin", 1, "nope")
    with pytest.raises(CheckpointError, match="blake3 must be 64 lowercase hex digits or None"):
        other.add_digest("y.bin", 1, sha(b"y"), "NOPE")


def test_torch_save_through_open(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    store = CheckpointStore(tmp_path)
    state = {"w": torch.arange(3_000_000, dtype=torch.float32), "step": 3}
    with store.begin(3) as pending:
        with pending.open("state.pt") as f:
            torch.save(state, f)
    loaded = torch.load(pending.info.path / "state.pt", weights_only=True)
    assert torch.equal(loaded["w"], state["w"]) and store.verify(pending.info) == []


def test_with_block_aborts_on_exception_and_leaves_nothing(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    commit(store, 1)
    with pytest.raises(RuntimeError):
        with store.begin(2) as pending:
            with pending.open("state.bin") as f:
                f.write(b"half")
            raise RuntimeError("training crashed mid-save")
    assert os.listdir(tmp_path) == ["step-00000001"]
    assert store.latest_committed().step == 1
    pending.abort()  # idempotent
    with pytest.raises(CheckpointError, match="already aborted"):
        pending.commit()


def test_bad_names_and_open_files_are_refused(tmp_path: Path) -> None:
    pending = CheckpointStore(tmp_path).begin(1)
    for bad in ("../escape", "/abs", "", "a/../b", MANIFEST, MARKER):
        with pytest.raises(CheckpointError):
            pending.open(bad)
    f = pending.open("still-open.bin")
    with pytest.raises(CheckpointError, match="still open"):
        pending.commit()
    f.close()
    os.symlink("/etc/hostname", pending.path / "link")
    with pytest.raises(CheckpointError, match="not a regular file"):
        pending.commit()


def test_supersede_keeps_it_readable_and_delete_removes_the_marker_first(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    old, new = commit(store, 1), commit(store, 2)
    superseded = store.supersede(old)
    assert superseded.state is CheckpointState.SUPERSEDED and store.verify(superseded) == []
    assert (old.path / SUPERSEDED_MARK).is_file() and store.supersede(superseded) == superseded
    # A delete killed right after it removed the marker: nothing reads it, the payload is still there.
    script = "import sys; from trackway.checkpoints.store import CheckpointStore as S; s = S(sys.argv[1]); "
    script += "s.delete(s.get(1))"
    env = {**os.environ, "TRACKWAY_CHECKPOINT_CRASH_AT": "delete_after_marker", "PYTHONPATH": str(SRC)}
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env)
    assert result.returncode == -9
    half = store.get(1)
    assert half.state is CheckpointState.DELETED and (old.path / "state.bin").exists()
    assert not (old.path / MARKER).exists()
    assert store.latest_committed() == new and store.debris() == [old.path]
    assert store.clean_debris(min_age_s=10**9) == [old.path]  # an interrupted delete is finished at any age
    assert [c.step for c in store.list()] == [2]
    (tmp_path / "step-00000003").mkdir()  # writing: neither superseded nor deleted by anyone
    with pytest.raises(CheckpointError, match="writing"):
        store.supersede(store.get(3))
    with pytest.raises(CheckpointError, match="writing"):
        store.delete(store.get(3))
    store.delete(store.get(2))
    assert sorted(os.listdir(tmp_path)) == ["step-00000003"]


def test_clean_debris_removes_old_leftovers_only(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    good = commit(store, 10)
    fresh = store.begin(20)  # a live writer's temp directory
    (fresh.path / "part").write_bytes(b"x")
    old = tmp_path / ".tmp-step-00000030-20000101T000000.000000Z-deadbeef"
    old.mkdir()
    (old / "part").write_bytes(b"x")
    os.utime(old / "part", (0, 0))
    os.utime(old, (0, 0))
    abandoned = tmp_path / "step-00000040"  # died between rename and marker, long ago
    abandoned.mkdir()
    (abandoned / MANIFEST).write_text(json.dumps({"step": 40, "files": {}, "created_at": "2000-01-01T00:00:00+00:00"}))
    os.utime(abandoned / MANIFEST, (0, 0))
    os.utime(abandoned, (0, 0))
    assert store.debris() == sorted([fresh.path, old, abandoned])
    assert store.clean_debris(min_age_s=3600) == sorted([old, abandoned])
    assert store.debris() == [fresh.path] and store.latest_committed() == good
    assert store.clean_debris(min_age_s=0) == [fresh.path]
    assert os.listdir(tmp_path) == ["step-00000010"]


def test_clean_debris_age_rule_distrusts_mtimes(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    recent = store.begin(1)  # its token records now
    os.utime(recent.path, (0, 0))  # an mtime in 1970 does not make it old
    ancient = tmp_path / ".tmp-step-00000002-20000101T000000.000000Z-00000000"
    ancient.mkdir()
    future = time.time() + 10 * 365 * 86400
    os.utime(ancient, (future, future))  # an mtime in the future makes it look young: kept
    assert store.clean_debris(min_age_s=3600) == []
    os.utime(ancient, (0, 0))
    assert store.clean_debris(min_age_s=3600) == [ancient]


def test_retention_plan_keeps_newest_last_every_best_and_protected(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    losses = {100: 5.0, 200: 1.0, 300: 3.0, 400: 4.0, 500: 2.5, 600: 6.0}
    for step, loss in losses.items():
        commit(store, step, loss=loss)
    policy = RetentionPolicy(keep_last=2, keep_every=300, keep_best=1, best_metric="loss")
    plan = plan_retention(store.list(), policy, {100: "referenced by evaluation 7"})
    assert plan.keep == {
        100: ["referenced by evaluation 7"],
        200: ["best loss"],
        300: ["every 300"],
        500: ["last 2"],
        600: ["newest", "last 2", "every 300"],
    }
    assert plan.supersede == [400] and plan.delete == []
    apply_retention(store, plan)
    assert store.get(400).state is CheckpointState.SUPERSEDED
    second = plan_retention(store.list(), policy, {100: "referenced by evaluation 7"})
    assert second.supersede == [] and second.delete == [400]
    apply_retention(store, second)
    assert [c.step for c in store.list()] == [100, 200, 300, 500, 600]
    assert any("keep" in line and "600" in line for line in second.lines())


def test_retention_never_touches_writing_or_corrupt_and_refuses_bad_policies(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    for step in (1, 2, 3, 4):
        commit(store, step)
    (tmp_path / "step-00000002" / MARKER).write_text("{torn")
    (tmp_path / "step-00000009").mkdir()
    plan = plan_retention(store.list(), RetentionPolicy(keep_last=2))
    assert plan.supersede == [1] and 2 not in plan.keep and 9 not in plan.keep
    for bad in ({"keep_last": 1}, {"keep_last": 0}, {"keep_every": 0}, {"keep_best": 1}, {"best_mode": "median"}):
        with pytest.raises(RetentionPolicyError) as caught:
            RetentionPolicy(**bad)
        assert isinstance(caught.value, ValueError)
    with pytest.raises(CheckpointError, match="keeps and removes"):
        apply_retention(store, RetentionPlan(keep={1: ["x"]}, supersede=[1]))
    apply_retention(store, RetentionPlan(keep={}, supersede=[4], delete=[4]))  # the newest is never removed
    assert store.get(4).state is CheckpointState.COMMITTED


def test_a_checkpoint_with_no_file_in_it_is_never_committed(tmp_path: Path) -> None:
    # Lightning under DDP once committed an empty directory: it became the resume target, and the resume
    # found nothing to load (issue 30). An empty commit is refused, and the newer one never shadows the older.
    store = CheckpointStore(tmp_path / "ckpts")
    good = store.begin(5)
    (good.path / "model.bin").write_bytes(b"weights")
    good.commit()
    empty = store.begin(10)
    (empty.path / "nested").mkdir()
    with pytest.raises(CheckpointError, match=r"^cannot commit step 10: no file was written into .*cannot be resumed from"):
        empty.commit()
    empty.abort()
    assert store.latest_committed().step == 5
    assert [c.step for c in store.list() if c.state is CheckpointState.COMMITTED] == [5]


def test_an_empty_checkpoint_committed_before_the_refusal_is_set_aside_not_resumed_from(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ckpts")
    good = store.begin(5)
    (good.path / "model.bin").write_bytes(b"weights")
    good.commit()
    # What an older trackway left: a marker over a manifest that lists no file.
    empty = store.begin(10)
    (empty.path / "keep").write_bytes(b"x")
    info = empty.commit()
    manifest = json.loads((info.path / MANIFEST).read_text())
    (info.path / "keep").unlink()
    manifest["files"] = {}
    (info.path / MANIFEST).write_text(json.dumps(manifest))
    marker = json.loads((info.path / MARKER).read_text())
    marker["manifest_sha256"] = sha((info.path / MANIFEST).read_bytes())
    (info.path / MARKER).write_text(json.dumps(marker))
    target, skipped = store.pick_latest()
    assert target.step == 5
    assert [s.name for s in skipped] == ["step-00000010"] and "lists no file" in skipped[0].reason
