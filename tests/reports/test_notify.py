"""Notifications through apprise to a real HTTP receiver on loopback: what needs a person is told once, with a link."""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from sqlalchemy import select

from trackway.ledger import open_ledger
from trackway.ledger.schema import notifications

FAULTS = Path(__file__).resolve().parents[2] / "examples" / "faults"


class Receiver:
    """A webhook on loopback that keeps every JSON body posted to it, and its headers (status 200, or `status` when set)."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.headers: list[dict] = []
        self.status = 200
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                length = int(self.headers.get("content-length", 0))
                receiver.headers.append(dict(self.headers))
                receiver.bodies.append(json.loads(self.rfile.read(length) or b"{}"))
                self.send_response(receiver.status)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"json://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, count: int, timeout: float = 30) -> list[dict]:
        deadline = time.time() + timeout
        while len(self.bodies) < count and time.time() < deadline:
            time.sleep(0.05)
        return self.bodies


@pytest.fixture
def receiver():
    made = Receiver()
    yield made
    made.server.shutdown()


def _configure(receiver: Receiver, extra: str = "") -> None:
    Path("trackway.toml").write_text(
        f'[notify]\nurls = ["{receiver.url}"]\nlink = "http://dash.example:8080"\n{extra}')


def _rows(sqlite_url: str) -> list[dict]:
    ledger = open_ledger(sqlite_url)
    try:
        with ledger.read() as conn:
            return [dict(r) for r in conn.execute(select(notifications).order_by(notifications.c.created_at)).mappings()]
    finally:
        ledger.dispose()


def test_a_failed_attempt_is_told_once_with_its_evidence_and_a_link_and_a_completed_one_is_not(cli_sqlite, receiver, sqlite_url):
    _configure(receiver)
    assert cli_sqlite("submit", "--name", "fine", "--", sys.executable, "-c", "print('ok')").code == 0
    failed = cli_sqlite("submit", "--name", "broken", "--", sys.executable, "-c", "1/0")
    assert failed.code == 1
    run_id = failed.out.split()[0]
    (body,) = receiver.wait_for(1)
    assert body["title"] == f"trackway: {run_id}/1 ended code_error"
    assert f"{run_id}/1 (broken) ended code_error." in body["message"]
    assert "ZeroDivisionError" in body["message"] and f"http://dash.example:8080/#/runs/{run_id}" in body["message"]
    # Told once: another pass over the same history sends nothing more.
    assert cli_sqlite("supervise", "--once").code == 0
    time.sleep(0.5)
    assert len(receiver.bodies) == 1
    (row,) = _rows(sqlite_url)
    assert (row["key"], row["state"], row["tries"]) == (f"attempt_ended:{run_id}/1", "sent", 1)


def test_a_preemption_resumed_by_the_supervisor_is_not_news(cli_sqlite, receiver, sqlite_url):
    _configure(receiver)
    result = cli_sqlite("submit", "--", sys.executable, str(FAULTS / "preempted.py"))
    assert result.code == 0, result.err
    assert cli_sqlite("supervise", "--once").code == 0
    time.sleep(0.5)
    assert receiver.bodies == [] and _rows(sqlite_url) == []


def test_a_service_that_refuses_is_tried_again_and_its_error_kept(cli_sqlite, receiver, sqlite_url):
    _configure(receiver, 'events = ["attempts"]\n')
    receiver.status = 500
    failed = cli_sqlite("submit", "--", sys.executable, "-c", "import sys; sys.exit(3)")
    assert failed.code == 1
    receiver.wait_for(1)
    assert cli_sqlite("supervise", "--once").code == 0
    (row,) = _rows(sqlite_url)
    assert row["state"] == "pending" and row["tries"] == 1 and "error=500" in row["last_error"]


@pytest.mark.parametrize(("section", "said"), [
    ('urls = ["hooks.example.com/x"]', "expected a URL such as json://"),
    ('urls = ["json://h/x"]\nlink = "dash:8080"', "[notify] link: expected the dashboard's http(s):// address"),
    ('urls = ["json://h/x"]\nevents = ["everything"]',
     "[notify] events: expected some of attempts, watchers, evaluations, experiments, expectations, got 'everything'"),
    ('url = "json://h/x"', "[notify] url: unknown key"),
])
def test_a_bad_notify_section_is_refused_naming_the_key(cli_sqlite, section, said):
    Path("trackway.toml").write_text(f"[notify]\n{section}\n")
    result = cli_sqlite("runs")
    assert result.code == 2 and said in result.err


def test_what_each_happening_says():
    from trackway.reports.notify import message_for

    link = "http://dash:8080"
    verdict = message_for("experiment_concluded", "x1", {"experiment_id": "x1", "title": "double lr", "status": "concluded",
                                                        "verdict": "rejected", "why": "1 of 1 criteria fail", "run_id": "r1"}, link)
    assert verdict.title == "trackway: experiment x1 (double lr): rejected"
    assert verdict.body == "1 of 1 criteria fail\nhttp://dash:8080/#/experiments/x1"
    evaluation = message_for("evaluation_finished", "ev1", {"run_id": "r1", "step": 300, "spec": "arith",
                                                            "state": "completed", "metrics": {"pass@1": 0.249}}, None)
    assert evaluation.body == "pass@1 0.249\ntrackway explain r1" and "step 300 arith evaluation completed" in evaluation.title
    alarm = message_for("watcher_fired", "r1/2/stalled", {"attempt_id": "r1/2", "watcher": "stalled",
                                                          "message": "no heartbeat for 700 s"}, link)
    assert alarm.title == "trackway: r1/2 stalled" and alarm.body.startswith("no heartbeat for 700 s")
    # An evaluation seed's own attempt is the evaluation's business; a spent retry budget on a preemption is a person's.
    assert message_for("attempt_ended", "e/1", {"attempt_id": "e/1", "run_id": "e", "kind": "eval",
                                                "termination_reason": "code_error"}, link) is None
    stopped = message_for("attempt_ended", "r1/11", {"attempt_id": "r1/11", "run_id": "r1", "kind": "full",
                                                     "termination_reason": "preempted",
                                                     "decision": {"action": "stop", "message": "preempted 10 times"}}, link)
    assert stopped is not None and "trackway: stop: preempted 10 times" in stopped.body


# -- the outbox: sent within seconds, once per destination, by whoever delivers ----------------------


def _all_values(sqlite_url: str) -> list[str]:
    from trackway.ledger.schema import notification_deliveries

    ledger = open_ledger(sqlite_url)
    try:
        with ledger.read() as conn:
            return [str(v) for table in (notifications, notification_deliveries)
                    for row in conn.execute(select(table)) for v in row]
    finally:
        ledger.dispose()


def test_a_foreground_commands_alert_arrives_before_it_exits_with_its_idempotency_key(
        cli_process, receiver, home, monkeypatch, tmp_path):
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    monkeypatch.setenv("TRACKWAY_DB", db)
    port = receiver.server.server_address[1]
    # A webhook with a password in its URL: the ledger must not keep it (it names the destination by a hash).
    Path("trackway.toml").write_text(
        f'[notify]\nurls = ["json://alerts:s3cr3t-pass@127.0.0.1:{port}/hook-token-42"]\nevents = ["attempts"]\n')
    failed = cli_process("submit", "--", sys.executable, "-c", "1/0")
    assert failed.code == 1, failed.err
    run_id = failed.out.split()[0]
    # No waiting: the command sent its own alert before it exited.
    assert [b["title"] for b in receiver.bodies] == [f"trackway: {run_id}/1 ended code_error"]
    assert receiver.headers[0]["Idempotency-Key"] == f"attempt_ended:{run_id}/1"
    (row,) = _rows(db)
    assert row["state"] == "sent" and row["claimed_by"] is None
    values = _all_values(db)
    assert not [v for v in values if "s3cr3t" in v or "hook-token-42" in v or f":{port}" in v]
    status = cli_process("notify", "status", "--json")
    assert status.code == 0, status.err
    (told,) = status.json()
    (to,) = told["destinations"]
    assert (told["key"], told["state"], to["state"], to["tries"]) == (f"attempt_ended:{run_id}/1", "sent", "sent", 1)
    assert "s3cr3t" not in status.out and to["destination"].startswith("json:")


def test_a_read_only_command_records_but_never_claims(cli_sqlite, receiver, sqlite_url):
    _configure(receiver, 'events = ["attempts"]\n')
    detached = cli_sqlite("submit", "--detach", "--", sys.executable, "-c", "1/0")
    assert detached.code == 0, detached.err
    deadline = time.time() + 30
    while not _rows(sqlite_url) and time.time() < deadline:
        assert cli_sqlite("runs").code == 0  # reconciles: records the end, and the message
        time.sleep(0.2)
    (row,) = _rows(sqlite_url)
    # TRACKWAY_BACKGROUND_SUPERVISOR=0: nobody was started to send it; it waits, unclaimed, for a deliverer.
    assert (row["state"], row["claimed_by"], row["claimed_at"], row["tries"]) == ("pending", None, None, 0)
    time.sleep(0.3)
    assert receiver.bodies == []
    assert cli_sqlite("supervise", "--once").code == 0
    assert len(receiver.bodies) == 1 and _rows(sqlite_url)[0]["state"] == "sent"


def _pending(ledger, key: str = "attempt_ended:r1/1", **values) -> None:
    from datetime import datetime, timezone

    with ledger.write() as conn:
        conn.execute(notifications.insert().values(**{
            "key": key, "kind": "attempts", "run_id": "r1", "title": "r1/1 ended oom", "body": "evidence",
            "state": "pending", "tries": 0, "created_at": datetime.now(timezone.utc), **values}))


def test_a_claim_by_a_dead_process_here_is_taken_over_at_once_and_a_live_or_leased_one_is_not(ledger_url):
    import os
    import subprocess
    from datetime import datetime, timedelta, timezone

    import psutil

    from trackway.reports.outbox import Claimant, Outbox, me

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    started = psutil.Process(gone.pid).create_time()
    gone.wait()
    host = os.uname().nodename
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    ledger = open_ledger(ledger_url)
    try:
        for key, holder in [("dead", Claimant(host, gone.pid, started)), ("alive", me()),
                            ("elsewhere", Claimant("another-host", os.getpid(), 1.0))]:
            _pending(ledger, key, state="sending", claimed_by=str(holder), claimed_at=datetime.now(timezone.utc),
                     lease_until=later)
        outbox = Outbox(ledger)
        claimed = outbox.claim()
        assert claimed is not None and claimed["key"] == "dead"
        assert outbox.claim() is None  # a live sender here, and another host's within its lease, keep theirs
        with ledger.write() as conn:
            conn.execute(notifications.update().where(notifications.c.key == "elsewhere")
                         .values(lease_until=datetime.now(timezone.utc) - timedelta(seconds=1)))
        assert outbox.claim()["key"] == "elsewhere"  # its lease ran out: that host's sender is taken for gone
    finally:
        ledger.dispose()


def test_a_destination_that_took_it_is_not_sent_it_again_when_another_failed(sqlite_url):
    from datetime import datetime, timedelta, timezone

    from trackway.ledger.schema import notification_deliveries
    from trackway.reports.outbox import Outbox

    took, refused = Receiver(), Receiver()
    refused.status = 500
    ledger = open_ledger(sqlite_url)
    try:
        _pending(ledger)
        outbox = Outbox(ledger)
        urls = (took.url, refused.url)
        assert outbox.deliver(outbox.claim(), urls) == "pending"
        assert (len(took.bodies), len(refused.bodies)) == (1, 1)
        refused.status = 200
        assert outbox.claim() is None  # tried again a minute later, not at once
        with ledger.write() as conn:
            conn.execute(notifications.update().values(claimed_at=datetime.now(timezone.utc) - timedelta(minutes=2)))
        assert outbox.deliver(outbox.claim(), urls) == "sent"
        assert (len(took.bodies), len(refused.bodies)) == (1, 2)
        assert {h["Idempotency-Key"] for h in took.headers + refused.headers} == {"attempt_ended:r1/1"}
        with ledger.read() as conn:
            tries = sorted(r.tries for r in conn.execute(select(notification_deliveries)))
        assert tries == [1, 2]
    finally:
        ledger.dispose()
        took.server.shutdown()
        refused.server.shutdown()


def test_a_read_only_command_hands_what_it_recorded_to_a_background_supervisor_it_starts(
        cli_process, receiver, home, monkeypatch, tmp_path):
    from trackway.settings import load_settings
    from trackway.supervisor import background

    monkeypatch.setenv("TRACKWAY_DB", f"sqlite:///{tmp_path / 'ledger.db'}")
    _configure(receiver, 'events = ["attempts"]\n')
    detached = cli_process("submit", "--detach", "--", sys.executable, "-c", "open('ended', 'w').close(); 1/0")
    assert detached.code == 0, detached.err
    deadline = time.time() + 30
    while not Path("ended").exists() and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    monkeypatch.delenv(background.AUTOSTART_ENV)
    monkeypatch.setenv(background.IDLE_ENV, "1")
    try:
        listed = cli_process("runs")
        assert listed.code == 0, listed.err
        (body,) = receiver.wait_for(1)
        assert body["title"] == f"trackway: {detached.out.split()[0]}/1 ended code_error"
    finally:
        background.stop(load_settings())


def test_how_a_destination_is_named_and_its_errors_kept_without_its_secrets():
    from trackway.reports.outbox import destination_of, masked, with_idempotency_key

    url = "slack://T0KENAAA/B0KENBBB/C0KENCCC/#training"
    assert destination_of(url).startswith("slack:") and "T0KEN" not in destination_of(url)
    assert destination_of(url) != destination_of(url.replace("#training", "#alerts"))
    assert masked("posting to T0KENAAA/B0KENBBB failed: 403 (C0KENCCC revoked)", url) == \
        "posting to ***/*** failed: 403 (*** revoked)"
    # Webhooks get the key as a header; a service that takes no custom header gets its URL unchanged.
    assert with_idempotency_key("json://h/x?a=1", "attempt_ended:r1/2") == \
        "json://h/x?a=1&+Idempotency-Key=attempt_ended%3Ar1%2F2"
    assert with_idempotency_key(url, "k") == url
