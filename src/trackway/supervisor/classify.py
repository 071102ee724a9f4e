"""Why an attempt ended: a pure function from evidence to one termination reason, with the lines that decided it.

Evidence is weighed most trusted first:

    1. what the executor knows for certain     (Slurm NODE_FAIL / PREEMPTED / TIMEOUT, a job cancelled
                                                by someone else, a host lost): the scheduler ended the
                                                job, and what the script said while it was being ended
                                                (the SDK's "preempted" note on the SIGTERM) follows from that
    2. the attempt's own note from the SDK     ("oom: CUDA out of memory at step 11")
    3. what trackway itself did                 (time limit hit, a watcher's stop, cancelled)
    4. the executor's state                     (as Kubernetes spells it: pod evicted, OOMKilled)
    5. a clean exit                             (exit 0)
    6. patterns in the log tail                 (CUDA out of memory, NCCL timeout, Traceback ...)
    7. signal and exit code alone               (SIGTERM from outside, exit 127, SIGKILL)
    8. nothing matched                          -> unknown, with the evidence kept

A collective or network error (NCCL, gloo, a reset socket) reads the same with and without the
SDK: its exception is a RuntimeError the SDK would note as a code error, so a note whose message
names one is `infra_transient`, as the same line in the log of a plain script is.

Under torchrun, a rank's note speaks for that rank only: when torchrun's summary names a rank
killed by a signal as the first failure, the survivors' notes and collective errors (a gloo
socket closed, the agent's SIGTERM) are consequences, and the kill decides.

An evaluation attempt that failed for a reason of its own (a crash, a broken output, an OOM, a
stall) is an `evaluator_crash`, whatever rule saw it first; that rule is kept in the evidence
(`evaluator:log:traceback`). Endings from outside the evaluator (preempted, time limit, cancel)
and a command that cannot start at all (config_error) keep their own reasons. In a two-phase
evaluation, a scoring attempt whose judge could not be reached (`JudgeUnreachable`, `judge
unreachable` in its log or note) is `infra_transient` (`scoring:judge-unreachable`), and an
inference attempt that exited 0 without outputs is an `evaluator_crash` (`inference:no-outputs`).

The supervisor issue grows rules here; nothing else in trackway decides a reason.
"""

from __future__ import annotations

import json
import re
import signal as signals
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from trackway.regex_prefilter import Prefilter, fold
from trackway.redaction import redact
from trackway.taxonomy import CONFIG_EXCEPTIONS, CONFIG_MESSAGE_PATTERN
from trackway.taxonomy import TerminationReason as R

MAX_EVIDENCE_LINES = 8

# Executor states as Slurm and Kubernetes spell them.
EXECUTOR_STATES: dict[str, R] = {
    "PREEMPTED": R.PREEMPTED,
    "EVICTED": R.PREEMPTED,
    "SPOT_RECLAIMED": R.PREEMPTED,
    "TIMEOUT": R.TIMEOUT,
    "DEADLINE": R.TIMEOUT,
    "OUT_OF_MEMORY": R.OOM,
    "OOMKILLED": R.OOM,
    "NODE_FAIL": R.INFRA_TRANSIENT,
    "BOOT_FAIL": R.INFRA_TRANSIENT,
    "LOST": R.INFRA_TRANSIENT,
}


# What an attempt the supervisor ended for a watcher's finding counts as. A stall (of the attempt
# or of one rank) is `stalled`, a non-finite loss a log pattern read (scripts without the SDK) the
# divergence `nan_loss` names. Every other watcher saw a trend, not an ending of its own: a loss
# rising is not yet NaN, growing memory not yet out of it, so they end as `watcher_stop`, the
# evidence naming the watcher, its numbers and its rule.
WATCHER_REASONS: dict[str, R] = {
    "stalled": R.STALLED,
    "rank_stalled": R.STALLED,
    "nan_in_log": R.NAN_LOSS,
}


