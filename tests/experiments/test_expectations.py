"""A run's own acceptance criteria (`submit --expect`), end to end: judged as evaluations land, shown, told once."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from trackway.errors import InputError
from trackway.experiments.expectations import ANY, LATEST, parse, parse_all

from ..evals.conftest import eval_dir, write_spec  # noqa: F401  (the fixtures)
from ..reports.test_notify import Receiver

PY = sys.executable
NEUTRAL = str(Path(__file__).resolve().parents[1] / "cli" / "scripts" / "neutral.py")
ONE_SEED = 'seeds = [0]\nmetrics = ["pass@1"]\n[decoding]\nsamples = 4\n'
PASS = "eval.pass@1 > 0.5"
LATEST_PASS = "eval.toy.pass@1 > 0.9 at latest"
LOSS = "final.loss < 0.1"


def _by_criterion(judged: list[dict]) -> dict[str, dict]:
    return {j["criterion"]: j for j in judged}


def test_a_run_is_judged_against_its_own_criteria_as_its_checkpoints_are_evaluated(cli, write_spec):  # noqa: F811
    submitted = cli("submit", "--name", "val", "--expect", PASS, "--expect", LATEST_PASS, "--expect", LOSS,
                    "--", PY, NEUTRAL, "40")
    assert submitted.code == 0, submitted.err
    shown = _by_criterion(cli("show", "val", "--json").json()["expectations"])
    # The loss reached 1/40: met once the run ended. Nothing was evaluated, and nothing will be: not known.
    assert shown[LOSS]["state"] == "met" and shown[LOSS]["values"] == {"final.loss": 0.025}
    assert shown[PASS]["state"] == "not known" and "no checkpoint" in shown[PASS]["why"]

    spec = str(write_spec(body=ONE_SEED))
    assert cli("eval", "val@10", "--spec", spec).code == 0  # the stand-in's skill at step 10 is 0.2
    early = _by_criterion(cli("show", "val", "--json").json()["expectations"])
    assert early[PASS]["state"] == "not met" and early[PASS]["step"] == 10
    assert early[PASS]["values"]["eval.pass@1"] < 0.5

    assert cli("eval", "val@30", "--spec", spec).code == 0  # skill 0.6
    late = _by_criterion(cli("show", "val", "--json").json()["expectations"])
    assert late[PASS]["state"] == "met" and late[PASS]["step"] == 30 and late[PASS]["values"]["eval.pass@1"] > 0.5
    # `at latest` reads the newest evaluated checkpoint only, under the spec it names.
    assert late[LATEST_PASS]["state"] == "not met" and late[LATEST_PASS]["step"] == 30

    table = cli("evals", "val", "--json").json()
    assert [(r["step"], r["criteria"][PASS]) for r in table["evaluations"]] == [(10, False), (30, True)]
    printed = cli("evals", "val")
    assert printed.code == 0
    assert "#1" in printed.out and "holds" in printed.out and "fails" in printed.out
    assert f"met: {PASS} (met at step 30" in " ".join(printed.out.split())
    explained = cli("explain", "val", "--json").json()["expectations"]
    assert _by_criterion(explained)[PASS]["state"] == "met"
    assert "Expected: met: `eval.pass@1 > 0.5`" in cli("explain", "val").out


def test_progress_reads_total_steps_the_script_gave_init(cli_sqlite, tmp_path, write_spec):  # noqa: F811
    # No --config: the total is what the script told trackway.init(config=...), kept in the attempt's receipt.
    script = tmp_path / "said.py"
    script.write_text(Path(NEUTRAL).read_text().replace("trackway.init(", "trackway.init(config={'max_steps': 40}, "))
    assert "max_steps" in script.read_text()
    assert cli_sqlite("submit", "--name", "said", "--", PY, str(script), "40").code == 0
    assert cli_sqlite("eval", "said@20", "--spec", str(write_spec(body=ONE_SEED))).code == 0
    table = cli_sqlite("evals", "said", "--json").json()
    assert table["total_steps"] == 40 and table["evaluations"][0]["progress"] == 0.5


def test_a_criterion_met_is_told_once(cli_sqlite, sqlite_url):
    receiver = Receiver()
    try:
        Path("trackway.toml").write_text(f'[notify]\nurls = ["{receiver.url}"]\nevents = ["expectations"]\n')
        assert cli_sqlite("submit", "--name", "told", "--expect", LOSS, "--expect", "max.loss > 5",
                          "--", PY, NEUTRAL, "40").code == 0
        bodies = receiver.wait_for(2)
        cli_sqlite("show", "told")  # a later look judges again: nothing new is told
        titles = sorted(b["title"] for b in bodies)
        assert titles == ["trackway: told: final.loss < 0.1 met", "trackway: told: max.loss > 5 can no longer be met"]
        assert len(receiver.bodies) == 2
    finally:
        receiver.server.shutdown()


@pytest.mark.parametrize(("text", "said"), [
    ("baseline.final.loss > 1", "reads the run alone, not baseline.final.loss"),
    ("final.loss <", "--expect: criterion 'final.loss <': at column 13"),
    ("final.loss < 1 at latest", "`at latest` picks an evaluated checkpoint"),
])
def test_a_bad_criterion_is_refused_in_one_line_naming_the_flag(text, said):
    with pytest.raises(InputError) as refused:
        parse(text)
    assert said in str(refused.value) and "\n" not in str(refused.value)


def test_at_latest_and_at_any_are_read_off_the_end():
    assert parse("eval.pass@1 > 0.05 at latest").at == LATEST
    assert parse("eval.pass@1 > 0.05 at any checkpoint").at == ANY
    assert parse("eval.pass@1 > 0.05").criterion.source == "eval.pass@1 > 0.05"
    with pytest.raises(InputError, match="given twice"):
        parse_all(["final.loss < 1", "final.loss < 1"])


def test_submit_refuses_a_bad_criterion_before_recording_anything(cli_sqlite):
    refused = cli_sqlite("submit", "--expect", "final.loss <<< 1", "--", PY, "-c", "pass")
    assert refused.code == 2 and refused.err.strip().startswith("trackway: error: --expect")
    assert cli_sqlite("runs", "--json").json() == []


def test_a_recorded_criterion_that_no_longer_parses_is_not_known_and_the_supervisor_goes_on(cli_sqlite, sqlite_url):
    from sqlalchemy import update

    from trackway.ledger import open_ledger
    from trackway.ledger.schema import runs

    assert cli_sqlite("submit", "--detach", "--name", "odd", "--expect", LOSS, "--", PY, NEUTRAL, "3").code == 0
    ledger = open_ledger(sqlite_url)
    try:
        with ledger.write() as conn:  # as a ledger written by another version might hold it
            conn.execute(update(runs).where(runs.c.name == "odd").values(expect='["final.loss <<< 1"]',
                                                                         expect_open=True))
    finally:
        ledger.dispose()
    (judged,) = cli_sqlite("show", "odd", "--json").json()["expectations"]
    assert judged["state"] == "not known" and "--expect" in judged["why"]
    assert cli_sqlite("runs", "--json").json()[0]["state"] in ("running", "completed")
