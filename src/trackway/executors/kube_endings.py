"""How an attempt's Job stands, from what the API server says of the Job, its pod and the pod's events.

A pure function of the objects as the API serves them (JSON, camelCase), so that it can be read
beside the Kubernetes API reference:

    the pod's container terminated, reason OOMKilled       -> ended, reason oom
    pod status.reason Evicted, a DisruptionTarget
      condition (PreemptionByScheduler, EvictionByEvictionAPI,
      TerminationByKubelet), the Job suspended by a queue
      (Kueue) after it started                              -> ended, reason preempted
    the node lost (pod reason NodeLost, phase Unknown,
      DisruptionTarget DeletionByTaintManager or
      DeletionByPodGC, the pod gone without an exit status
      while its Job stands)                                 -> vanished, infra_transient (preempted on a
                                                               resource declared preemptible)
    ImagePullBackOff, ErrImagePull, CreateContainerConfigError,
      CreateContainerError, PodScheduled=False Unschedulable,
      for longer than the resource's pending_seconds        -> ended, never started, config_error with the
                                                               waiting message and the pod's last event
      InvalidImageName                                      -> the same at once
    Job condition Failed, reason DeadlineExceeded           -> ended, timed out (the classifier: timeout)
    the container's exit code                               -> ended with it (a code above 128: the signal
                                                               the runtime reports, 128+N); the SDK's note and
                                                               the log decide the reason, as elsewhere
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from trackway.executors.base import JobPhase, JobStatus

WAITING_CONFIG = ("ImagePullBackOff", "ErrImagePull", "CreateContainerConfigError", "CreateContainerError",
                  "ErrImageNeverPull", "RunContainerError")
WAITING_AT_ONCE = ("InvalidImageName",)
DISRUPTION_PREEMPTED = ("PreemptionByScheduler", "PreemptionByKubeScheduler", "EvictionByEvictionAPI",
                        "TerminationByKubelet")


@dataclass(frozen=True)
class Seen:
    """What one poll read: the Job (None: gone), its pod (None: none yet, or gone), the pod's events."""

    job: dict | None
    pod: dict | None
    events: tuple[dict, ...] = ()
    pod_was_seen: bool = False  # an earlier poll saw a pod of this Job
    cancelled: bool = False  # trackway asked to stop it
    submitted_at: datetime | None = None
    pending_s: float = 600.0
    lost_reason: str = "infra_transient"


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _conditions(obj: dict | None) -> dict[str, dict]:
    return {c.get("type"): c for c in ((obj or {}).get("status") or {}).get("conditions") or []}


def _container(pod: dict | None) -> dict:
    statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or []
    return statuses[0] if statuses else {}


def last_event(events: tuple[dict, ...]) -> str | None:
    """The pod's latest event as `Reason: message` (the newest by its last timestamp)."""
    if not events:
        return None

    def when(event: dict) -> str:
        return event.get("lastTimestamp") or event.get("eventTime") or (event.get("metadata") or {}).get(
            "creationTimestamp") or ""

    event = max(events, key=when)
    return f"{event.get('reason')}: {event.get('message')}".strip()


def placement(seen: Seen) -> dict:
    """Where the pod runs or ran: node, pod, the image it pulled (by digest), as far as the API said."""
    found: dict = {}
    if seen.job is not None:
        meta = seen.job.get("metadata") or {}
        found.update(namespace=meta.get("namespace"), job=meta.get("name"))
    if seen.pod is not None:
        found["pod"] = (seen.pod.get("metadata") or {}).get("name")
        node = (seen.pod.get("spec") or {}).get("nodeName")
        if node:
            found["node"] = node
        image_id = _container(seen.pod).get("imageID")
        if image_id:
            found["image"] = image_id
        state = _container(seen.pod).get("state") or {}
        if node and (state.get("running") or state.get("terminated")):
            # `host` once the container started: the supervisor records the placement then, image digest included.
            found["host"] = node
    return found