@dataclass(frozen=True)
class LogRule:
    name: str
    reason: R
    pattern: re.Pattern[str]
    only_before_progress: bool = False
    # Asked first: a tail of 200 lines costs a pattern about a millisecond to search, its prefilter microseconds.
    prefilter: Prefilter = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefilter", Prefilter(self.pattern))

    def hits(self, lines: Sequence[str], folded: Sequence[str], whole: str) -> list[str]:
        """The lines this rule matches; `folded`: each line folded (regex_prefilter.fold), `whole`: them all, joined."""
        if not self.prefilter.may_match(whole):
            return []
        may_match, search = self.prefilter.may_match, self.pattern.search
        return [line for line, text in zip(lines, folded) if may_match(text) and search(line)]


def _rule(name: str, reason: R, pattern: str, *, only_before_progress: bool = False) -> LogRule:
    return LogRule(name, reason, re.compile(pattern, re.IGNORECASE), only_before_progress)


# Order matters: the first rule with a matching line wins, so specific rules precede generic ones.
# A full disk, however the failing layer spelled it: Python's OSError, C's errno name, tools' own words.
DISK_FULL_PATTERN = r"No space left on device|\[Errno 28\]|\bENOSPC\b|\bdisk full\b"

# torch's `name: EADDRINUSE, message: address already in use`, Python's `[Errno 98] Address already in use`.
PORT_IN_USE_PATTERN = r"\bEADDRINUSE\b|Address already in use|\[Errno 98\]"

LOG_RULES: tuple[LogRule, ...] = (
    _rule("log:cuda-oom", R.OOM, r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|HIP out of memory"),
    _rule("log:host-oom", R.OOM, r"Out of memory: Killed process|oom-kill|MemoryError\b"),
    # Before the traceback rule: the OSError that ends a save on a full disk is no code error.
    _rule("log:disk-full", R.INFRA_TRANSIENT, DISK_FULL_PATTERN),
    _rule("log:non-finite-loss", R.NAN_LOSS, r"\b(loss|grad[_ ]norm)\b[^\n]*\b(nan|inf)\b|non-finite (loss|grad)"),
    # A rendezvous (or any server) port another process held: a second job on this machine or an earlier
    # attempt's leftover. Not the code's fault, and a later try may find it free.
    _rule("log:port-in-use", R.INFRA_TRANSIENT, PORT_IN_USE_PATTERN),
    _rule(
        "log:network-or-io",
        R.INFRA_TRANSIENT,
        r"NCCL (error|timeout|WARN.*timeout)|Watchdog caught collective operation timeout|"
        r"Connection reset by peer|Socket Timeout|socket timed out|Input/output error|"
        r"ECONNRESET|Broken pipe|Stale file handle|RendezvousTimeoutError",
    ),
    _rule(
        "log:bad-data",
        R.BAD_DATA,
        r"\bBadData\b|UnicodeDecodeError|JSONDecodeError|ParserError|"
        r"schema (mismatch|error)|manifest hash mismatch|corrupt(ed)? (record|file|shard)",
    ),
    _rule(
        "log:start-up-error",
        R.CONFIG_ERROR,
        r"\b(ModuleNotFoundError|ImportError|FileNotFoundError|NotADirectoryError|PermissionError)\b|"
        r"error: (unrecognized|the following) arguments|error: argument |usage: ",
        only_before_progress=True,
    ),
    # A config the code refuses before its first step (`ValueError: Unknown config key: lrr`).
    _rule(
        "log:config-refused",
        R.CONFIG_ERROR,
        rf"\b({'|'.join(CONFIG_EXCEPTIONS)}): .*?({CONFIG_MESSAGE_PATTERN})",
        only_before_progress=True,
    ),
    _rule("log:traceback", R.CODE_ERROR, r"^(?:\S+ (?:out|err) )?Traceback \(most recent call last\)"),
)


# torchrun (torch.distributed.elastic) ends a failed job with a summary naming the rank that failed
# first: `Root Cause (first observed failure):` then `exitcode  : -9 (pid: 123)  (SIGKILL)`. Older
# versions print only `failed (exitcode: -9) local_rank: 1 (pid: 123) of binary: ...`.
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\)")
_ROOT_EXITCODE = re.compile(r"exitcode\s*:\s*(-?\d+)")
_FAILED_EXITCODE = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: \d+")
# Signals that end a rank from outside it (an operator, a node agent, a reclaimed machine), not a crash of its own.
RANK_KILLERS = frozenset({signals.SIGKILL, signals.SIGTERM, signals.SIGINT, signals.SIGHUP})
# What the surviving ranks say once a peer is gone: a consequence of the first failure, never its cause.
SURVIVOR_RULES = frozenset({"log:network-or-io"})


