"""The SSH executor against real sshd hosts: pulling output and spool by offset, losing and regaining a host, code
snapshots, polls over one long-lived agent session."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from trackway.errors import ExecutorError, InputError
from trackway.executors import remote_agent, ssh_session
from trackway.executors.base import JobPhase, LaunchRequest
from trackway.executors.code_snapshot import build_snapshot
from trackway.executors.ssh import SshExecutor
from trackway.receipts.code import capture_code
from trackway.settings import validate_toml
from trackway.settings.resources import Resource

NO_HOST_KEYS = ("-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null")


def resource(*hosts, preemptible=False, unreachable_seconds=600.0, gpus_per_node=None, setup=None) -> Resource:
    return Resource(name="pods", executor="ssh", hosts=tuple(h.spec for h in hosts), key_file=str(hosts[0].key),
                    workdir=str(hosts[0].work), ssh_options=NO_HOST_KEYS, preemptible=preemptible,
                    unreachable_seconds=unreachable_seconds, gpus_per_node=gpus_per_node, setup=setup)


def launch(tmp_path: Path, res: Resource, script: str, attempt: str = "run1/1", gpus: int = 0, workdir=None,
           code=None) -> tuple[SshExecutor, LaunchRequest]:
    work = workdir or tmp_path / "project"
    work.mkdir(exist_ok=True)
    (work / "job.py").write_text(script)
    state = tmp_path / "state" / attempt.replace("/", "-")
    request = LaunchRequest(attempt_id=attempt, command=[sys.executable, "job.py"], cwd=work,
                            env={"TRACKWAY_RUN_ID": "run1", "TRACKWAY_DB": "sqlite:////nowhere.db"},
                            state_dir=state, log_path=state / "output.log", gpus=gpus, resource=res,
                            code=code or build_snapshot(work, None, None))
    return SshExecutor(tmp_path / "home"), request


def wait_for(executor, handle, phase_done, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        status = executor.poll(handle)
        if phase_done(status):
            return status
        assert time.monotonic() < deadline, f"last status: {status}"
        time.sleep(0.2)


SPOOLING = """
import os, time, sys
spool = os.environ["TRACKWAY_SPOOL_DIR"]
print("db:", os.environ.get("TRACKWAY_DB"), flush=True)
for i in range(6):
    with open(os.path.join(spool, "events.jsonl"), "a") as f:
        f.write('{"seq": %d}\\n' % i)
    print("step", i, flush=True)
    time.sleep(0.4)
