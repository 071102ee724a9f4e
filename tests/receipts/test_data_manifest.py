"""Data manifests: the hash follows content and relative names, streams large files, and names bad paths."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from trackway.errors import InputError, NotFound
from trackway.receipts.data_manifest import build_data_manifest


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    root = tmp_path / "place-a" / "shards"
    (root / "train" / "deep").mkdir(parents=True)
    (root / "train" / "part-0.bin").write_bytes(b"\x00\x01\x02" * 100)
    (root / "train" / "deep" / "part-1.bin").write_bytes(b"hello")
    (root / "empty.txt").write_bytes(b"")
    (root / ".hidden").write_bytes(b"kept too")
    return root


def test_entries_are_relative_sorted_and_complete(dataset: Path) -> None:
    manifest = build_data_manifest([dataset])
    assert [f["path"] for f in manifest.files] == [
        "shards/.hidden",
        "shards/empty.txt",
        "shards/train/deep/part-1.bin",
        "shards/train/part-0.bin",
    ]
    empty = manifest.files[1]
    assert empty == {"path": "shards/empty.txt", "size": 0, "sha256": hashlib.sha256(b"").hexdigest()}
    assert manifest.total_bytes == 300 + 5 + 0 + 8
    assert manifest.roots == [str(dataset.resolve())]


def test_changing_one_byte_changes_the_hash(dataset: Path) -> None:
    before = build_data_manifest([dataset]).sha256
    target = dataset / "train" / "part-0.bin"
    data = bytearray(target.read_bytes())
    data[150] ^= 1
    target.write_bytes(bytes(data))
    assert build_data_manifest([dataset]).sha256 != before


def test_renaming_a_file_changes_the_hash(dataset: Path) -> None:
    before = build_data_manifest([dataset]).sha256
    (dataset / "empty.txt").rename(dataset / "empty2.txt")
    assert build_data_manifest([dataset]).sha256 != before


def test_same_data_in_another_place_hashes_the_same(dataset: Path, tmp_path: Path) -> None:
    copy = tmp_path / "elsewhere" / "deeper" / "shards"
    shutil.copytree(dataset, copy)
    original, copied = build_data_manifest([dataset]), build_data_manifest([copy])
    assert copied.sha256 == original.sha256
    assert copied.canonical == original.canonical
    assert copied.roots != original.roots


def test_a_file_root_is_named_by_its_basename(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "tokens.bin").write_bytes(b"abc")
    (tmp_path / "b" / "tokens.bin").write_bytes(b"abc")
    first = build_data_manifest([tmp_path / "a" / "tokens.bin"])
    assert first.files == [{"path": "tokens.bin", "size": 3, "sha256": hashlib.sha256(b"abc").hexdigest()}]
    assert build_data_manifest([str(tmp_path / "b" / "tokens.bin")]).sha256 == first.sha256


def test_several_roots_and_relative_paths(dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "vocab.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    manifest = build_data_manifest(["vocab.json", dataset])
    assert manifest.files[-1]["path"] == "vocab.json"
    assert manifest.roots == [str(tmp_path.resolve() / "vocab.json"), str(dataset.resolve())]
    monkeypatch.chdir(dataset)
    assert build_data_manifest(["."]).sha256 == build_data_manifest([dataset]).sha256


def test_empty_paths_is_no_manifest() -> None:
    assert build_data_manifest([]) is None


def test_missing_path_names_the_flag(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(NotFound, match=rf"^--data {missing}: no such file or directory$"):
        build_data_manifest([missing])


def test_two_roots_with_the_same_name_are_refused(tmp_path: Path) -> None:
    for parent in ("x", "y"):
        (tmp_path / parent / "shards").mkdir(parents=True)
    first, second = tmp_path / "x" / "shards", tmp_path / "y" / "shards"
    with pytest.raises(InputError) as caught:
        build_data_manifest([first, second])
    assert f"--data {first}" in str(caught.value) and f"--data {second}" in str(caught.value)


def test_symlinked_files_are_followed_and_symlinked_dirs_are_not(dataset: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"linked")
    (dataset / "link.bin").symlink_to(outside)
    (dataset / "loop").symlink_to(dataset, target_is_directory=True)
    manifest = build_data_manifest([dataset])
    paths = [f["path"] for f in manifest.files]
    assert "shards/link.bin" in paths
    assert not any(p.startswith("shards/loop") for p in paths)
    linked = next(f for f in manifest.files if f["path"] == "shards/link.bin")
    assert linked["sha256"] == hashlib.sha256(b"linked").hexdigest()


def test_a_broken_symlink_is_an_error_not_a_silent_gap(dataset: Path, tmp_path: Path) -> None:
    (dataset / "gone.bin").symlink_to(tmp_path / "never-written")
    with pytest.raises(InputError, match=r"gone\.bin"):
        build_data_manifest([dataset])


def test_large_file_streams_with_progress_and_matches_hashlib(tmp_path: Path) -> None:
    big = tmp_path / "big" / "blob.bin"
    big.parent.mkdir()
    payload = os.urandom(5 * 2**20 + 12345)  # not a whole number of chunks
    big.write_bytes(payload)
    out = io.StringIO()
    manifest = build_data_manifest([big.parent], console=Console(file=out, force_terminal=True, width=100),
                                   progress_threshold_bytes=2**20)
    assert manifest.files == [{"path": "big/blob.bin", "size": len(payload),
                               "sha256": hashlib.sha256(payload).hexdigest()}]
    assert "hashing data" in out.getvalue()
    quiet = io.StringIO()
    assert build_data_manifest([big.parent], console=Console(file=quiet)).sha256 == manifest.sha256
    assert quiet.getvalue() == ""  # below the default threshold nothing is drawn


def _age(root: Path, seconds: float = 60) -> None:
    """Make a file, or every file under a directory, older than the cache's racy window, as data written before a run is."""
    past = __import__("time").time() - seconds
    for path in [root] if root.is_file() else root.rglob("*"):
        if path.is_file():
            os.utime(path, (past, past))


