"""`trackway sql` answers the seed query verbatim on both backends, in table, JSON and CSV form."""

from __future__ import annotations

import csv
import io
import sys

PY = sys.executable
SEED_QUERY = (
    "select termination_reason, count(*) as attempts, sum(gpu_seconds) / 3600 as gpu_hours "
    "from training_attempts where model_family = 'reasoning' and started_at >= now() - interval '7 days' "
    "group by termination_reason order by gpu_hours desc;"
)


def test_seed_query_over_real_runs(cli):
    assert cli("submit", "--model-family", "reasoning", "--", PY, "-c", "import time; time.sleep(0.3)").code == 0
    assert cli("submit", "--model-family", "reasoning", "--", PY, "-c", "raise SystemExit(3)").code == 1
    assert cli("submit", "--model-family", "vision", "--", PY, "-c", "pass").code == 0
    rows = cli("sql", SEED_QUERY, "--json").json()
    assert [r["termination_reason"] for r in rows] == ["completed", "unknown"]
    assert all(r["attempts"] == 1 for r in rows)
    assert rows[0]["gpu_hours"] >= 0.3 / 3600 > 0

    table = cli("sql", SEED_QUERY)
    assert table.code == 0 and "completed" in table.out and "gpu_hours" in table.out

    parsed = list(csv.reader(io.StringIO(cli("sql", SEED_QUERY, "--csv").out)))
    assert parsed[0] == ["termination_reason", "attempts", "gpu_hours"] and len(parsed) == 3