def status_of(seen: Seen, now: datetime | None = None) -> JobStatus:
    """The JobStatus the objects in `seen` amount to."""
    now = now or datetime.now(timezone.utc)
    where = placement(seen)
    pod, job = seen.pod, seen.job
    pod_status = (pod or {}).get("status") or {}
    job_status = (job or {}).get("status") or {}
    started = parse_time(pod_status.get("startTime")) or parse_time(job_status.get("startTime"))
    container = _container(pod)
    state = container.get("state") or {}
    terminated = state.get("terminated")
    conditions = _conditions(pod)
    job_conditions = _conditions(job)
    event = last_event(seen.events)
    said = [f"Kubernetes: last event of the pod: {event}"] if event else []

    disruption = conditions.get("DisruptionTarget")
    disrupted = disruption is not None and disruption.get("status") == "True"
    node_lost = (pod_status.get("reason") == "NodeLost" or pod_status.get("phase") == "Unknown"
                 or (disrupted and disruption.get("reason") in ("DeletionByTaintManager", "DeletionByPodGC")))
    if node_lost:
        why = "; ".join(filter(None, [pod_status.get("reason"), pod_status.get("message"),
                                      disruption.get("message") if disrupted else None]))
        return _lost(seen, started, where, [f"Kubernetes: the pod's node {where.get('node', '(not known)')} was lost: "
                                            f"{why or 'pod phase Unknown'}", *said])
    if pod_status.get("reason") == "Evicted" or disrupted:
        why = pod_status.get("message") or (disruption or {}).get("message") or ""
        label = "evicted" if pod_status.get("reason") == "Evicted" else f"DisruptionTarget {disruption.get('reason')}"
        if terminated is None and pod_status.get("phase") not in ("Failed", "Succeeded"):
            # Its notice: the command has SIGTERM and the grace to save a checkpoint; the end comes after.
            return JobStatus(phase=JobPhase.RUNNING, started_at=started, cancelled=seen.cancelled, placement=where,
                             evidence=(f"Kubernetes: pod {label}, stopping within its grace: {why}".rstrip(": "),))
        return JobStatus(phase=JobPhase.ENDED, started_at=started,
                         ended_at=_ended(terminated, now, started, seen.submitted_at),
                         exit_code=None if terminated is None else _exit(terminated)[0],
                         signal=None if terminated is None else _exit(terminated)[1],
                         cancelled=seen.cancelled, reason=None if seen.cancelled else "preempted",
                         evidence=(f"Kubernetes: pod {label}: {why}".rstrip(": "), *said), placement=where)
    if terminated is not None:
        code, signal = _exit(terminated)
        lines = [f"Kubernetes: container terminated, reason {terminated.get('reason')}, exit code "
                 f"{terminated.get('exitCode')}" + (f" (128+{signal}: the signal the runtime reports)" if signal else "")]
        if terminated.get("message"):
            lines.append(f"Kubernetes: {terminated['message']}")
        deadline = job_conditions.get("Failed", {}).get("reason") == "DeadlineExceeded"
        reason = None
        if terminated.get("reason") == "OOMKilled":
            reason = "oom"
            lines.append("Kubernetes: OOMKilled: the container went past its memory limit")
        elif deadline:
            reason = "timeout"
            lines.append("Kubernetes: Job DeadlineExceeded: activeDeadlineSeconds passed")
        return JobStatus(phase=JobPhase.ENDED, exit_code=code, signal=signal, started_at=started,
                         ended_at=_ended(terminated, now, started, seen.submitted_at), timed_out=deadline,
                         cancelled=seen.cancelled,
                         reason=None if seen.cancelled else reason, evidence=(*lines, *said), placement=where)
    failed = job_conditions.get("Failed")
    held = (job_conditions.get("Suspended") or {}).get("status") == "True"  # a queue took it back: below
    if pod is None and seen.pod_was_seen and job is not None and not seen.cancelled and not held \
            and (failed or {}).get("reason") != "DeadlineExceeded":
        # Gone without a last status (the Job may count it failed): deleted with its node.
        return _lost(seen, started, where, ["Kubernetes: the attempt's pod is gone without an exit status while "
                                            "its Job stands (its node was removed with it)"
                                            + (f"; Job {failed.get('reason')}" if failed else ""), *said])
    if failed is not None and failed.get("status") == "True":
        timed_out = failed.get("reason") == "DeadlineExceeded"
        if pod is not None and (state.get("running") or pod_status.get("phase") == "Running"):
            # The Job controller deletes its pod: the command has its grace; the end comes with the pod's.
            return JobStatus(phase=JobPhase.RUNNING, started_at=started, cancelled=seen.cancelled, placement=where,
                             evidence=(f"Kubernetes: Job failed, reason {failed.get('reason')}; its pod is stopping",))
        return JobStatus(phase=JobPhase.ENDED, started_at=started, ended_at=parse_time(failed.get("lastTransitionTime")) or now,
                         timed_out=timed_out, cancelled=seen.cancelled,
                         reason=None if seen.cancelled else ("timeout" if timed_out else None),
                         never_started=started is None,
                         evidence=(f"Kubernetes: Job failed, reason {failed.get('reason')}: {failed.get('message')}",
                                   *said), placement=where)
    suspended = job_conditions.get("Suspended")
    if suspended is not None and suspended.get("status") == "True":
        if started is not None or seen.pod_was_seen:
            return JobStatus(phase=JobPhase.ENDED, started_at=started, ended_at=now, cancelled=seen.cancelled,
                             reason=None if seen.cancelled else "preempted", placement=where,
                             evidence=(f"Kubernetes: Job suspended after it started ({suspended.get('reason')}: "
                                       f"{suspended.get('message')}): a queue such as Kueue preempted it", *said))
        return JobStatus(phase=JobPhase.QUEUED, placement=where, cancelled=seen.cancelled,
                         evidence=(f"Kubernetes: Job suspended, held by a queue ({suspended.get('reason')})",))
    if job is None and pod is not None:
        # Deleted (a cancel, or by hand) while its pod stops: the pod's last lines are still to be read.
        return JobStatus(phase=JobPhase.RUNNING, started_at=started, cancelled=seen.cancelled, placement=where,
                         evidence=("Kubernetes: the Job is deleted; its pod is stopping (SIGTERM, then SIGKILL after "
                                   "the grace)",))
    if job is None or (pod is None and seen.pod_was_seen):
        if seen.cancelled:
            if not seen.pod_was_seen and started is None:
                return JobStatus(phase=JobPhase.ENDED, ended_at=now, cancelled=True, never_started=True,
                                 placement=where, evidence=("Kubernetes: the attempt's Job was deleted by trackway's "
                                                            "cancel before any pod of it ran",))
            return JobStatus(phase=JobPhase.ENDED, started_at=started, ended_at=now, cancelled=True, signal=15,
                             placement=where, evidence=("Kubernetes: the attempt's Job and pod were deleted by "
                                                        "trackway's cancel (SIGTERM, then SIGKILL after the grace)",))
        if job is None:
            return JobStatus(phase=JobPhase.VANISHED, placement=where, evidence=(
                "Kubernetes: the attempt's Job is gone (deleted outside trackway) and left no exit status",))
        return _lost(seen, started, where, ["Kubernetes: the attempt's pod is gone without an exit status while "
                                            "its Job stands (its node was removed with it)", *said])
    waiting = state.get("waiting") or {}
    waited = (now - seen.submitted_at).total_seconds() if seen.submitted_at else 0.0
    if waiting.get("reason") in WAITING_AT_ONCE or (waiting.get("reason") in WAITING_CONFIG and waited >= seen.pending_s):
        return _never(seen, now, where, f"Kubernetes: container waiting, {waiting.get('reason')}: "
                                        f"{waiting.get('message') or '(no message)'}", said, waited)
    scheduled = conditions.get("PodScheduled")
    if scheduled is not None and scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable" \
            and waited >= seen.pending_s:
        return _never(seen, now, where, f"Kubernetes: pod Unschedulable: {scheduled.get('message')}", said, waited)
    if pod_status.get("phase") == "Running" or state.get("running"):
        return JobStatus(phase=JobPhase.RUNNING, started_at=started, cancelled=seen.cancelled, placement=where)
    if pod_status.get("phase") == "Succeeded":
        return JobStatus(phase=JobPhase.ENDED, exit_code=0, started_at=started, ended_at=now, placement=where,
                         cancelled=seen.cancelled, evidence=("Kubernetes: pod Succeeded",))
    why = waiting.get("reason") or (scheduled or {}).get("reason") or ("no pod yet" if pod is None else "Pending")
    message = waiting.get("message") or (scheduled or {}).get("message")
    return JobStatus(phase=JobPhase.QUEUED, placement=where, cancelled=seen.cancelled,
                     evidence=(f"Kubernetes: waiting: {why}" + (f": {message}" if message else ""), *said))


