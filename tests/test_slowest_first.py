"""The suite's order: the files tests/file_seconds.json says are slowest are collected first, the rest keep theirs."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import slowest_first


def test_slow_files_go_first_and_each_file_keeps_its_own_order(tmp_path, monkeypatch):
    root = slowest_first.TESTS.parent
    seconds = tmp_path / "file_seconds.json"
    seconds.write_text(json.dumps({"tests/b/test_slow.py": 300.0, "tests/a/test_mid.py": 20.0}))
    monkeypatch.setattr(slowest_first, "FILE_SECONDS", seconds)

    def item(path: str, name: str):
        return SimpleNamespace(path=root / path, name=name)

    items = [item("tests/a/test_new.py", "new1"), item("tests/a/test_mid.py", "mid1"), item("tests/b/test_slow.py", "slow1"),
             item("tests/a/test_mid.py", "mid2"), item("tests/b/test_slow.py", "slow2"), item("tests/c/test_other.py", "other")]
    slowest_first.pytest_collection_modifyitems(None, None, items)
    assert [i.name for i in items] == ["slow1", "slow2", "mid1", "mid2", "new1", "other"]


def test_without_measured_seconds_the_order_is_untouched(tmp_path, monkeypatch):
    monkeypatch.setattr(slowest_first, "FILE_SECONDS", tmp_path / "missing.json")
    items = [SimpleNamespace(path=Path("/x/test_b.py")), SimpleNamespace(path=Path("/x/test_a.py"))]
    before = list(items)
    slowest_first.pytest_collection_modifyitems(None, None, items)
    assert items == before


def test_the_committed_seconds_name_files_that_exist():
    seconds = slowest_first.file_seconds()
    assert seconds, "tests/file_seconds.json is missing or empty: scripts/test_durations.py writes it"
    missing = [name for name in seconds if not (slowest_first.TESTS.parent / name).exists()]
    assert not missing, f"tests/file_seconds.json names files that no longer exist: {missing}"
