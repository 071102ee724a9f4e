"""Two ranks of one attempt log different values: both are kept, rank 0's are what every read shows unless asked.

Two real processes join one attempt with RANK/WORLD_SIZE set, as torchrun starts them; their spools are
ingested into a ledger on each backend, then read back with `trackway metrics --rank` and `trackway.Api`.
"""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

import trackway
from trackway.errors import InputError, NotFound
from trackway.ledger import open_ledger
from trackway.ledger.ingest import ingest_attempt
from trackway.ledger.records import get_attempt, insert_attempt, insert_run

SCRIPT = """
import os, trackway
run = trackway.init()
rank = int(os.environ["RANK"])
for step in range(5):
    run.log({"loss": 10.0 * rank + step, "tokens_per_s": 100.0 + rank}, step=step)
run.finish()
"""


def _two_ranks_logged(url: str, tmp_path: Path) -> None:
    """Run `ranked` with one attempt whose two ranks (two processes) logged, and ingest its spool."""
    ledger = open_ledger(url)
    state_dir = tmp_path / "attempt"
    now = datetime.now(timezone.utc)
    with ledger.write() as conn:
        insert_run(conn, dict(run_id="rranks", name="ranked", project="p", kind="full", state="running", command="[]",
                              workdir=str(tmp_path), resource="local", executor="local", gpus=0, created_at=now))
        insert_attempt(conn, dict(run_id="rranks", attempt_number=1, state="running", executor="local",
                                  state_dir=str(state_dir), log_path=str(state_dir / "output.log"), gpu_count=0,
                                  started_at=now))
    (tmp_path / "train.py").write_text(SCRIPT)
    env = {**os.environ, "TRACKWAY_RUN_ID": "rranks", "TRACKWAY_ATTEMPT_ID": "rranks/1", "TRACKWAY_ATTEMPT_NUMBER": "1",
           "TRACKWAY_SPOOL_DIR": str(state_dir / "spool"), "TRACKWAY_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
           "WORLD_SIZE": "2"}
    ranks = [subprocess.Popen([sys.executable, str(tmp_path / "train.py")], env={**env, "RANK": str(rank)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    for process in ranks:
        out, _ = process.communicate(timeout=60)
        assert process.returncode == 0, out
    with ledger.read() as conn:
        attempt = get_attempt(conn, "rranks/1")
    assert ingest_attempt(ledger, attempt).points == 2 * 2 * 5
    ledger.dispose()


def test_each_rank_keeps_its_own_values_and_rank_0_is_the_default(cli, ledger_url, tmp_path):
    _two_ranks_logged(ledger_url, tmp_path)

    default = cli("metrics", "ranked", "--key", "loss", "--json").json()
    assert [(p["step"], p["value"]) for p in default] == [(s, float(s)) for s in range(5)]
    assert "rank" not in default[0]  # what every reader of the output got before ranks were kept
    second = cli("metrics", "ranked", "--key", "loss", "--rank", "1", "--json").json()
    assert [(p["step"], p["value"]) for p in second] == [(s, 10.0 + s) for s in range(5)]
    latest = cli("metrics", "ranked", "--key", "tokens_per_s", "--rank", "1", "--limit", "1", "--json").json()
    assert [(p["step"], p["value"]) for p in latest] == [(4, 101.0)]

    every = list(csv.DictReader(io.StringIO(cli("metrics", "ranked", "--key", "loss", "--rank", "all", "--csv").out)))
    assert [(row["rank"], row["step"], float(row["value"])) for row in every] == (
        [("0", str(s), float(s)) for s in range(5)] + [("1", str(s), 10.0 + s) for s in range(5)])
    summary = cli("metrics", "ranked", "--rank", "all").out
    assert summary.count("loss") == 2 and summary.count("tokens_per_s") == 2

    api = trackway.Api(db=ledger_url)
    assert api.ranks("ranked") == [0, 1]
    assert api.history("ranked", "loss").values == [0.0, 1.0, 2.0, 3.0, 4.0]
    ranked = api.history("ranked", "loss", rank=1)
    assert (ranked.rank, ranked.values) == (1, [10.0, 11.0, 12.0, 13.0, 14.0])
    assert api.metric_keys("ranked", rank=1) == ["loss", "tokens_per_s"]
    with pytest.raises(NotFound, match=r"^rank 3: run rranks has no metrics from that rank; it has rank\(s\) 0, 1$"):
        api.history("ranked", "loss", rank=3)
    with pytest.raises(InputError, match=r"^rank: expected a rank, a whole number from 0, got -1$"):
        api.history("ranked", "loss", rank=-1)


@pytest.mark.parametrize(("given", "said"), [
    ("-1", "--rank: expected a rank, a whole number from 0, got -1"),
    ("one", "--rank: expected a rank, a whole number from 0, got one"),
    ("7", "--rank 7: run rranks has no metrics from that rank; it has rank(s) 0, 1"),
])
def test_a_bad_rank_is_one_line_naming_it(cli_sqlite, sqlite_url, tmp_path, given, said):
    _two_ranks_logged(sqlite_url, tmp_path)
    result = cli_sqlite("metrics", "ranked", "--rank", given)
    assert (result.code, result.out, result.err) == (2, "", f"trackway: error: {said}\n")
