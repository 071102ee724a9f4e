"""An agent drives trackway through `trackway mcp`: the real server over stdio, and in process, with its guardrails."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from trackway.agents.guardrails import agent_of
from trackway.agents.mcp_server import build_server
from trackway.agents.tools import AgentSession
from trackway.ledger import open_ledger
from trackway.settings import load_settings

TOY = str(Path(__file__).resolve().parents[1] / "experiments" / "scripts" / "toy_train.py")
TRAIN = """
import sys, time, trackway
run = trackway.init()
for step in range(20):
    run.log({"loss": 1.0 / (step + 1)}, step=step)
    time.sleep(0.02)
if "--fail" in sys.argv:
    raise ValueError("bad config value: lr")
run.finish()
"""
SLOW = """
import time, trackway
run = trackway.init()
for step in range(3000):
    run.log({"loss": 1.0}, step=step)
    time.sleep(0.05)
run.finish()
"""
TOML = """
[agents.night]
gpu_hours_budget = 2
max_running = 1

[agents.day]
max_running = 2

[agents.careful]
max_running = 3
approve_full_runs = true
approve_over_gpu_hours = 1
"""


@pytest.fixture
def project(home: Path) -> Path:
    work = Path.cwd()
    (work / "trackway.toml").write_text(TOML)
    (work / "train.py").write_text(TRAIN)
    (work / "slow.py").write_text(SLOW)
    return work


def call(session: AgentSession, *steps: tuple[str, dict]) -> list:
    """Each (tool, arguments) through an in-process MCP client; each result's (is_error, structured content)."""
    import mcp  # here, not at the top: every worker collects this file, and only the one that runs it needs mcp

    async def go():
        answers = []
        async with mcp.Client(build_server(session)) as client:
            for name, arguments in steps:
                result = await client.call_tool(name, arguments)
                answers.append((result.is_error, result.structured_content))
        return answers

    return asyncio.run(go())


def session_for(name: str, work: Path) -> AgentSession:
    settings = load_settings()
    return AgentSession(open_ledger(settings.db_url), settings, agent_of(settings, name), work)


def test_an_agent_runs_the_loop_over_stdio_and_its_runs_are_credited_to_it(project: Path):
    import mcp
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=["-m", "trackway", "mcp", "--agent", "night"],
                                   cwd=str(project), env=dict(os.environ))

    async def go():
        async with mcp.Client(params) as client:
            listed = {tool.name: tool for tool in (await client.list_tools()).tools}
            submitted = await client.call_tool("submit", {"script": "train.py", "kind": "test", "name": "h1"})
            ended = await client.call_tool("wait", {"run": "h1", "timeout_s": 120})
            curve = await client.call_tool("metrics", {"run": "h1", "max_points": 5})
            failed = await client.call_tool("submit", {"script": "train.py", "args": ["--fail"], "name": "h2"})
            why = await client.call_tool("wait", {"run": "h2", "timeout_s": 120})
            return listed, submitted, ended, curve, failed, why

    listed, submitted, ended, curve, failed, why = asyncio.run(go())
    assert {"resources", "budget", "submit", "wait", "explain", "metrics", "logs", "cancel", "sql", "runs"} <= set(listed)
    assert listed["submit"].input_schema["properties"]["time_limit_hours"]["description"].startswith("The run's time")
    assert not submitted.is_error and submitted.structured_content["budget"]["agent"] == "night"
    assert ended.structured_content["state"] == "completed"
    assert ended.structured_content["attempt"]["termination_reason"] == "completed"
    assert curve.structured_content["steps"][-1] == 19 and curve.structured_content["points_logged"] == 20
    assert not failed.is_error
    attempt = why.structured_content["attempt"]
    assert (attempt["termination_reason"], attempt["decision"]["action"]) == ("code_error", "stop")
    assert "ValueError: bad config value: lr" in attempt["evidence"]
    settings = load_settings()
    with open_ledger(settings.db_url).read() as conn:
        from sqlalchemy import select

        from trackway.ledger.schema import attempts

        credited = conn.execute(select(attempts.c.started_by)).scalars().all()
    assert len(credited) == 2 and all(text.startswith("agent night via mcp (") for text in credited)