"""


def test_output_and_spool_arrive_while_the_attempt_runs_each_byte_once(tmp_path, loopback_host):
    executor, request = launch(tmp_path, resource(loopback_host), SPOOLING)
    submission = executor.submit(request)
    local_events = request.state_dir / "spool" / "events.jsonl"

    wait_for(executor, submission.handle, lambda s: local_events.exists() and local_events.read_text().count("\n") >= 2)
    assert executor.poll(submission.handle).phase is JobPhase.RUNNING  # pulled while running, not at the end
    status = wait_for(executor, submission.handle, lambda s: s.phase.is_terminal())

    assert status.phase is JobPhase.ENDED and status.exit_code == 0
    remote = loopback_host.work / "attempts" / "run1" / "1"
    assert local_events.read_bytes() == (remote / "spool" / "events.jsonl").read_bytes()
    assert [line for line in local_events.read_text().splitlines()] == [f'{{"seq": {i}}}' for i in range(6)]
    log = request.log_path.read_text()
    assert log == (remote / "output.log").read_text() and "step 5" in log
    assert "db: None" in log  # this machine's ledger URL is never sent to a host


def test_a_host_that_comes_back_with_the_job_running_is_adopted(tmp_path, loopback_host):
    script = "import time\nprint('up', flush=True)\ntime.sleep(5)\nprint('finished', flush=True)\n"
    executor, request = launch(tmp_path, resource(loopback_host, unreachable_seconds=120), script)
    submission = executor.submit(request)
    wait_for(executor, submission.handle, lambda s: request.log_path.exists() and "up" in request.log_path.read_text())

    loopback_host.stop_sshd()
    away = executor.poll(submission.handle)
    assert away.phase is JobPhase.RUNNING
    assert away.placement["unreachable_since"] and "unreachable since" in away.evidence[0]
    loopback_host.start()
    back = executor.poll(submission.handle)
    status = wait_for(executor, submission.handle, lambda s: s.phase.is_terminal())

    assert back.phase is JobPhase.RUNNING and any("adopted" in line for line in back.evidence)
    assert status.phase is JobPhase.ENDED and status.exit_code == 0 and status.reason is None
    assert "finished" in request.log_path.read_text()


def test_a_host_silent_past_its_window_ends_the_attempt_with_the_resources_reason(tmp_path, loopback_host):
    script = "import time\nprint('up', flush=True)\ntime.sleep(60)\n"
    executor, request = launch(tmp_path, resource(loopback_host, preemptible=True, unreachable_seconds=1), script)
    submission = executor.submit(request)
    wait_for(executor, submission.handle, lambda s: request.log_path.exists() and "up" in request.log_path.read_text())

    loopback_host.reclaim()
    loopback_host.stop_sshd()
    first = executor.poll(submission.handle)
    time.sleep(1.5)
    lost = executor.poll(submission.handle)

    assert first.phase is JobPhase.RUNNING
    assert lost.phase is JobPhase.VANISHED and lost.reason == "preempted"
    assert any("unreachable since" in line and "unreachable_seconds (1)" in line for line in lost.evidence)
    assert executor.poll(submission.handle) == lost  # the end is kept: later polls do not ask the host
    # A retry goes to a host that was not just lost, when the resource has one.
    assert executor._host_order(resource(loopback_host, unreachable_seconds=600)) == [loopback_host.spec]


def test_a_wiped_host_that_answers_again_ends_the_attempt_as_infra_transient(tmp_path, loopback_host):
    script = "import time\nprint('up', flush=True)\ntime.sleep(60)\n"
    executor, request = launch(tmp_path, resource(loopback_host, preemptible=False), script)
    submission = executor.submit(request)
    wait_for(executor, submission.handle, lambda s: request.log_path.exists() and "up" in request.log_path.read_text())

    loopback_host.reclaim()  # processes killed, disk wiped; a new machine answers at the same address
    loopback_host.start()
    status = executor.poll(submission.handle)

    assert status.phase is JobPhase.VANISHED and status.reason == "infra_transient"
    assert any("is gone from host" in line for line in status.evidence)


def test_cancel_stops_the_process_group_on_the_host(tmp_path, loopback_host):
    script = ("import subprocess, time\nsubprocess.Popen(['sleep', '300'])\nprint('up', flush=True)\n"
              "time.sleep(300)\n")
    executor, request = launch(tmp_path, resource(loopback_host), script)
    submission = executor.submit(request)
    wait_for(executor, submission.handle, lambda s: request.log_path.exists() and "up" in request.log_path.read_text())

    executor.cancel(submission.handle)
    status = wait_for(executor, submission.handle, lambda s: s.phase.is_terminal(), timeout=60)

    assert status.phase is JobPhase.ENDED and status.cancelled
    left = loopback_host.running("sleep 300")
    assert left == []  # the child the command started went with its group


def test_the_snapshot_is_the_recorded_commit_and_diff_not_the_work_tree_of_later(tmp_path, loopback_host):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = lambda *a: subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True)  # noqa: E731
    git("init", "-q")
    (repo / "job.py").write_text("print('version 1')\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "v1")
    (repo / "job.py").write_text("print('version 2, uncommitted')\n")
    code = capture_code(repo, home=tmp_path / "home")
    (repo / "job.py").write_text("print('version 3, edited after submit')\n")

    snapshot = build_snapshot(repo, code.commit, code.dirty_diff)
    executor, request = launch(tmp_path, resource(loopback_host), "print('version 3, edited after submit')\n",
                               workdir=repo, code=snapshot)
    submission = executor.submit(request)
    status = wait_for(executor, submission.handle, lambda s: s.phase.is_terminal())

    assert status.exit_code == 0
    assert "version 2, uncommitted" in request.log_path.read_text()
    assert snapshot.source == f"commit {code.commit[:12]} + the recorded diff"


def test_gpus_are_leased_per_host_and_a_full_host_is_passed_over(tmp_path, loopback_host):
    script = "import os, time\nprint('gpus', os.environ['CUDA_VISIBLE_DEVICES'], flush=True)\ntime.sleep(30)\n"
    res = resource(loopback_host, gpus_per_node=1)
    executor, first = launch(tmp_path, res, script, attempt="run1/1", gpus=1)
    held = executor.submit(first)
    _, second = launch(tmp_path, res, script, attempt="run1/2", gpus=1)

    with pytest.raises(ExecutorError, match="GPUs are leased to running attempts"):
        executor.submit(second)
    # What `trackway resources` says of it: no GPU free, one attempt running (no nvidia-smi here: the declared one).
    from trackway.resources.availability import availability

    busy = availability(res, timeout_s=5, home=tmp_path / "home")
    assert (busy.free_gpus, busy.total_gpus, busy.running_jobs, busy.pending_jobs) == (0, 1, 1, 0)
    wait_for(executor, held.handle, lambda s: first.log_path.exists() and "gpus 0" in first.log_path.read_text())
    executor.cancel(held.handle)
    wait_for(executor, held.handle, lambda s: s.phase.is_terminal())
    idle = availability(res, timeout_s=5, home=tmp_path / "home")
    assert (idle.free_gpus, idle.running_jobs) == (1, 0)
    executor.submit(second)  # the ended attempt's GPU is free again


def test_a_hosts_gpus_with_a_compute_process_are_not_free():
    from trackway.resources.availability import _nvidia_smi_gpus

    said = ("0, 00000000:18:00.0\n1, 00000000:3B:00.0\n2, 00000000:86:00.0\n--apps--\n"
            "00000000:3B:00.0\n00000000:3B:00.0\n")
    assert _nvidia_smi_gpus(said) == ([0, 1, 2], {1})
    assert _nvidia_smi_gpus("no nvidia-smi\n") == (None, set())


@pytest.mark.parametrize("toml, message", [
    ('[resources.a]\nexecutor = "ssh"\n', "executor 'ssh' needs hosts"),
    ('[resources.a]\nexecutor = "local"\nhosts = ["h"]\n', "an SSH setting, but executor is 'local'"),
    ('[resources.a]\nexecutor = "ssh"\nhosts = ["root@host:port"]\n', "expected user@host or user@host:port"),
    ('[resources.a]\nexecutor = "ssh"\nhosts = ["h"]\nunreachable_seconds = -1\n', "unreachable_seconds"),
    ('[resources.a]\nexecutor = "ssh"\nhosts = ["h"]\nssh_options = ["-O"]\n', "set by trackway"),
])
def test_a_bad_ssh_resource_is_refused_naming_the_field(toml, message):
    import tomllib

    with pytest.raises(InputError, match=message):
        validate_toml(tomllib.loads(toml), Path("trackway.toml"), toml)


def test_availability_says_which_hosts_answer(loopback_host):
    from ssh_hosts import free_port

    from trackway.resources.availability import availability

    dead = f"root@127.0.0.1:{free_port()}"  # nothing listens there
    res = Resource(name="pods", executor="ssh", hosts=(loopback_host.spec, dead), key_file=str(loopback_host.key),
                   ssh_options=NO_HOST_KEYS, gpus_per_node=2)

    row = availability(res, timeout_s=3)

    assert row.reachable and row.total_gpus == 2  # the answering host's declared GPUs only
    assert row.error.startswith("1 of 2 hosts answer: ") and dead in row.error


def test_one_poll_asks_every_host_and_a_silent_one_does_not_hide_the_others(tmp_path, loopback_host, ssh_key):
    from ssh_hosts import SshHost

    other = SshHost("other", tmp_path / "host-other", ssh_key).start()
    try:
        script = "import time\nprint('up', flush=True)\ntime.sleep(2)\n"
        executor, first = launch(tmp_path, resource(loopback_host, other), script, attempt="run1/1")
        first_job = executor.submit(first)
        second = LaunchRequest(**{**first.__dict__, "attempt_id": "run2/1", "state_dir": tmp_path / "state" / "b",
                                  "log_path": tmp_path / "state" / "b" / "output.log",
                                  "resource": resource(other, loopback_host)})
        second_job = executor.submit(second)
        assert {first_job.host, second_job.host} == {loopback_host.spec, other.spec}

        other.stop_sshd()
        deadline = time.monotonic() + 60
        while True:
            statuses = executor.poll_many([first_job.handle, second_job.handle])
            if statuses[first_job.handle.job_id].phase.is_terminal():
                break
            assert time.monotonic() < deadline
            time.sleep(0.3)

        assert statuses[first_job.handle.job_id].exit_code == 0
        away = statuses[second_job.handle.job_id]
        assert away.phase is JobPhase.RUNNING and away.placement["unreachable_since"]
    finally:
        other.close()


def test_the_agent_sends_every_ranks_heartbeat_whole(tmp_path):
    """Each rank's heartbeat file is replaced whole by its writer: the host sends it whole, never by offset."""
    import base64
    import json as jsonlib

    from trackway.executors import remote_agent

    spool = tmp_path / "attempt" / "spool"
    spool.mkdir(parents=True)
    for name, rank in (("heartbeat.json", 0), ("heartbeat-r1.json", 1)):
        (spool / name).write_text(jsonlib.dumps({"t": 1.0, "rank": rank, "step": 3}))
    answer = remote_agent.poll({"attempts": [{"dir": str(tmp_path / "attempt"), "offsets": {}}]})
    files = answer["attempts"][str(tmp_path / "attempt")]["files"]
    sent = {rel: jsonlib.loads(base64.b64decode(item["data"]))["rank"] for rel, item in files.items() if item.get("whole")}
    assert sent == {"spool/heartbeat.json": 0, "spool/heartbeat-r1.json": 1}