@dataclass(frozen=True)
class RankFailure:
    """The rank torchrun saw fail first, and its exit code (negative: the signal that ended it)."""

    exitcode: int
    lines: tuple[str, ...]

    @property
    def killer(self) -> signals.Signals | None:
        number = -self.exitcode
        return signals.Signals(number) if number in RANK_KILLERS else None


def torchrun_root_cause(log_tail: Sequence[str]) -> RankFailure | None:
    """The first-failed rank of a torchrun job as its summary in the log names it (None if there is none)."""
    for i in range(len(log_tail) - 1, -1, -1):
        if _ROOT_CAUSE.search(log_tail[i]):
            block = log_tail[i:i + 9]
            for line in block:
                if match := _ROOT_EXITCODE.search(line):
                    shown = tuple(line for line in block if re.search(r"\b(rank|exitcode|traceback)\s*:", line))
                    return RankFailure(int(match[1]), (log_tail[i], *shown))
    for line in log_tail:
        if match := _FAILED_EXITCODE.search(line):
            return RankFailure(int(match[1]), (line,))
    return None


def _rank_killed(e: Evidence, rank: RankFailure) -> Classification:
    """A rank ended by a signal from outside: the host's OOM killer if the log says so, a SIGTERM is a
    preemption (as for a whole process), any other kill the infrastructure's doing."""
    oom = [line for line in e.log_tail if _HOST_OOM.search(line)]
    if oom:
        return Classification(R.OOM, "torchrun:rank-killed:host-oom", (*rank.lines, *oom[-2:]))
    reason = R.PREEMPTED if rank.killer is signals.SIGTERM else R.INFRA_TRANSIENT
    said = f"a rank was killed by {rank.killer.name} from outside it; the other ranks' errors followed from that"
    return Classification(reason, f"torchrun:rank-{rank.killer.name}", (said, *rank.lines)[:MAX_EVIDENCE_LINES])


def _survivor_note(note_reason: str | None, rank: RankFailure | None) -> bool:
    """Whether a note only tells what a surviving rank met after torchrun's first failure was a kill.

    Its error on the dead peer's socket, or the SIGTERM the agent sent it to stop (a preempted
    note, unless the first failure was a SIGTERM too: then the whole job was told to stop).
    """
    if rank is None or rank.killer is None:
        return False
    if note_reason == R.PREEMPTED.value:
        return rank.killer is not signals.SIGTERM
    return note_reason in (None, R.CODE_ERROR.value, R.UNKNOWN.value)


@dataclass(frozen=True)
class Evidence:
    """Everything known about how an attempt ended."""

    exit_code: int | None = None
    signal: int | None = None
    timed_out: bool = False
    cancelled: bool = False
    vanished: bool = False
    executor_state: str | None = None
    executor_reason: str | None = None  # a reason the executor knows for certain (JobStatus.reason)
    executor_lines: Sequence[str] = ()
    log_tail: Sequence[str] = ()
    made_progress: bool = False
    sdk_note: Mapping[str, Any] | None = None
    stopped_by: tuple[str, str] | None = None  # (watcher kind, why) when the supervisor ended it
    evaluation: bool = False  # the attempt ran an evaluator (a run of kind eval)
    phase: str | None = None  # a two-phase evaluation's phase the attempt ran (`inference`, `scoring`)
    output_problem: str | None = None  # how an evaluator's output broke the contract, if it did
    unfinished_notice: bool = False  # the SDK recorded a preemption notice and no run.finish() after it
    last_step: int | None = None  # the last step the attempt logged: where a failure happened


@dataclass(frozen=True)
class DiskFull:
    """Where a full disk was met and how much room was left, as far as the evidence says."""

    path: str | None = None
    free_bytes: int | None = None

    def line(self) -> str:
        """The evidence line: `disk full: PATH, N bytes free` (what is unknown is said to be)."""
        where = self.path or "path not reported"
        return f"disk full: {where}" + (f", {self.free_bytes} bytes free" if self.free_bytes is not None else "")

    def as_record(self) -> dict[str, Any]:
        return {"path": self.path, "free_bytes": self.free_bytes}