def test_a_cached_resolution_hashes_only_what_changed(dataset: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    _age(dataset)
    first = build_data_manifest([dataset], cache_dir=cache)
    assert first.hashed == 4
    again = build_data_manifest([dataset], cache_dir=cache)
    assert (again.hashed, again.sha256, again.canonical) == (0, first.sha256, first.canonical)
    assert again.files == first.files
    # Same size, new content: the modification time tells the cache it must read the file again.
    target = dataset / "train" / "part-0.bin"
    target.write_bytes(b"\x09\x01\x02" * 100)
    _age(target, 30)
    edited = build_data_manifest([dataset], cache_dir=cache)
    assert edited.hashed == 1 and edited.sha256 != first.sha256
    assert edited.sha256 == build_data_manifest([dataset]).sha256  # what hashing everything gives
    (dataset / "new.txt").write_bytes(b"new")
    _age(dataset / "new.txt", 20)
    added = build_data_manifest([dataset], cache_dir=cache)
    assert added.hashed == 1 and "shards/new.txt" in [f["path"] for f in added.files]


def test_a_file_written_just_now_is_never_trusted_to_the_cache(dataset: Path, tmp_path: Path) -> None:
    # A write within the same clock tick keeps size and time: only a file older than RACY_S is cached.
    cache = tmp_path / "cache"
    build_data_manifest([dataset], cache_dir=cache)
    assert build_data_manifest([dataset], cache_dir=cache).hashed == 4


def test_a_broken_cache_costs_a_hashing_not_a_wrong_manifest(dataset: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    _age(dataset)
    first = build_data_manifest([dataset], cache_dir=cache)
    for path in (cache / "data").iterdir():
        path.write_bytes(b"\x00garbage")
    again = build_data_manifest([dataset], cache_dir=cache)
    assert again.hashed == 4 and again.sha256 == first.sha256


def test_a_directory_listed_in_another_order_gives_the_same_manifest_without_hashing(
        dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The cached manifest is keyed in the order the walk lists files; a filesystem may list an
    # unchanged directory in another order, which must cost no hashing and change no entry.
    cache = tmp_path / "cache"
    _age(dataset)
    first = build_data_manifest([dataset], cache_dir=cache)
    listing = os.scandir

    class Reversed:
        def __init__(self, path: str) -> None:
            self.entries = listing(path)

        def __enter__(self) -> list[os.DirEntry]:
            return list(reversed(list(self.entries)))

        def __exit__(self, *exc: object) -> None:
            self.entries.close()

    monkeypatch.setattr(os, "scandir", Reversed)
    reordered = build_data_manifest([dataset], cache_dir=cache)
    again = build_data_manifest([dataset], cache_dir=cache)

    for manifest in (reordered, again):
        assert (manifest.hashed, manifest.sha256, manifest.canonical) == (0, first.sha256, first.canonical)
    assert [f["path"] for f in reordered.files] == sorted(f["path"] for f in first.files)
