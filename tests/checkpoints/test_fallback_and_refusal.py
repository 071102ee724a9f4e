"""A resume that falls back says so, and a refused checkpoint is set aside like a corrupt one.

Regressions for issue 9.3 and 9.7: after a fallback from a corrupt checkpoint the receipt,
`explain` and `trackway checkpoints` named the corrupt checkpoint (or hid it as `deleted`), and a
checkpoint whose pickle the safe loader refused was not set aside, so every resume died on it.
Real checkpoints on disk, a real malicious pickle (it would create a file if it ever ran), real
supervised attempts through the CLI, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trackway.checkpoints.layout import MANIFEST, MARKER, CheckpointState
from trackway.checkpoints.manager import CheckpointManager
from trackway.checkpoints.store import CheckpointStore
from trackway.checkpoints.torch_state import FORMAT

PY = sys.executable
SCRIPTS = Path(__file__).parent / "scripts"
SCRIPT = str(SCRIPTS / "sdk_resume.py")
TORCHRUN = Path(sys.executable).parent / "torchrun"


class _Exploit:
    """What an attacker plants: unpickling it would create `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('owned')",))


def plant_malicious_pickle(step_dir: Path, marker: Path, filename: str = "state.pt") -> None:
    """Replace a shard with a pickle that runs code, and re-seal manifest and marker so the digests match."""
    state = step_dir / filename
    torch.save({"format": FORMAT, "model": {"weight": _Exploit(marker)}}, state, pickle_protocol=2)
    data = state.read_bytes()
    reseal(step_dir, lambda files: files.update({filename: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}}))


def reseal(step_dir: Path, change) -> None:
    """Change the manifest's files table in place, then re-seal the marker so that the manifest verifies."""
    manifest = json.loads((step_dir / MANIFEST).read_text())
    change(manifest["files"])
    manifest_bytes = (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()
    (step_dir / MANIFEST).write_bytes(manifest_bytes)
    seal = json.loads((step_dir / MARKER).read_text())
    seal["manifest_sha256"] = hashlib.sha256(manifest_bytes).hexdigest()
    (step_dir / MARKER).write_text(json.dumps(seal) + "\n")


def flip_a_byte(step_dir: Path) -> None:
    state = step_dir / "state.pt"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))


def saved(root: Path, *values: float) -> None:
    """Commit steps 1..n holding a one-weight model of each value."""
    manager = CheckpointManager(root, async_save=False)
    for step, value in enumerate(values, start=1):
        manager.save(step, model={"w": torch.full((3,), value)})
    manager.close()


def blank_model() -> torch.nn.Module:
    model = torch.nn.Module()
    model.register_buffer("w", torch.zeros(3))
    return model


def restoring(root: Path, **kwargs) -> tuple[object, list[dict]]:
    """restore_latest into a fresh model; (what it returned, what on_restore heard)."""
    heard: list[dict] = []
    model = blank_model()
    restored = CheckpointManager(root, on_restore=heard.append, **kwargs).restore_latest(model=model)
    return (restored, model.w.tolist()), heard


def test_a_corrupt_newest_is_reported_with_what_was_really_restored(tmp_path: Path) -> None:
    saved(tmp_path, 1.0, 2.0)
    flip_a_byte(tmp_path / "step-00000002")

    (restored, weights), heard = restoring(tmp_path, resume_from="step-00000002")
    assert restored.step == 1 and weights == [1.0, 1.0, 1.0]
    (record,) = heard
    assert (record["name"], record["step"]) == ("step-00000001", 1)
    (skipped,) = record["fallback_from"]
    assert skipped["name"] == "step-00000002" and "state.pt: blake3" in skipped["reason"]
    assert skipped["set_aside_as"].startswith("step-00000002.corrupt-")
    assert (tmp_path / skipped["set_aside_as"]).is_dir()


def test_every_restore_is_reported_even_without_a_fallback(tmp_path: Path) -> None:
    saved(tmp_path, 1.0, 2.0)
    _, heard = restoring(tmp_path)
    assert heard == [{"name": "step-00000002", "step": 2, "source": str(tmp_path / "step-00000002"),
                      "fallback_from": []}]
    _, heard = restoring(tmp_path / "empty")
    assert heard == [{"name": None, "step": None, "source": None, "fallback_from": []}]


def test_a_refused_pickle_is_set_aside_never_run_and_the_previous_checkpoint_used(tmp_path: Path) -> None:
    marker = tmp_path / "owned"
    root = tmp_path / "ckpt"
    saved(root, 1.0, 2.0, 3.0)
    plant_malicious_pickle(root / "step-00000003", marker)
    assert CheckpointStore(root).latest_committed().step == 3  # the digests verify: only the loader can refuse

    (restored, weights), heard = restoring(root)
    assert restored.step == 2 and weights == [2.0, 2.0, 2.0]
    assert not marker.exists()
    (skipped,) = heard[0]["fallback_from"]
    assert skipped["name"] == "step-00000003" and skipped["set_aside_as"].startswith("step-00000003.refused-")
    assert "refused to load" in skipped["reason"] and "exec" in skipped["reason"]
    assert not (root / "step-00000003").exists()

    # The next resume does not meet it again: it is out of the resume path for good, and listed as set aside.
    (again, _), heard = restoring(root)
    assert again.step == 2 and heard[0]["fallback_from"] == []
    (aside,) = CheckpointStore(root).set_aside_list()
    assert aside.state is CheckpointState.SET_ASIDE and aside.step == 3
    assert not marker.exists()


def test_falling_back_past_every_checkpoint_reports_the_start(tmp_path: Path) -> None:
    marker = tmp_path / "owned"
    root = tmp_path / "ckpt"
    saved(root, 1.0, 2.0)
    flip_a_byte(root / "step-00000002")
    plant_malicious_pickle(root / "step-00000001", marker)

    (restored, weights), heard = restoring(root)
    assert restored is None and weights == [0.0, 0.0, 0.0]
    assert heard[0]["name"] is None and heard[0]["step"] is None
    assert [s["name"] for s in heard[0]["fallback_from"]] == ["step-00000002", "step-00000001"]
    assert not marker.exists()


def test_a_refused_checkpoint_becomes_no_ones_parent(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    saved(root, 1.0, 2.0)
    plant_malicious_pickle(root / "step-00000002", tmp_path / "owned")
    manager = CheckpointManager(root, resume_from="step-00000002", async_save=False)
    manager.restore_latest(model=blank_model())
    manager.save(2, model={"w": torch.full((3,), 5.0)})
    assert CheckpointStore(root).get(2).manifest["parent"] == "step-00000001"


@pytest.mark.slow
def test_two_ranks_agree_to_fall_back_when_one_rank_refuses_its_shard(tmp_path: Path) -> None:
    root, marker = tmp_path / "ckpt", tmp_path / "owned"
    first = torchrun(str(root), str(tmp_path / "first.pt"), "--steps", "4", "--every", "2", "--sync")
    assert first.returncode == 0, first.stderr[-3000:]
    plant_malicious_pickle(root / "step-00000004", marker, filename="rank-00001.pt")  # rank 0's shard is fine

    resumed = torchrun(str(root), str(tmp_path / "resumed.pt"), "--steps", "5", "--every", "2", "--sync")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.stdout.count("resumed 2") == 2  # both ranks, from the same checkpoint
    assert not marker.exists()
    assert [p.name.split(".")[0] for p in root.iterdir() if ".refused-" in p.name] == ["step-00000004"]


def torchrun(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(TORCHRUN), "--standalone", "--nproc_per_node=2", str(SCRIPTS / "train_tiny.py"), *args],
        capture_output=True, text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


# -- through the CLI: a supervised run, a damaged checkpoint, `trackway resume` ---------------------


DAMAGE = {"corrupt": ("corrupt", "state.pt: blake3"), "refused": ("refused", "refused to load")}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_resume_past_a_damaged_checkpoint_is_what_the_receipt_explain_and_listing_say(
    cli, home: Path, tmp_path: Path, damage: str
) -> None:
    kind, evidence = DAMAGE[damage]
    failed = cli("submit", "--name", "fb", "--", PY, SCRIPT, "40", "--fail-at", "25", "--stop-at", "15")
    assert failed.code == 1, failed.err
    run_id = cli("attempts", "fb", "--json").json()[0]["run_id"]
    newest = home / "runs" / run_id / "checkpoints" / "step-00000020"
    marker = tmp_path / "owned"
    if damage == "corrupt":
        flip_a_byte(newest)
    else:
        plant_malicious_pickle(newest, marker)

    resumed = cli("resume", "fb")
    assert resumed.code == 0, resumed.err
    # trackway offered the newest committed checkpoint; what the script's restore took instead is said too.
    assert "resuming from step-00000020" in resumed.err
    assert "restored step-00000010, not step-00000020: see `trackway explain" in " ".join(resumed.err.split())
    first, second = cli("attempts", "fb", "--json").json()
    assert second["termination_reason"] == "completed"
    assert second["resumed_from_checkpoint"] == "step-00000010"  # what was restored, not what was expected
    assert (second["first_step"], second["last_step"]) == (11, 15)
    assert not marker.exists()

    incidents = cli("explain", "fb", "--json").json()["incidents"]
    assert any(line.startswith("restore fell back to step-00000010: step-00000020 set aside (") and evidence in line
               for line in incidents), incidents

    # The ledger heard it from the restoring attempt's event (before any listing reconciles storage).
    rows = cli("sql", "select name, state from checkpoints where step = 20", "--json").json()
    assert len(rows) == 1 and rows[0]["state"] == "set_aside"  # not `deleted`: it is still there
    assert rows[0]["name"].startswith(f"step-00000020.{kind}-")

    listed = cli("checkpoints", "fb", "--json").json()
    aside = [c for c in listed if c["state"] == "set_aside"]
    assert [c["name"].split(".")[0] for c in aside] == ["step-00000020"]
    assert aside[0]["name"].startswith(f"step-00000020.{kind}-") and evidence in aside[0]["problems"][0]
    assert [c["name"] for c in listed if c["state"] == "committed"] == ["step-00000010"]
    shown = cli("checkpoints", "fb")
    assert f"{aside[0]['name']} set aside: " in shown.out and evidence in shown.out
    again = cli("sql", "select name, state from checkpoints where step = 20", "--json").json()
    assert again == [{"name": aside[0]["name"], "state": "set_aside"}]  # reconciling from storage agrees



