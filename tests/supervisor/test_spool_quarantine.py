"""A bad line in one attempt's spool is quarantined and shown; it stops neither that run nor any other.

Regression for issue 9.5: one malformed line made every reconciling command exit 1 with
JSONDecodeError, for every run, until the file was fixed by hand.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def test_a_garbage_spool_line_is_quarantined_and_every_run_completes(cli, home, ledger_url):
    slow_neighbour = cli("submit", "--detach", "--name", "neighbour", "--", sys.executable, "-c",
                         "import time, trackway; r = trackway.init(); "
                         "[(r.log({'loss': 1.0}, step=s), time.sleep(0.1)) for s in range(30)]; r.finish()")
    assert slow_neighbour.code == 0, slow_neighbour.err
    torn = cli("submit", "--detach", "--name", "torn", "--", sys.executable, str(SCRIPTS / "torn_spool.py"))
    assert torn.code == 0, torn.err

    env = dict(os.environ, TRACKWAY_DB=ledger_url, TRACKWAY_HOME=str(home))
    supervisor = subprocess.Popen([sys.executable, "-m", "trackway", "supervise", "--interval", "0.1"],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 90
        while True:
            listed = cli("runs", "--json")
            assert listed.code == 0, listed.err  # every reconciling command keeps working
            states = {r["name"]: r["state"] for r in listed.json()}
            if states == {"neighbour": "completed", "torn": "completed"}:
                break
            assert supervisor.poll() is None, supervisor.stderr.read()
            assert time.time() < deadline, f"runs never completed: {states}"
            time.sleep(0.3)
    finally:
        supervisor.terminate()
        supervisor.wait(timeout=30)

    # The good lines on both sides of the bad ones arrived; the bad ones are kept aside and shown.
    steps = [p["step"] for p in cli("metrics", "torn", "--key", "loss", "--json").json()]
    assert steps == list(range(40))
    explained = cli("explain", "torn", "--markdown")
    assert explained.code == 0, explained.err
    assert explained.out.count("a spool line was quarantined") == 2
    assert "metrics-r0.jsonl" in explained.out
