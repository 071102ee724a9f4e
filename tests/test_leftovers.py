"""The suite's own check that nothing it started outlives it (tests/leftovers.py) fails a run that leaks a process."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

LEAKY = """
import subprocess, sys

def test_leaves_a_process_behind(tmp_path):
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], cwd=tmp_path)

def test_ends_what_it_starts(tmp_path):
    subprocess.run([sys.executable, "-c", "pass"], cwd=tmp_path, check=True)
"""


def _plugins_turned_off() -> list[str]:
    """pyproject.toml's `-p no:NAME` options: these sessions run outside the repository, without its addopts, and
    each plugin nothing here uses would cost every inner pytest its import (2.8 s of CPU for them all)."""
    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text(encoding="utf-8"))
    words = pyproject["tool"]["pytest"]["ini_options"]["addopts"].split()
    return [word for flag, name in zip(words, words[1:]) if flag == "-p" and name.startswith("no:") for word in (flag, name)]


UNUSED_PLUGINS = _plugins_turned_off()


def run_session(tmp_path: Path, select: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_leaky.py").write_text(LEAKY)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent), "TRACKWAY_TEST_LEFTOVER_GRACE_S": "1"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "leftovers",
                           *UNUSED_PLUGINS, "--basetemp", str(tmp_path / "base"), "-k", select,
                           str(tmp_path / "test_leaky.py")],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)


def test_a_session_that_leaves_a_process_alive_fails_naming_it_and_the_process_is_killed(tmp_path):
    done = run_session(tmp_path, "leaves")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "were still alive at its end (killed now)" in done.stderr and "time.sleep(120)" in done.stderr
    leaked = subprocess.run(["pgrep", "-f", "time.sleep(120)"], capture_output=True, text=True).stdout.split()
    assert not [pid for pid in leaked if os.path.exists(f"/proc/{pid}/cwd")
                and os.readlink(f"/proc/{pid}/cwd").startswith(str(tmp_path))]


def test_a_session_that_ends_what_it_starts_passes(tmp_path):
    done = run_session(tmp_path, "ends")
    assert done.returncode == 0, done.stdout + done.stderr


def test_under_xdist_a_worker_that_finds_a_process_alive_fails_the_run(tmp_path):
    (tmp_path / "test_leaky.py").write_text(LEAKY)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent), "TRACKWAY_TEST_LEFTOVER_GRACE_S": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "leftovers",
                           *UNUSED_PLUGINS, "-n", "1", "--basetemp", str(tmp_path / "base"), "-k", "leaves",
                           str(tmp_path / "test_leaky.py")],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "time.sleep(120)" in done.stderr