def test_a_byte_flipped_inside_a_tensor_is_caught_as_it_is_read_and_none_of_it_is_loaded(tmp_path: Path) -> None:
    """The state file is hashed while it is read (not before): a bad byte still reaches no model, and falls back."""
    from trackway.checkpoints.layout import CheckpointCorrupt
    from trackway.checkpoints.torch_state import restore

    manager = CheckpointManager(tmp_path, async_save=False)
    for step, value in ((1, 1.0), (2, 2.0)):  # 2 MB tensors: read straight into storages of their own
        manager.save(step, model={"w": torch.full((1 << 19,), value)})
    manager.close()
    flip_a_byte(tmp_path / "step-00000002")

    model = torch.nn.Module()
    model.register_buffer("w", torch.zeros(1 << 19))
    with pytest.raises(CheckpointCorrupt, match=r"does not match its manifest: state\.pt: blake3 \w+… but manifest"):
        restore(CheckpointStore(tmp_path).get(2), model=model)
    assert not model.w.any()

    heard: list[dict] = []
    restored = CheckpointManager(tmp_path, on_restore=heard.append).restore_latest(model=model)
    assert restored.step == 1 and bool((model.w == 1.0).all())
    (skipped,) = heard[0]["fallback_from"]
    assert skipped["name"] == "step-00000002" and skipped["reason"].startswith("state.pt: blake3 ")
    assert skipped["set_aside_as"].startswith("step-00000002.corrupt-")
    assert [c.name for c in CheckpointStore(tmp_path).list()] == ["step-00000001"]