@dataclass(frozen=True)
class Signature:
    """What makes one failure the same as another: the exception, its message's shape, where it was raised, the step.

    Numbers, addresses and quoted values in the message are blanked to `<n>`, `<hex>` and `<str>`
    (`shape`), so the same error about another tensor size or pid still matches; the file is named
    without its directory, so the same line in two workspaces of the same code matches too.
    """

    exception: str | None
    shape: str
    where: str | None
    step: int | None
    message: str = field(default="", compare=False)  # one failure's message as it was (not part of the match)

    @property
    def key(self) -> str:
        return self.key_with(())

    def key_with(self, known: Sequence[str]) -> str:
        """The key, over the shape as the ledger shows it (`known`: the run's secret values, masked too): a
        digest of a message holding a password would let anyone who reads the ledger test guesses against it."""
        import hashlib

        text = json.dumps([self.exception, redact(self.shape, known), self.where, self.step])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def as_record(self, known: Sequence[str] = ()) -> dict[str, Any]:
        return {"key": self.key_with(known), "exception": self.exception, "shape": self.shape, "where": self.where,
                "step": self.step, "message": self.message}


@dataclass(frozen=True)
class Classification:
    reason: R
    rule: str
    lines: tuple[str, ...] = field(default_factory=tuple)
    disk_full: DiskFull | None = None
    signature: Signature | None = None

    def evidence_json(self, evidence: Evidence, known: Sequence[str] = ()) -> str:
        """`evidence_record` as JSON."""
        return json.dumps(self.evidence_record(evidence, known), ensure_ascii=False)

    def evidence_record(self, evidence: Evidence, known: Sequence[str] = ()) -> dict[str, Any]:
        """The evidence column: the deciding rule and lines, plus the raw facts behind them.

        Not yet redacted (the ledger's records.py does that); `known`: the run's secret values, for the
        signature's key, a digest the redaction cannot reach.
        """
        record: dict[str, Any] = {
            "rule": self.rule,
            "lines": list(self.lines),
            "exit_code": evidence.exit_code,
            "signal": evidence.signal,
            "executor_state": evidence.executor_state,
            "executor": list(evidence.executor_lines),
        }
        if self.disk_full is not None:  # the retry policy reads it: a full disk is never retried blindly
            record["disk_full"] = self.disk_full.as_record()
        if self.signature is not None:  # the retry policy reads it: the same failure again is not retried
            record["signature"] = self.signature.as_record(known)
        return record


# Reasons an evaluation attempt keeps: they say something about its surroundings, not the evaluator.
EVALUATION_KEEPS = frozenset({R.COMPLETED, R.PREEMPTED, R.TIMEOUT, R.USER_CANCELLED, R.CONFIG_ERROR})


def classify(evidence: Evidence) -> Classification:
    """The termination reason for one ended attempt, the rule and lines that decided it, and its failure's signature."""
    verdict = _for_evaluation(evidence, _classify(evidence)) if evidence.evaluation else _classify(evidence)
    if verdict.reason in UNSIGNED or verdict.disk_full is not None:
        return verdict
    return replace(verdict, signature=failure_signature(evidence))


# A judge model (its API, or a local judge's server) that did not answer: the scorer's surroundings, not its code.
# The scorer says so in its log or its SDK note (`JudgeUnreachable: ...`, or `judge unreachable: ...`).
JUDGE_UNREACHABLE_PATTERN = r"\bJudgeUnreachable\b|\bjudge (?:is )?unreachable\b"
_JUDGE_UNREACHABLE = re.compile(JUDGE_UNREACHABLE_PATTERN, re.IGNORECASE)


def _for_evaluation(evidence: Evidence, verdict: Classification) -> Classification:
    if verdict.reason is R.COMPLETED and evidence.output_problem:
        rule = "inference:no-outputs" if evidence.phase == "inference" else "evaluator:bad-output"
        return Classification(R.EVALUATOR_CRASH, rule, (evidence.output_problem,))
    if evidence.phase == "scoring" and verdict.reason not in EVALUATION_KEEPS:
        said = [str((evidence.sdk_note or {}).get("message") or ""), *evidence.log_tail]
        hits = [line for line in said if _JUDGE_UNREACHABLE.search(line)]
        if hits:
            # Only the scoring phase asks a judge: its retry reads the same committed outputs, never generates again.
            return Classification(R.INFRA_TRANSIENT, "scoring:judge-unreachable", tuple(hits[-MAX_EVIDENCE_LINES:]))
    if verdict.reason in EVALUATION_KEEPS or verdict.reason is R.EVALUATOR_CRASH:
        return verdict
    return Classification(R.EVALUATOR_CRASH, f"evaluator:{verdict.rule}", verdict.lines, verdict.disk_full)