def _exit(terminated: dict) -> tuple[int | None, int | None]:
    code = terminated.get("exitCode")
    if code is not None and 128 < code < 128 + 65:
        return None, code - 128
    return code, None


def _ended(terminated: dict | None, now: datetime, *starts: datetime | None) -> datetime:
    """When the container ended: the API says it in whole seconds, so never before the attempt's start."""
    ended = parse_time((terminated or {}).get("finishedAt")) or now
    return max([ended, *(start for start in starts if start is not None)])


def _lost(seen: Seen, started: datetime | None, where: dict, lines: list[str]) -> JobStatus:
    why = "the resource is preemptible: a reclaimed node" if seen.lost_reason == "preempted" else \
        "the resource is not preemptible: an infrastructure failure"
    return JobStatus(phase=JobPhase.VANISHED, started_at=started, ended_at=datetime.now(timezone.utc),
                     cancelled=seen.cancelled, reason=None if seen.cancelled else seen.lost_reason,
                     evidence=(*lines, f"node lost: ended as {seen.lost_reason} ({why})"),
                     placement={**where, "node_lost": True})


def _never(seen: Seen, now: datetime, where: dict, line: str, said: list[str], waited: float) -> JobStatus:
    return JobStatus(phase=JobPhase.ENDED, ended_at=now, cancelled=seen.cancelled, never_started=True,
                     reason=None if seen.cancelled else "config_error", placement=where,
                     evidence=(line, *said, f"Kubernetes: the pod never started in {waited:.0f} s (the resource's "
                                            f"pending_seconds: {seen.pending_s:g})"))