def test_a_checkpoint_whose_manifest_has_no_blake3_is_checked_by_its_sha256(tmp_path: Path) -> None:
    """Checkpoints saved before BLAKE3 came in list sha256 only: they restore, and a bad byte is still caught."""
    from trackway.checkpoints.layout import CheckpointCorrupt
    from trackway.checkpoints.torch_state import restore

    saved(tmp_path, 1.0, 2.0)
    step_dir = tmp_path / "step-00000002"
    reseal(step_dir, lambda files: [entry.pop("blake3") for entry in files.values()])
    assert "blake3" not in json.loads((step_dir / MANIFEST).read_text())["files"]["state.pt"]

    model = blank_model()
    assert restore(CheckpointStore(tmp_path).get(2), model=model).step == 2 and model.w.tolist() == [2.0] * 3
    flip_a_byte(step_dir)
    with pytest.raises(CheckpointCorrupt, match=r"does not match its manifest: state\.pt: sha256 \w+… but manifest"):
        restore(CheckpointStore(tmp_path).get(2), model=blank_model())
    assert CheckpointStore(tmp_path).verify(CheckpointStore(tmp_path).get(2))[0].startswith("state.pt: sha256 ")


def test_a_blake3_that_does_not_match_is_refused_though_the_sha256_would(tmp_path: Path) -> None:
    """Where the manifest records a blake3, that is what the bytes must give: the sha256 is no way around it."""
    saved(tmp_path, 1.0, 2.0)
    step_dir = tmp_path / "step-00000002"
    reseal(step_dir, lambda files: files["state.pt"].update(blake3="0" * 64))

    (restored, weights), heard = restoring(tmp_path)
    assert restored.step == 1 and weights == [1.0, 1.0, 1.0]
    (skipped,) = heard[0]["fallback_from"]
    assert skipped["reason"] == f"state.pt: blake3 {skipped['reason'].split()[2]} but manifest says {'0' * 12}…"