# Endings that come from outside the attempt's own code (or are no failure): nothing of theirs repeats.
UNSIGNED = frozenset({R.COMPLETED, R.PREEMPTED, R.TIMEOUT, R.USER_CANCELLED, R.STALLED})
_LOG_PREFIX = re.compile(r"^\S+Z (?:out|err) ")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<func>\S+))?')
_EXCEPTION_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Fault|Failure|Lost))"
                             r"(?::\s?(?P<message>.*))?$")
_BLANKS = (
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<hex>"),
    (re.compile(r"'[^']*'|\"[^\"]*\""), "<str>"),
    (re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)*(?:e[-+]?\d+)?\b"), "<n>"),
)


def failure_signature(e: Evidence) -> Signature | None:
    """The failure's signature from the SDK's note and the log's last traceback; None when neither says anything."""
    lines = [_LOG_PREFIX.sub("", line) for line in e.log_tail]
    exception = message = where = None
    start = max((i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")), default=None)
    if start is not None:
        block = lines[start + 1:]
        frames = [m for m in map(_FRAME.match, block) if m]
        if frames:
            last = frames[-1]
            where = f"{last['file'].replace(chr(92), '/').rsplit('/', 1)[-1]}:{last['line']}"
            where += f" in {last['func']}" if last["func"] else ""
        found = [m for m in map(_EXCEPTION_LINE.match, block) if m]
        if found:
            exception, message = found[-1]["type"].rsplit(".", 1)[-1], found[-1]["message"] or ""
    note = e.sdk_note or {}
    if note.get("message") and note.get("reason") not in (R.PREEMPTED.value, R.COMPLETED.value):
        text = str(note["message"])
        noted = str(note.get("exception") or "") or None
        if noted and text.startswith(f"{noted}: "):
            text = text[len(noted) + 2:]
        exception, message = noted or exception, text
    if message is None:
        shown = [line for line in lines if line.strip()]
        if not shown and not e.executor_lines:
            return None
        message = (shown or list(e.executor_lines))[-1]
    step = e.last_step
    if step is None and isinstance(note.get("step"), int):
        step = note["step"]
    return Signature(exception=exception, shape=_shape(message), where=where, step=step, message=message[:300])


def _shape(message: str) -> str:
    for pattern, blank in _BLANKS:
        message = pattern.sub(blank, message)
    return " ".join(message.split())[:200]


def _classify(evidence: Evidence) -> Classification:
    e = evidence
    note_reason = e.sdk_note.get("reason") if e.sdk_note else None
    # A "preempted" note only says a SIGTERM arrived; when trackway sent it, trackway knows why.
    sent_by_trackway = bool(e.stopped_by or e.cancelled or e.timed_out)
    if e.executor_reason in R._value2member_map_ and not (e.stopped_by or e.cancelled):
        # The scheduler's own final state: the node failed, someone else cancelled the job, it was
        # preempted. The SIGTERM that came with it is what the SDK's note saw, not the cause.
        said: tuple[str, ...] = ()
        if note_reason and note_reason != e.executor_reason:
            message = str(e.sdk_note.get("message") or "")[:200]
            said = (f"the SDK's note said {note_reason} ({message}); the executor's final state outranks it",)
        lines = (*e.executor_lines[-(MAX_EVIDENCE_LINES - len(said)):], *said)
        return Classification(R(e.executor_reason), f"executor:{e.executor_reason}", lines)
    rank = torchrun_root_cause(e.log_tail)
    # A rank's note speaks for that rank only: torchrun's summary names the one that failed first.
    if _survivor_note(note_reason, rank) and not sent_by_trackway and not e.executor_state:
        if not (e.exit_code == 0 and e.signal is None):
            return _rank_killed(e, rank)
    if note_reason in R._value2member_map_ and not (note_reason == R.PREEMPTED.value and sent_by_trackway):
        message = str(e.sdk_note.get("message") or "")
        if note_reason == R.INFRA_TRANSIENT.value:
            # The note may name only the wrapper ("checkpoint save failed"); the log keeps the ENOSPC under it.
            full = find_disk_full([message, *e.log_tail], context=[message])
            if full is not None:
                hits = [line for line in e.log_tail if _DISK_FULL.search(line)]
                named = message.startswith("disk full:") and not message.startswith("disk full: path not reported")
                said = (message,) if named else (full.line(), message)
                lines = (*said, *hits[-(MAX_EVIDENCE_LINES - len(said)):])
                return Classification(R.INFRA_TRANSIENT, "sdk:note", tuple(line for line in lines if line), full)
        if note_reason in (R.CODE_ERROR.value, R.UNKNOWN.value) and _PORT_IN_USE.search(message):
            return Classification(R.INFRA_TRANSIENT, "sdk:note:port-in-use", (message,))
        if note_reason in (R.CODE_ERROR.value, R.UNKNOWN.value) and _NETWORK.search(message):
            # The exception the SDK saw is a collective's or a socket's: the same ending a plain script's log tells.
            return Classification(R.INFRA_TRANSIENT, "sdk:note:network-or-io", (message,))
        return Classification(R(note_reason), "sdk:note", (message,) if message else ())
    if e.timed_out:  # the executor's own record: the limit was hit, whatever else was under way
        return Classification(R.TIMEOUT, "trackway:time-limit", tuple(e.executor_lines[-MAX_EVIDENCE_LINES:]))
    if e.stopped_by:
        kind, why = e.stopped_by
        reason = WATCHER_REASONS.get(kind, R.WATCHER_STOP)
        return Classification(reason, f"watcher:{kind}", (why,) + tuple(e.executor_lines[-MAX_EVIDENCE_LINES:]))
    if e.cancelled:
        return Classification(R.USER_CANCELLED, "trackway:cancel", tuple(e.executor_lines[-MAX_EVIDENCE_LINES:]))
    if e.executor_state and e.executor_state.upper() in EXECUTOR_STATES:
        state = e.executor_state.upper()
        return Classification(EXECUTOR_STATES[state], f"executor:{state}", tuple(e.executor_lines[-MAX_EVIDENCE_LINES:]))
    if e.exit_code == 0 and e.signal is None and not e.vanished:
        if e.unfinished_notice:
            # A framework's own SIGTERM handling exits 0 with the work cut short (the SDK's note was lost).
            return Classification(R.PREEMPTED, "sdk:notice-without-finish", (
                "exit 0, but the SDK recorded a preemption notice and the script never called run.finish()",))
        return Classification(R.COMPLETED, "exit:0")
    full = find_disk_full(e.executor_lines)
    if full is not None:
        # The executor met a full disk (no room for the exit status, or for the log): whatever the log
        # tail says, a retry there would meet it again at once.
        rule = "executor:vanished:disk-full" if e.vanished else "executor:disk-full"
        return Classification(R.INFRA_TRANSIENT, rule, (full.line(), *e.executor_lines[-(MAX_EVIDENCE_LINES - 1):]),
                              full)
    # A rank that failed first by itself: its own lines decide, not the survivors' lost connections.
    matched = _match_log(e, skip=SURVIVOR_RULES if rank is not None else frozenset())
    if matched is not None:
        return matched
    return _by_signal_and_exit_code(e)


def _match_log(e: Evidence, skip: frozenset[str] = frozenset()) -> Classification | None:
    folded = [fold(line) for line in e.log_tail]
    whole = "\n".join(folded)
    for rule in LOG_RULES:
        if (rule.only_before_progress and e.made_progress) or rule.name in skip:
            continue
        hits = rule.hits(e.log_tail, folded, whole)
        if hits and rule.name == "log:disk-full":
            full = find_disk_full(hits, context=e.log_tail[-1:]) or DiskFull()
            # The last line names what the script raised in the end (a save wrapping the ENOSPC, say).
            lines = [*hits[-(MAX_EVIDENCE_LINES - 2):], *[line for line in e.log_tail[-1:] if line not in hits]]
            return Classification(rule.reason, rule.name, (full.line(), *lines), full)
        if hits:
            if rule.reason is R.CODE_ERROR:
                # The traceback header says little; its last lines name the exception.
                hits = hits[-1:] + [line for line in e.log_tail[-3:] if line not in hits[-1:]]
            return Classification(rule.reason, rule.name, tuple(hits[-MAX_EVIDENCE_LINES:]))
    return None


_DISK_FULL = re.compile(DISK_FULL_PATTERN, re.IGNORECASE)
_HOST_OOM = next(rule.pattern for rule in LOG_RULES if rule.name == "log:host-oom")
_NETWORK = next(rule.pattern for rule in LOG_RULES if rule.name == "log:network-or-io")
_PORT_IN_USE = next(rule.pattern for rule in LOG_RULES if rule.name == "log:port-in-use")
# Where the full disk was met, most specific spelling first: the SDK's own line, Python's OSError
# (`-> 'dest'` for a copy or rename: the destination ran out of room), a quoted path, a bare one.
_DISK_FULL_PATHS = (
    re.compile(r"disk full: (?P<path>(?!path not reported)[^,()]+?)(?:, \d+ bytes free|\s*\(|$)"),
    re.compile(r"No space left on device: '(?P<first>[^']+)'(?: -> '(?P<path>[^']+)')?"),
    re.compile(r"['\"](?P<path>[^'\"\s]*/[^'\"]*)['\"]"),
    re.compile(r"(?:^|[\s=])(?P<path>/[\w./@+-]+)"),
)
_FREE_BYTES = re.compile(r"(?P<n>\d+) bytes? (?:free|available|left)\b", re.IGNORECASE)


def find_disk_full(texts: Sequence[str], context: Sequence[str] = ()) -> DiskFull | None:
    """The full disk the texts speak of, with the path and free bytes of the line that says most (None if none).

    An OSError from `write()` names no file; the exception that wrapped it often does ("saving
    checkpoint to /ckpt/step-5 failed"), so the `context` lines (the final exception) are asked
    for a path when no line about the full disk gave one.
    """
    hits = [text for text in texts if _DISK_FULL.search(text)]
    if not hits:
        return None
    best = DiskFull()
    for text in hits:
        found = DiskFull(_disk_full_path(text), _free_bytes(text))
        if (found.path is not None, found.free_bytes is not None) > (best.path is not None, best.free_bytes is not None):
            best = found
    if best.path is None:
        path = next((p for p in map(_disk_full_path, context) if p), None)
        best = DiskFull(path, best.free_bytes)
    return best


def _disk_full_path(text: str) -> str | None:
    for pattern in _DISK_FULL_PATHS:
        match = pattern.search(text)
        if match:
            groups = match.groupdict()
            return (groups.get("path") or groups.get("first") or "").strip() or None
    return None


def _free_bytes(text: str) -> int | None:
    match = _FREE_BYTES.search(text)
    return int(match["n"]) if match else None


def _by_signal_and_exit_code(e: Evidence) -> Classification:
    tail = tuple(e.log_tail[-3:])
    if e.vanished:
        lines = tuple(e.executor_lines[-MAX_EVIDENCE_LINES:]) + tail
        return Classification(R.INFRA_TRANSIENT, "executor:vanished", lines)
    if e.signal in (signals.SIGTERM, signals.SIGUSR1):
        name = signals.Signals(e.signal).name
        return Classification(R.PREEMPTED, f"signal:{name}", (f"terminated by {name} from outside trackway",) + tail)
    if e.exit_code in (126, 127):
        return Classification(R.CONFIG_ERROR, f"exit:{e.exit_code}", tail or ("command could not be started",))
    if e.signal == signals.SIGKILL or e.exit_code == 137:
        return Classification(R.UNKNOWN, "signal:SIGKILL", ("killed by SIGKILL with no OOM evidence",) + tail)
    if e.signal is not None:
        name = signals.Signals(e.signal).name if e.signal in signals.Signals._value2member_map_ else str(e.signal)
        return Classification(R.UNKNOWN, f"signal:{name}", (f"killed by signal {name}",) + tail)
    return Classification(R.UNKNOWN, f"exit:{e.exit_code}", tail)
