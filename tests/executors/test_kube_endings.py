"""kube_endings.status_of on the objects as the API spells them (the cases the emulator tests do not drive), and the client missing."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from trackway.executors.base import JobPhase
from trackway.executors.kube_endings import Seen, status_of

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
JOB = {"metadata": {"name": "tw-r-1-abc", "namespace": "ml"}, "status": {"active": 1}}


def pod(**status) -> dict:
    return {"metadata": {"name": "tw-r-1-abc-x"}, "spec": {"nodeName": "n1"}, "status": status}


def suspended(job: dict) -> dict:
    return {**job, "status": {"conditions": [{"type": "Suspended", "status": "True", "reason": "JobSuspended",
                                              "message": "Job suspended"}]}}


def test_a_job_kueue_suspends_before_it_ran_is_queued_and_after_it_ran_preempted():
    waiting = status_of(Seen(job=suspended(JOB), pod=None, submitted_at=NOW), NOW)
    assert waiting.phase is JobPhase.QUEUED and "held by a queue" in waiting.evidence[0]
    evicted = status_of(Seen(job=suspended(JOB), pod=None, pod_was_seen=True, submitted_at=NOW), NOW)
    assert (evicted.phase, evicted.reason) == (JobPhase.ENDED, "preempted")
    assert "Kueue" in evicted.evidence[0]


def test_a_node_tainted_away_is_a_lost_node():
    seen = Seen(job=JOB, pod=pod(phase="Running", conditions=[{
        "type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager",
        "message": "Taint manager: deleting due to NoExecute taint node.kubernetes.io/unreachable"}]),
        submitted_at=NOW)
    status = status_of(seen, NOW)
    assert (status.phase, status.reason) == (JobPhase.VANISHED, "infra_transient")
    assert "node.kubernetes.io/unreachable" in status.evidence[0]


def test_an_invalid_image_name_is_a_config_error_at_once():
    seen = Seen(job=JOB, pod=pod(phase="Pending", containerStatuses=[{"state": {"waiting": {
        "reason": "InvalidImageName", "message": 'couldn\'t parse image name "Python:3"'}}}]),
        submitted_at=NOW, pending_s=600)
    status = status_of(seen, NOW + timedelta(seconds=1))
    assert (status.reason, status.never_started) == ("config_error", True)
    assert "couldn't parse image name" in status.evidence[0]


def test_a_config_error_waits_for_the_pending_limit():
    seen = Seen(job=JOB, pod=pod(phase="Pending", containerStatuses=[{"state": {"waiting": {
        "reason": "CreateContainerConfigError", "message": 'secret "wandb" not found'}}}]),
        submitted_at=NOW, pending_s=600)
    assert status_of(seen, NOW + timedelta(seconds=599)).phase is JobPhase.QUEUED
    assert status_of(seen, NOW + timedelta(seconds=600)).reason == "config_error"


def test_a_cancelled_attempt_has_no_reason_of_the_executors():
    seen = Seen(job=JOB, pod=pod(phase="Failed", containerStatuses=[{"state": {"terminated": {
        "exitCode": 137, "reason": "OOMKilled"}}}]), cancelled=True, submitted_at=NOW)
    status = status_of(seen, NOW)
    assert status.cancelled and status.reason is None and status.signal == 9


def test_a_pod_gone_with_its_node_is_lost_even_when_the_job_counts_it_failed():
    failed = {**JOB, "status": {"failed": 1, "conditions": [{"type": "Failed", "status": "True",
                                                             "reason": "BackoffLimitExceeded"}]}}
    status = status_of(Seen(job=failed, pod=None, pod_was_seen=True, submitted_at=NOW), NOW)
    assert (status.phase, status.reason) == (JobPhase.VANISHED, "infra_transient")
    assert "BackoffLimitExceeded" in status.evidence[0]


def test_without_the_client_the_error_says_how_to_install_it(tmp_path, monkeypatch):
    import sys

    import pytest

    from trackway.errors import ExecutorError
    from trackway.executors.kubernetes import KubernetesExecutor

    monkeypatch.setitem(sys.modules, "kubernetes", None)  # as if it were not installed
    with pytest.raises(ExecutorError, match=r"the kubernetes client is not installed .*pip install 'trackway\[kubernetes\]'"):
        KubernetesExecutor(tmp_path)._cluster(None, None)
