"""The environment description is read once per environment: a second capture reads no package metadata,
and installing, upgrading or removing a package gives a new digest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from trackway.receipts.environment import capture_environment


def _install(site: Path, name: str, version: str, age_s: float = 60.0) -> Path:
    """A distribution's metadata as pip leaves it, dated `age_s` ago (the cache skips files changed just now)."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    past = time.time() - age_s
    os.utime(info / "METADATA", (past, past))
    return info


def _capture(site: Path, cache: Path):
    return capture_environment({}, path=[str(site)], cache_dir=cache)


def test_a_second_capture_comes_from_the_cache_and_says_the_same(tmp_path):
    site, cache = tmp_path / "site", tmp_path / "cache"
    _install(site, "alpha", "1.0")
    _install(site, "beta", "2.0")
    first = _capture(site, cache)
    assert not first.cached and first.description["distributions"] == {"alpha": "1.0", "beta": "2.0"}
    second = _capture(site, cache)
    assert second.cached and (second.sha256, second.canonical) == (first.sha256, first.canonical)
    (saved,) = (cache / "environments").iterdir()
    assert saved.stat().st_mode & 0o777 == 0o600
    assert (cache / "environments").stat().st_mode & 0o777 == 0o700


def test_installing_upgrading_or_removing_a_package_gives_a_new_digest(tmp_path):
    site, cache = tmp_path / "site", tmp_path / "cache"
    old = _install(site, "alpha", "1.0")
    digests = [_capture(site, cache).sha256]
    gamma = _install(site, "gamma", "0.1")
    installed = _capture(site, cache)
    assert not installed.cached and installed.description["distributions"]["gamma"] == "0.1"
    digests.append(installed.sha256)
    # An upgrade as pip does it: the old dist-info goes, a new one comes.
    for child in old.iterdir():
        child.unlink()
    old.rmdir()
    _install(site, "alpha", "1.1")
    upgraded = _capture(site, cache)
    assert upgraded.description["distributions"]["alpha"] == "1.1"
    digests.append(upgraded.sha256)
    (gamma / "METADATA").unlink()
    gamma.rmdir()
    removed = _capture(site, cache)
    assert "gamma" not in removed.description["distributions"]
    digests.append(removed.sha256)
    assert len(set(digests)) == 4


def test_metadata_rewritten_in_place_is_seen(tmp_path):
    site, cache = tmp_path / "site", tmp_path / "cache"
    info = _install(site, "alpha", "1.0")
    before = _capture(site, cache)
    # `setup.py develop` rewrites PKG-INFO / METADATA in place: the directory listing does not change.
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: alpha\nVersion: 1.0.post1\n")
    past = time.time() - 30
    os.utime(info / "METADATA", (past, past))
    after = _capture(site, cache)
    assert after.sha256 != before.sha256 and after.description["distributions"]["alpha"] == "1.0.post1"


def test_a_just_changed_environment_is_not_cached(tmp_path):
    site, cache = tmp_path / "site", tmp_path / "cache"
    _install(site, "alpha", "1.0", age_s=0)
    assert not _capture(site, cache).cached
    assert not _capture(site, cache).cached  # still read afresh: a coarse clock could hide a second change
    assert not (cache / "environments").exists()


def test_a_cache_file_that_does_not_verify_is_ignored(tmp_path):
    site, cache = tmp_path / "site", tmp_path / "cache"
    _install(site, "alpha", "1.0")
    truth = _capture(site, cache)
    (saved,) = (cache / "environments").iterdir()
    tampered = json.loads(saved.read_text())
    tampered["description"]["distributions"]["alpha"] = "9.9"
    saved.write_text(json.dumps(tampered))
    # A fresh interpreter (no copy in memory) reads the file, finds its hash wrong, and reads the packages.
    script = (
        "import sys, json\n"
        "from trackway.receipts.environment import capture_environment\n"
        f"d = capture_environment({{}}, path=[{str(site)!r}], cache_dir=__import__('pathlib').Path({str(cache)!r}))\n"
        "print(json.dumps([d.sha256, d.cached, d.description['distributions']]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    sha, cached, distributions = json.loads(done.stdout)
    assert (sha, cached, distributions) == (truth.sha256, False, {"alpha": "1.0"})


def test_a_fresh_interpreter_reads_no_package_metadata_the_second_time(tmp_path):
    """The real environment, in new processes: the second capture opens no METADATA file at all."""
    script = (
        "import sys\n"
        "opened = []\n"
        "sys.addaudithook(lambda event, args: event == 'open' and str(args[0]).endswith(('METADATA', 'PKG-INFO'))"
        " and opened.append(args[0]))\n"
        "from trackway.receipts.environment import capture_environment\n"
        "digest = capture_environment({})\n"
        "print(digest.sha256, digest.cached, len(opened))\n"
    )
    env = {**os.environ, "TRACKWAY_CACHE_DIR": str(tmp_path / "cache")}

    def run() -> list[str]:
        return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                              check=True).stdout.split()

    first = run()
    if not (tmp_path / "cache" / "environments").exists():
        first = run()  # a package was installed in the last seconds: the first capture was not cached
    second = run()
    assert second[0] == first[0] and second[1] == "True" and second[2] == "0"
    assert int(first[2]) > 0 or first[1] == "True"


def test_files_a_script_writes_beside_itself_do_not_cost_a_new_read(tmp_path):
    site, scripts, cache = tmp_path / "site", tmp_path / "project", tmp_path / "cache"
    _install(site, "alpha", "1.0")
    scripts.mkdir()
    path = [str(scripts), str(site)]  # the script's directory comes first on sys.path
    first = capture_environment({}, path=path, cache_dir=cache)
    (scripts / "outputs.txt").write_text("written by the run")
    (scripts / "checkpoints").mkdir()
    again = capture_environment({}, path=path, cache_dir=cache)
    assert again.cached and again.sha256 == first.sha256