def test_the_cap_on_unfinished_runs_refuses_before_anything_starts(project: Path):
    session = session_for("night", project)
    (first_error, first), (refused_error, refused), (_, standing) = call(
        session, ("submit", {"script": "slow.py", "name": "long"}), ("submit", {"script": "train.py", "name": "more"}),
        ("budget", {}))
    try:
        assert not first_error and refused_error
        assert refused["error"]["field"] == "max_running" and "[agents.night] max_running is 1" in refused["error"]["message"]
        assert standing["unfinished_runs"] == [first["run_id"]]
        with session.ledger.read() as conn:
            from trackway.ledger.records import name_taken

            assert not name_taken(conn, "more")  # nothing recorded
    finally:
        (_, cancelled), = call(session, ("cancel", {"run": "long"}))
        assert cancelled["cancel_requested_for"]


def test_a_run_over_the_budget_is_refused_with_the_numbers(project: Path):
    session = session_for("night", project)
    (no_limit_error, no_limit), (over_error, over) = call(
        session, ("submit", {"script": "train.py", "gpu_count": 1}),
        ("submit", {"script": "train.py", "gpu_count": 2, "time_limit_hours": 1.5}))
    assert no_limit_error and no_limit["error"]["field"] == "time_limit_hours"
    assert over_error and over["error"]["field"] == "time_limit_hours"
    assert "expected at most 2 GPU-hours" in over["error"]["message"] and "2 × 1.5 h = 3" in over["error"]["message"]
    with session.ledger.read() as conn:
        from trackway.ledger.records import list_runs

        assert list_runs(conn) == []


def test_an_unknown_argument_or_a_bad_value_is_a_structured_error_naming_it(project: Path):
    session = session_for("day", project)
    answers = call(session,
                   ("submit", {"script": "train.py", "time_limt_hours": 1}),
                   ("submit", {"script": "../outside.py"}),
                   ("submit", {"script": "train.py", "kind": "huge"}),
                   ("wait", {"run": "nope", "timeout_s": 1}),
                   ("metrics", {"run": "nope", "max_points": 1}))
    (e1, typo), (e2, outside), (e3, kind), (e4, missing), (e5, points) = answers
    assert all((e1, e2, e3, e4, e5))
    assert typo["error"]["field"] == "time_limt_hours" and "time_limit_hours" in typo["error"]["expected"]
    assert outside["error"]["field"] == "script"
    assert kind["error"]["field"] == "kind" and "'test' or 'full'" in kind["error"]["message"]
    assert "nope" in missing["error"]["message"]
    assert points["error"]["field"] == "max_points"


def test_an_agent_cancels_only_its_own_runs(project: Path, cli):
    Path("trackway.toml").write_text(TOML)
    started = cli("submit", "--detach", "--name", "persons", "--", sys.executable, "slow.py")
    assert started.code == 0, started.err
    try:
        (is_error, refused), = call(session_for("day", project), ("cancel", {"run": "persons"}))
        assert is_error and refused["error"]["field"] == "run" and "only its own runs" in refused["error"]["message"]
        assert cli("show", "persons", "--json").json()["state"] in ("running", "queued")
    finally:
        cli("cancel", "persons")


def test_an_undeclared_agent_is_refused_before_the_protocol_starts(project: Path, cli_process):
    refused = cli_process("mcp", "--agent", "stranger")
    assert refused.code == 2
    assert ("--agent 'stranger': expected an agent declared as [agents.NAME] in trackway.toml (careful, day, night)"
            in refused.err)


def test_a_bad_agents_table_is_refused_in_one_line(project: Path, cli_process):
    (project / "trackway.toml").write_text("[agents.night]\ngpu_hours_budget = -3\n")
    refused = cli_process("runs")
    assert refused.code == 2 and "[agents.night] gpu_hours_budget: expected a number of GPU-hours above 0" in refused.err


