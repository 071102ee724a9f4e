"""`trackway compare`: runs side by side, from real runs of a real script with different configs."""

from __future__ import annotations

import sys
from pathlib import Path

PY = sys.executable
NEUTRAL = str(Path(__file__).resolve().parents[1] / "cli" / "scripts" / "neutral.py")


def _two_runs(cli, tmp_path: Path) -> None:
    for name, lr, steps in (("base", 0.1, 40), ("cand", 0.2, 30)):
        config = tmp_path / f"{name}.toml"
        config.write_text(f"[train]\nlr = {lr}\nbatch = 8\n")
        assert cli("submit", "--name", name, "--config", str(config), "--", PY, NEUTRAL, str(steps)).code == 0


def test_compare_shows_the_changed_key_the_metric_difference_and_the_same_in_json(cli, tmp_path):
    _two_runs(cli, tmp_path)
    facts = cli("compare", "base", "cand", "--json").json()
    assert [(c["key"], c["values"]) for c in facts["config"] if not c["same"]] == [("train.lr", [0.1, 0.2])]
    assert facts["config_same"] == 1
    (loss,) = facts["metrics"]
    base, cand = loss["runs"]
    # neutral.py logs 1 / (step + 1): 40 steps end at 1/40, 30 at 1/30.
    assert (base["final"], cand["final"]) == (1 / 40, 1 / 30)
    assert abs(cand["delta"] - (1 / 30 - 1 / 40)) < 1e-12 and abs(cand["delta_pct"] - 100 / 3) < 1e-9
    assert [r["steps"] for r in facts["runs"]] == [39, 29] and facts["runs"][0]["compute"] == "CPU"
    assert facts["code"]["same"] is None  # no git here: not known, never "the same"

    page = cli("compare", "base", "cand")
    assert page.code == 0
    words = " ".join(page.out.split())
    assert "config: 1 key(s) differ, 1 the same" in words and "train.lr 0.1 0.2" in words
    assert "train.batch" not in words and "train.batch" in cli("compare", "base", "cand", "--all").out
    assert "+33.3%" in words and "GPU" not in words


def test_compare_refuses_what_cannot_be_compared_in_one_line(cli_sqlite, tmp_path):
    assert cli_sqlite("submit", "--name", "one", "--", PY, NEUTRAL, "3").code == 0
    for args, said in ((["one"], "expected at least two runs"), (["one", "nope"], "run 'nope'"),
                       (["one", "one"], "the same run was given twice")):
        refused = cli_sqlite("compare", *args)
        assert refused.code == 2 and said in refused.err and len(refused.err.strip().splitlines()) == 1, refused.err


def test_the_api_compares_as_the_cli_does(cli_sqlite, tmp_path, home, sqlite_url):
    from ..api_server import Api, serving

    _two_runs(cli_sqlite, tmp_path)
    with serving(home, sqlite_url) as (base, _):
        status, facts, _ = Api(base).get("/api/compare?runs=base,cand")
    assert status == 200 and facts == cli_sqlite("compare", "base", "cand", "--json").json()