def test_a_host_without_this_trackways_agent_is_sent_it_and_then_answers(tmp_path, loopback_host):
    # `trackway checkpoints` asks a host that may hold no agent, or another version's (a wiped workdir, an upgrade).
    from trackway.executors.ssh import SshClient, SshTarget

    root = loopback_host.work / "fresh"
    root.mkdir(parents=True)
    client = SshClient(SshTarget.parse(loopback_host.spec), str(loopback_host.key), NO_HOST_KEYS)
    try:
        answer = SshExecutor(tmp_path / "home").ask_agent(client, sys.executable, str(root),
                                                          ["checkpoints", str(root / "runs" / "run1" / "checkpoints")])
    finally:
        client.close()
    assert answer == {"exists": False, "entries": {}}  # the agent's own answer: no checkpoints there yet
    assert list((root / ".trackway").glob("*/agent.py"))  # sent, where the next call finds it


# -- the long-lived agent session (executors/ssh_session.py) --------------------------------------


def _ssh_processes_started(monkeypatch) -> list[list[str]]:
    """Every ssh process this test's executor starts, by argv (a login each, but for `-O exit`)."""
    started: list[list[str]] = []
    popen = subprocess.Popen.__init__

    def counted(self, args, *rest, **kwargs):
        if isinstance(args, (list, tuple)) and args and args[0] == "ssh":
            started.append(list(args))
        popen(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", counted)
    return started


def _serving_agents(host_work) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if cmdline[-1:] == ["serve"] and any(str(host_work) in part for part in cmdline):
            found.append(proc)
    return found


def test_a_running_attempts_polls_are_answered_over_one_login(tmp_path, loopback_host, monkeypatch):
    executor, request = launch(tmp_path, resource(loopback_host), SPOOLING)
    submission = executor.submit(request)
    started = _ssh_processes_started(monkeypatch)
    status = wait_for(executor, submission.handle, lambda s: s.phase.is_terminal())
    assert status.phase is JobPhase.ENDED and status.exit_code == 0
    events = (request.state_dir / "spool" / "events.jsonl").read_text().splitlines()
    assert events == [f'{{"seq": {i}}}' for i in range(6)]  # the same bytes a call each brought
    logins = [argv for argv in started if "-O" not in argv]
    assert len(logins) == 1 and logins[0][-1].endswith("serve; else echo '{\"agent_missing\": true}'; fi")
    ssh_session.close_all()
    deadline = time.monotonic() + 10
    while _serving_agents(loopback_host.work) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _serving_agents(loopback_host.work) == []  # closing the session ends the agent on the host


def test_an_agent_killed_on_the_host_costs_one_call_and_a_new_session_not_an_answer(tmp_path, loopback_host,
                                                                                    monkeypatch):
    executor, request = launch(tmp_path, resource(loopback_host), "import time\nprint('up', flush=True)\n"
                                                                  "time.sleep(30)\n")
    submission = executor.submit(request)
    wait_for(executor, submission.handle, lambda s: "up" in request.log_path.read_text()
             if request.log_path.exists() else False)
    (agent,) = _serving_agents(loopback_host.work)
    agent.kill()
    agent.wait(5)
    started = _ssh_processes_started(monkeypatch)
    for _ in range(3):
        assert executor.poll(submission.handle).phase is JobPhase.RUNNING
    # A new session, and before it a call of its own when the broken one was found mid-ask.
    commands = [argv[-1] for argv in started if "-O" not in argv]
    assert "agent.py serve;" in commands[-1] and all("agent.py poll;" in command for command in commands[:-1])
    assert len(commands) <= 2
    executor.cancel(submission.handle)
    assert wait_for(executor, submission.handle, lambda s: s.phase.is_terminal()).cancelled


def test_the_agent_serves_one_answer_a_line_and_ends_at_eof_or_when_left_idle(tmp_path):
    (tmp_path / "step-00000005").mkdir()
    requests = "\n".join([json.dumps({"args": ["checkpoints", str(tmp_path)]}), "not json",
                          json.dumps({"args": ["start", str(tmp_path)]})]) + "\n"
    read, write = os.pipe()
    os.write(write, requests.encode())
    os.close(write)
    out = io.StringIO()
    with open(read, encoding="utf-8") as stdin:
        assert remote_agent.serve(stdin, out, idle_s=5) == 0
    first, second, third = [json.loads(line) for line in out.getvalue().splitlines()]
    assert list(first["entries"]) == ["step-00000005"]
    assert second == {"error": "not a request: JSONDecodeError"}
    assert third == {"error": "not an action this agent serves"}  # a start reads a bundle: never over a session

    read, write = os.pipe()  # a client gone without closing its end: the agent does not wait for it forever
    with open(read, encoding="utf-8") as stdin:
        assert remote_agent.serve(stdin, io.StringIO(), idle_s=0.2) == 0
    os.close(write)