def test_a_full_run_waits_for_a_person_and_starts_only_when_approved(project: Path, cli):
    Path("trackway.toml").write_text(TOML)
    session = session_for("careful", project)
    (error, submitted), (_, waited), (_, test_run) = call(
        session, ("submit", {"script": "train.py", "kind": "full", "name": "big"}),
        ("wait", {"run": "big", "timeout_s": 30}),
        ("submit", {"script": "train.py", "kind": "test", "name": "small"}))
    assert not error and submitted["awaiting_approval"] and submitted["attempt_id"] is None
    assert "approve_full_runs" in submitted["note"] and "trackway approve" in submitted["note"]
    assert waited["awaiting_approval"] and not waited["ended"] and "waiting for a person's approval" in waited["note"]
    assert not test_run["awaiting_approval"]  # a test run within the threshold starts at once
    # The supervisor passes it over, however long it waits; a person sees it waiting.
    supervisor = session.supervisor()
    supervisor.orphaned_run_s = 0
    supervisor.tick()
    assert cli("attempts", "big", "--json").json() == []
    listed = {run["name"]: run for run in cli("runs", "--json").json()}
    assert listed["big"]["approval"] == "awaiting" and listed["big"]["submitted_by"].startswith("agent careful via mcp (")
    assert "queued (awaiting approval)" in cli("runs").out
    said = cli("explain", "big")
    assert said.code != 0 and "waits for a person's approval" in said.err
    approved = cli("approve", "big")
    assert approved.code == 0, approved.err
    (_, ended), = call(session, ("wait", {"run": "big", "timeout_s": 120}))
    assert ended["state"] == "completed"
    (attempt,) = cli("attempts", "big", "--json").json()
    assert attempt["started_by"].startswith("trackway approve (") and "approving agent careful via mcp (" in attempt["started_by"]
    again = cli("approve", "big")
    assert again.code == 2 and "it was approved already" in again.err


def test_a_refused_run_ends_cancelled_with_the_reason_and_nothing_ran(project: Path, cli):
    Path("trackway.toml").write_text(TOML)
    session = session_for("careful", project)
    (_, submitted), = call(session, ("submit", {"script": "train.py", "kind": "full"}))
    assert submitted["awaiting_approval"]
    run_id = submitted["run_id"]
    no_reason = cli("approve", run_id, "--refuse")
    assert no_reason.code == 2 and "--why: expected the reason" in no_reason.err
    refused = cli("approve", run_id, "--refuse", "--why", "too costly for a guess")
    assert refused.code == 0, refused.err
    shown = cli("show", run_id, "--json").json()
    assert shown["state"] == "cancelled" and "too costly for a guess" in shown["approval_note"]
    assert cli("attempts", run_id, "--json").json() == []
    (_, waited), = call(session, ("wait", {"run": run_id, "timeout_s": 5}))
    assert waited["ended"] and waited["state"] == "cancelled" and "refused by trackway approve" in waited["approval"]


def test_what_asks_for_a_persons_approval():
    from trackway.agents.guardrails import Agent, needs_approval

    careful = Agent("careful", None, 3, approve_full_runs=False, approve_over_gpu_hours=4)
    assert needs_approval(careful, "full", 2, 2) is None  # 4 GPU-hours: not over
    assert "this run asks 2 × 2.5 h = 5 GPU-hours" in needs_approval(careful, "test", 2, 2.5)
    assert "without a time limit may spend more" in needs_approval(careful, "test", 1, None)
    assert needs_approval(careful, "full", 0, None) is None  # no GPUs: no GPU-hours
    assert "approve_full_runs" in needs_approval(Agent("a", None, 1, approve_full_runs=True), "full", 0, None)



