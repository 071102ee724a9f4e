"""What the ledger keeps of a process's words (termination evidence) carries no usable secret, on both backends."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from sqlalchemy import select

from trackway.ledger import Ledger
from trackway.ledger.records import get_attempt, insert_attempt, insert_run, record_attempt_end, update_attempt
from trackway.ledger.schema import attempts
from trackway.taxonomy import TerminationReason

HF = "hf_" + "aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dE3f"
URL_PASSWORD = "hunter2-pw"


def _attempt(ledger: Ledger) -> dict:
    now = datetime.now(timezone.utc)
    with ledger.write() as conn:
        insert_run(conn, dict(
            run_id="rsecret", name="secret", project="p", kind="full", state="running", command='["python"]',
            workdir="/tmp", resource="local", executor="local", gpus=0, created_at=now,
        ))  # fmt: skip
        attempt_id = insert_attempt(conn, dict(
            run_id="rsecret", attempt_number=1, state="running", executor="local", state_dir="/tmp/state",
            log_path="/tmp/log", gpu_count=0, started_at=now - timedelta(minutes=1),
        ))  # fmt: skip
        return dict(get_attempt(conn, attempt_id))


def _stored_evidence(ledger: Ledger) -> tuple[str, dict]:
    with ledger.read() as conn:
        text = conn.execute(select(attempts.c.termination_evidence)).scalar_one()
    return text, json.loads(text)  # still valid JSON after redaction


def test_recorded_evidence_hides_tokens_and_url_passwords(ledger):
    attempt = _attempt(ledger)
    evidence = {
        "rule": "log:traceback",
        "lines": [
            f"2026-01-01T00:00:00Z out HF_TOKEN={HF}",
            f"2026-01-01T00:00:00Z out connecting to postgresql://trainer:{URL_PASSWORD}@db/metrics",
            "2026-01-01T00:00:00Z err RuntimeError: step 12 loss=2.5 lr=3e-4",
        ],
        "exit_code": 1,
        "signal": None,
        "executor_state": None,
        "executor": [f"Authorization: Bearer {HF}"],
    }
    with ledger.write() as conn:
        record_attempt_end(
            conn, attempt, ended_at=datetime.now(timezone.utc), reason=TerminationReason.CODE_ERROR,
            evidence_json=json.dumps(evidence), exit_code=1, signal=None, cost_per_gpu_hour=0.0,
        )  # fmt: skip
    text, stored = _stored_evidence(ledger)
    assert HF not in text and URL_PASSWORD not in text
    assert stored["lines"] == [
        "2026-01-01T00:00:00Z out HF_TOKEN=***",
        "2026-01-01T00:00:00Z out connecting to postgresql://trainer:***@db/metrics",
        "2026-01-01T00:00:00Z err RuntimeError: step 12 loss=2.5 lr=3e-4",
    ]
    assert stored["executor"] == ["Authorization: Bearer ***"]
    assert (stored["rule"], stored["exit_code"]) == ("log:traceback", 1)


def test_the_sdk_note_message_is_redacted(ledger):
    """The standalone SDK records its note's message (an exception's text) as the evidence."""
    attempt = _attempt(ledger)
    note = {"rule": "sdk:note", "lines": [f"ValueError: login to https://u:{URL_PASSWORD}@hub failed with {HF}"],
            "exit_code": 1, "signal": None}  # fmt: skip
    with ledger.write() as conn:
        record_attempt_end(
            conn, attempt, ended_at=datetime.now(timezone.utc), reason=TerminationReason.CODE_ERROR,
            evidence_json=json.dumps(note), exit_code=1, signal=None, cost_per_gpu_hour=0.0,
        )  # fmt: skip
    text, stored = _stored_evidence(ledger)
    assert HF not in text and URL_PASSWORD not in text
    assert stored["lines"] == ["ValueError: login to https://u:***@hub failed with hf_***"]


def test_evidence_written_by_update_attempt_is_redacted(ledger):
    """The launch path records an executor's refusal (its error text) through update_attempt."""
    attempt = _attempt(ledger)
    refusal = {"rule": "executor:submit-refused", "lines": [f"cannot start: PGPASSWORD={URL_PASSWORD} rejected"]}
    with ledger.write() as conn:
        update_attempt(conn, attempt["attempt_id"], state="ended", termination_evidence=json.dumps(refusal))
    text, stored = _stored_evidence(ledger)
    assert URL_PASSWORD not in text
    assert stored == {"rule": "executor:submit-refused", "lines": ["cannot start: PGPASSWORD=*** rejected"]}