def test_an_agents_experiment_is_gated_credited_and_its_full_run_waits_for_a_person(project: Path, cli_sqlite):
    cli = cli_sqlite
    Path("trackway.toml").write_text(TOML)
    Path("cfg.json").write_text(json.dumps({"train": {"steps": 40, "lr": 0.1}}))
    assert cli("submit", "--name", "base", "--config", "cfg.json", "--", sys.executable, TOY).code == 0
    session = session_for("careful", project)
    (e1, planned), = call(session, ("experiment_new", {
        "title": "double lr", "hypothesis": "doubling lr reaches the baseline's loss sooner", "baseline": "base",
        "set": ["train.lr=0.2"], "expect": ["final.loss <= baseline.final.loss"]}))
    assert not e1 and planned["changes"] == [{"key": "train.lr", "before": 0.1, "after": 0.2}]
    experiment = planned["experiment_id"]
    (e2, started), (e3, waited) = call(session, ("experiment_start", {"experiment": experiment}),
                                       ("experiment_wait", {"experiment": experiment, "timeout_s": 180}))
    assert not e2 and started["kind"] == "test" and started["full_run_needs_approval"]
    assert not e3 and waited["full_run_awaiting_approval"] and not waited["concluded"], waited
    full_run = waited["experiment"]["full_run"]["run_id"]
    listed = {run["run_id"]: run for run in cli("runs", "--json").json()}
    assert listed[started["run_id"]]["submitted_by"].startswith("agent careful via mcp (")
    assert listed[full_run]["submitted_by"].startswith("agent careful via mcp (")
    assert listed[full_run]["approval"] == "awaiting" and cli("attempts", full_run, "--json").json() == []
    assert cli("approve", full_run).code == 0
    (_, concluded), (_, chain) = call(session, ("experiment_wait", {"experiment": experiment, "timeout_s": 180}),
                                      ("experiments_chain", {"experiment": experiment}))
    assert concluded["concluded"] and concluded["verdict"] == "supported", concluded
    assert [row["verdict"] for row in chain["iterations"]] == [None, "supported"]


def test_receipts_and_explain_texts_are_resources_and_the_loop_is_a_prompt(project: Path):
    import mcp

    session = session_for("day", project)

    async def go():
        async with mcp.Client(build_server(session)) as client:
            submitted = await client.call_tool("submit", {"script": "train.py", "args": ["--fail"], "name": "f"})
            run_id = submitted.structured_content["run_id"]
            await client.call_tool("wait", {"run": run_id, "timeout_s": 120})
            templates = [t.uri_template for t in (await client.list_resource_templates()).resource_templates]
            explained = await client.read_resource(f"trackway://runs/{run_id}/explain")
            receipt = await client.read_resource(f"trackway://runs/{run_id}/attempts/1/receipt")
            missing = await client.read_resource("trackway://runs/nope/explain")
            prompt = await client.get_prompt("research_loop", {"hypothesis": "a lower lr helps", "baseline": "base"})
            return templates, explained, receipt, missing, prompt

    templates, explained, receipt, missing, prompt = asyncio.run(go())
    assert "trackway://runs/{run}/attempts/{number}/receipt" in templates
    assert "code_error" in explained.contents[0].text and "ValueError: bad config value: lr" in explained.contents[0].text
    held = json.loads(receipt.contents[0].text)
    assert held["termination_reason"] == "code_error" and held["started_by"].startswith("agent day via mcp (")
    assert "nope" in json.loads(missing.contents[0].text)["error"]["message"]
    text = prompt.messages[0].content.text
    assert "a lower lr helps" in text and "experiment_start" in text and "trackway approve" in text


def test_an_agent_resumes_its_own_failed_run_and_reads_the_waste_report(project: Path):
    session = session_for("day", project)
    (_, failed), (_, ended) = call(session, ("submit", {"script": "train.py", "args": ["--fail"], "name": "f"}),
                                   ("wait", {"run": "f", "timeout_s": 120}))
    assert ended["attempt"]["termination_reason"] == "code_error", (failed, ended)
    (e1, resumed), (e2, bad_by), (e3, waste) = call(
        session, ("resume", {"run": "f"}), ("report_waste", {"by": "colour"}), ("report_waste", {"by": "reason"}))
    assert not e1 and resumed["attempt_id"] == f"{failed['run_id']}/2"
    assert e2 and bad_by["error"]["field"] == "by" and "expected one of reason, run, resource, phase" in bad_by["error"]["message"]
    assert not e3 and {row["reason"] for row in waste["rows"]} >= {"code_error"}


def test_an_agent_evaluates_a_checkpoint_and_reads_the_evaluation(project: Path):
    import shutil
    import time

    evals = Path(__file__).resolve().parents[1] / "evals" / "scripts"
    shutil.copy(evals / "evaluator.py", project / "evaluator.py")
    shutil.copy(Path(TOY), project / "toy.py")
    (project / "tasks.jsonl").write_text("".join(
        json.dumps({"task_id": f"t{i}", "prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(5)))
    (project / "toy.toml").write_text(f'name = "toy"\ncommand = {json.dumps([sys.executable, "evaluator.py"])}\n'
                                      'task_set = "tasks.jsonl"\nseeds = [0]\nmetrics = ["pass@1"]\n')
    (project / "big.toml").write_text((project / "toy.toml").read_text() + "gpus = 1\n")
    session = session_for("day", project)
    (_, trained), (_, ended), (error, requested) = call(
        session, ("submit", {"script": "toy.py", "name": "t"}), ("wait", {"run": "t", "timeout_s": 120}),
        ("evaluate", {"checkpoint": "t", "spec": "toy.toml"}))
    assert ended["state"] == "completed" and not error, requested
    for _ in range(120):
        (_, shown), = call(session, ("eval_show", {"evaluation": requested["eval_id"]}))
        if shown["state"] != "running":
            break
        time.sleep(0.5)
    assert shown["state"] == "completed" and shown["step"] == 40 and "pass@1" in shown["metrics"]
    (_, again), = call(session, ("evaluate", {"checkpoint": "t@40", "spec": "toy.toml"}))
    assert again["repeat"] and again["eval_id"] == requested["eval_id"]
    budgeted = session_for("night", project)
    (is_error, refused), = call(budgeted, ("evaluate", {"checkpoint": "t", "spec": "big.toml"}))
    assert is_error and refused["error"]["field"] == "spec" and "not counted against agent 'night'" in \
        refused["error"]["message"]


def test_an_agent_asks_the_memory_preflight_before_it_submits(project: Path):
    from memory_cases import MOTIVATING, lognormal_values

    (project / "trackway.toml").write_text(TOML + '\n[resources.h100box]\nexecutor = "local"\ngpu = "H100"\n'
                                           '\n[resources.h200box]\nexecutor = "local"\ngpu = "H200"\n')
    (project / "lengths.txt").write_text("\n".join(map(str, lognormal_values(50_000))) + "\n")
    session = session_for("day", project)
    (error, answer), (_, none) = call(
        session, ("preflight", {"config": {"preflight": {**MOTIVATING, "seq_lengths": "lengths.txt"}}, "gpu_count": 8}),
        ("preflight", {"config": {"train": {"lr": 0.1}}}))
    assert not error and answer["declared"]
    report = answer["preflight"]["report"]
    assert report["peak_gib"] == pytest.approx(89.04, abs=0.01)  # the motivating case's longest batch, per GPU
    assert {target["name"] for target in report["targets"]} == {"h100box", "h200box"}
    assert not none["declared"] and "[preflight] section" in none["note"]


def test_a_dry_run_says_what_would_be_submitted_and_records_nothing(project: Path):
    session = session_for("night", project)
    (error, shown), (_, standing) = call(session, ("submit", {"script": "train.py", "dry_run": True, "name": "maybe"}),
                                         ("budget", {}))
    assert not error and shown["dry_run"] and shown["resource"] == "local" and "train.py" in json.dumps(shown)
    assert standing["unfinished_runs"] == []
    with session.ledger.read() as conn:
        from trackway.ledger.records import list_runs

        assert list_runs(conn) == []


def test_a_wait_of_nothing_or_of_hours_is_refused_naming_timeout_s(project: Path):
    session = session_for("day", project)
    (e1, zero), (e2, long), (e3, batch) = call(session, ("wait", {"run": "x", "timeout_s": 0}),
                                               ("experiment_wait", {"experiment": "x", "timeout_s": 3600}),
                                               ("experiment_batch_wait", {"batch": "x", "timeout_s": -1}))
    assert e1 and e2 and e3
    assert {zero["error"]["field"], long["error"]["field"], batch["error"]["field"]} == {"timeout_s"}
    assert "expected a number of seconds above 0 and at most 600" in long["error"]["message"]


def test_an_agent_waits_for_one_attempt(project: Path):
    session = session_for("day", project)
    (_, submitted), (_, ended) = call(session, ("submit", {"script": "train.py", "args": ["--fail"], "name": "one"}),
                                      ("wait", {"run": "one/1", "timeout_s": 120}))
    assert ended["ended"] and ended["attempt"]["attempt_id"] == f"{submitted['run_id']}/1"
    assert ended["attempt"]["termination_reason"] == "code_error"
