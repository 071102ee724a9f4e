"""The ledger's tables, in SQLAlchemy Core: blobs, runs and attempts.

The migrations under `migrations/versions` create exactly these; `tests/ledger/test_schema.py`
fails when the two drift apart.
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    Index,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.types import TypeDecorator

metadata = MetaData()


class UTCDateTime(TypeDecorator):
    """Timestamps in UTC: `timestamptz` on PostgreSQL, naive-UTC text on SQLite.

    Naive UTC on SQLite keeps `started_at >= datetime('now', '-7 days')` a correct
    comparison, which is what `trackway sql` transpiles `now() - interval '7 days'` into.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        value = value.astimezone(timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


blobs = Table(
    "blobs",
    metadata,
    Column("sha256", String(64), primary_key=True),
    Column("kind", String(32), nullable=False),
    Column("size", Integer, nullable=False),
    Column("compression", String(16), nullable=False),
    Column("content", LargeBinary, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
)

runs = Table(
    "runs",
    metadata,
    Column("run_id", String(32), primary_key=True),
    Column("name", String(200), unique=True),
    Column("project", String(200), nullable=False),
    Column("model_family", String(200), index=True),  # the seed query's filter (0013)
    Column("kind", String(16), nullable=False),
    Column("state", String(16), nullable=False, index=True),  # every tick asks for queued runs
    Column("command", Text, nullable=False),  # JSON list of argv
    Column("workdir", Text, nullable=False),
    Column("resource", String(200), nullable=False),
    Column("executor", String(32), nullable=False),
    Column("gpus", Integer, nullable=False),
    Column("time_limit_s", Float),
    Column("config_sha256", String(64), ForeignKey("blobs.sha256")),
    Column("data_manifest_sha256", String(64), ForeignKey("blobs.sha256")),
    Column("data_paths", Text),  # JSON list of the --data paths made absolute as given (resolved again per attempt)
    Column("code_repo", Text),
    Column("code_branch", String(400)),
    Column("code_commit", String(64)),
    Column("code_dirty_sha256", String(64), ForeignKey("blobs.sha256")),
    Column("termination_reason", String(32)),
    Column("created_at", UTCDateTime, nullable=False, index=True),
    Column("ended_at", UTCDateTime),
    Column("retry_policy", Text),  # the run's own --retry-policy (TOML), over trackway.toml's [retry]
    Column("not_before", UTCDateTime),  # a queued retry waits until then (backoff)
    Column("env", Text),  # JSON object: extra environment for every attempt (an evaluation's TRACKWAY_EVAL_*)
    # The submitter's environment variables (receipts/submitted_env.py): every attempt gets them.
    Column("environ_sha256", String(64), ForeignKey("blobs.sha256")),
    # Scripts without the SDK (supervisor/log_metrics.py, supervisor/outside_checkpoints.py):
    Column("log_patterns", Text),  # JSON list of regexes read from output.log; group `step` is the step
    Column("checkpoint_paths", Text),  # JSON list of globs (relative to workdir) committed as checkpoints
    # What the submitter asked for: a resource's name or "auto" (NULL before 0008: `resource`).
    Column("resource_request", String(200)),
    Column("gpu_memory_min_gb", Float),  # submit --gpu-memory-min
    # An fsspec URL the run's checkpoints are uploaded to and resumed from (0009); NULL: under the home.
    Column("checkpoint_root", Text),
    # The memory preflight at submit (resources/preflight.py, 0012): JSON with the estimate and each verdict.
    Column("preflight", Text),
    # The nodes the run spans, submit --nodes (0018_run_nodes); NULL before: one node.
    Column("nodes", Integer),
    # The run's own acceptance criteria, submit --expect (0021): a JSON list of texts, and each one's
    # verdict as last judged (experiments/expectations.py); open while one of them can still change.
    Column("expect", Text),
    Column("expect_verdict", Text),
    Column("expect_judged_at", UTCDateTime),
    Column("expect_open", Boolean, index=True),
    # A resource the run prefers (the API's prefer_resource, 0021): ranked first when it can take the run.
    Column("resource_preferred", String(200)),
    # The run's own watcher thresholds, submit --watch (0025): JSON {kind: {key: value}} over [watchers].
    Column("watchers", Text),
    # Who submitted the run, as started_by says it (0026), and a person's approval an agent's settings asked
    # for: NULL (none needed), awaiting (nothing started), approved or refused, with who, when and why.
    Column("submitted_by", Text),
    Column("approval", String(16), index=True),
    Column("approval_note", Text),
    Column("approval_at", UTCDateTime),
)

attempts = Table(
    "attempts",
    metadata,
    Column("attempt_id", String(48), primary_key=True),  # "<run_id>/<attempt_number>"
    Column("run_id", String(32), ForeignKey("runs.run_id"), nullable=False, index=True),
    Column("attempt_number", Integer, nullable=False),
    Column("state", String(16), nullable=False, index=True),
    Column("executor", String(32), nullable=False),
    Column("executor_job_id", String(200)),
    Column("state_dir", Text, nullable=False),
    Column("log_path", Text, nullable=False),
    Column("host", String(255)),
    Column("gpu_ids", String(200)),
    Column("gpu_model", String(200)),
    Column("gpu_count", Integer, nullable=False, default=0),
    Column("config_sha256", String(64)),
    Column("data_manifest_sha256", String(64)),
    Column("environment_sha256", String(64), ForeignKey("blobs.sha256")),
    Column("code_commit", String(64)),
    Column("code_dirty_sha256", String(64)),
    Column("resumed_from_checkpoint", Text),
    Column("first_step", Integer),
    Column("last_step", Integer),
    Column("checkpoints_committed", Integer),
    Column("started_at", UTCDateTime, index=True),
    Column("ended_at", UTCDateTime),
    Column("last_heartbeat_at", UTCDateTime),
    Column("gpu_seconds", Float),
    Column("useful_gpu_seconds", Float),
    Column("wasted_gpu_seconds", Float),
    Column("cost_usd", Float),
    Column("exit_code", Integer),
    Column("signal", Integer),
    Column("termination_reason", String(32), index=True),
    Column("termination_evidence", Text),  # JSON: {"rule": ..., "lines": [...], ...}
    Column("retry_decision", Text),  # JSON: {"action", "rule", "message", "delay_s"}
    Column("memory_fingerprint", String(64)),  # what an OOM retry must change (supervisor/policy.py)
    Column("environ_sha256", String(64), ForeignKey("blobs.sha256")),  # the variables this attempt was given
    # Who started it, in one line: "trackway submit (ana@gpu3)", "supervisor: preempted: resume (1 of 10)".
    Column("started_by", Text),
    # Where it was sent and why (resources/selection.py); NULL before 0008: the run's resource.
    Column("resource", String(200)),
    Column("qos", String(200)),
    Column("selection", Text),  # JSON: {"chosen", "qos", "reasons": [...], "skipped": [{"resource", "reason"}]}
    # The code each attempt was given when it launched (0014; NULL before: the run's, from its submit).
    Column("workdir", Text),  # where the command ran: the run's work tree, or the attempt's rebuilt workspace
    Column("code_branch", String(400)),
    Column("code_capture", Text),  # JSON: how the code was taken (supervisor/launch.py's code capture)
    UniqueConstraint("run_id", "attempt_number", name="uq_attempts_run_number"),
)

# -- what training processes said (ingested from attempt spools) -----------------------------

metric_series = Table(
    "metric_series",
    metadata,
    Column("series_id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(32), ForeignKey("runs.run_id"), nullable=False),
    Column("key", String(200), nullable=False),
    # The process (torch.distributed rank) that logged it: each rank's values are its own series (0017).
    Column("rank", Integer, nullable=False, server_default="0"),
    UniqueConstraint("run_id", "key", "rank", name="uq_metric_series_run_key_rank"),
)

# One point per (series, step): the step axis is the run's, continuous across attempts. A
# resumed attempt that redoes steps after the last checkpoint overwrites them (its values are
# the ones the surviving lineage computed); `attempt_number` says which attempt wrote each.
metric_points = Table(
    "metric_points",
    metadata,
    Column("series_id", Integer, primary_key=True, autoincrement=False),
    Column("step", BigInteger, primary_key=True, autoincrement=False),
    Column("value", Float),
    Column("attempt_number", Integer, nullable=False),
    Column("logged_at", Float, nullable=False),  # unix seconds: cheap to ingest at 500k points/s
    sqlite_with_rowid=False,
)

# Per series, the lowest and highest value of each block of `width` steps: what a chart of millions of
# points reads (ledger/rollups.py). Kept rows equal their points: writing points drops the rows after them.
metric_rollups = Table(
    "metric_rollups",
    metadata,
    Column("series_id", Integer, primary_key=True, autoincrement=False),
    Column("width", Integer, primary_key=True, autoincrement=False),
    Column("bucket", BigInteger, primary_key=True, autoincrement=False),
    Column("first_step", BigInteger),
    Column("last_step", BigInteger),
    Column("first_value", Float),
    Column("last_value", Float),
    Column("min_value", Float),
    Column("max_value", Float),
    Column("points", Integer, nullable=False),
    sqlite_with_rowid=False,
)

attempt_events = Table(
    "attempt_events",
    metadata,
    Column("attempt_id", String(48), ForeignKey("attempts.attempt_id"), primary_key=True),
    Column("rank", Integer, primary_key=True, autoincrement=False),
    Column("seq", Integer, primary_key=True, autoincrement=False),
    Column("kind", String(64), nullable=False),
    Column("at", UTCDateTime, nullable=False),
    Column("payload", Text, nullable=False),
)

spool_cursors = Table(
    "spool_cursors",
    metadata,
    Column("attempt_id", String(48), ForeignKey("attempts.attempt_id"), primary_key=True),
    Column("file", String(200), primary_key=True),
    Column("byte_offset", BigInteger, nullable=False),
)

# The ledger's mirror of checkpoint storage (which is the truth; see checkpoints/layout.py).
checkpoints = Table(
    "checkpoints",
    metadata,
    Column("run_id", String(32), ForeignKey("runs.run_id"), primary_key=True),
    Column("step", BigInteger, primary_key=True, autoincrement=False),
    Column("name", String(64), nullable=False),
    Column("state", String(16), nullable=False),
    Column("path", Text, nullable=False),
    Column("size_bytes", BigInteger),
    Column("attempt_id", String(48)),
    Column("parent", String(64)),
    Column("metrics", Text),
    Column("committed_at", UTCDateTime),
    Column("updated_at", UTCDateTime, nullable=False),
)


# -- evaluations: an evaluator run against one committed checkpoint, with pinned versions ------

# The eval specs a training run was submitted with (`submit --eval`); the supervisor triggers them
# on each committed checkpoint. `considered_step` is the newest step already looked at.
run_eval_specs = Table(
    "run_eval_specs",
    metadata,
    Column("run_id", String(32), ForeignKey("runs.run_id"), primary_key=True),
    Column("name", String(64), primary_key=True),
    Column("spec_sha256", String(64), ForeignKey("blobs.sha256"), nullable=False),
    Column("trigger", String(32), nullable=False),
    Column("considered_step", BigInteger),
    Column("created_at", UTCDateTime, nullable=False),
)

evaluations = Table(
    "evaluations",
    metadata,
    Column("eval_id", String(32), primary_key=True),
    Column("run_id", String(32), ForeignKey("runs.run_id"), nullable=False, index=True),  # the training run
    Column("checkpoint_step", BigInteger, nullable=False),
    Column("checkpoint_name", String(64), nullable=False),
    Column("checkpoint_path", Text, nullable=False),
    Column("checkpoint_manifest_sha256", String(64), nullable=False),
    Column("spec_name", String(64), nullable=False),
    Column("spec_sha256", String(64), ForeignKey("blobs.sha256"), nullable=False),
    Column("evaluator_version", String(200), nullable=False),
    Column("task_set_sha256", String(80), nullable=False),
    Column("decoding", Text, nullable=False),  # JSON
    Column("primary_metric", String(32), nullable=False),  # the spec's first metric: what "best" ranks by
    Column("eval_key", String(64), nullable=False, unique=True),  # same checkpoint + versions + decoding: a repeat
    Column("trigger", String(32), nullable=False),
    Column("state", String(16), nullable=False, index=True),
    Column("escalation", Text),  # JSON: the condition, the value it was judged on, and what followed
    Column("created_at", UTCDateTime, nullable=False),
    Column("ended_at", UTCDateTime),
    # Two phases: the generation's own identity (a rescore reuses outputs of the same key); the judge pinned (JSON).
    Column("inference_key", String(64), index=True),
    Column("judge", Text),
)

evaluation_seeds = Table(
    "evaluation_seeds",
    metadata,
    Column("eval_id", String(32), ForeignKey("evaluations.eval_id"), primary_key=True),
    Column("seed", BigInteger, primary_key=True, autoincrement=False),
    Column("eval_run_id", String(32), ForeignKey("runs.run_id"), nullable=False, unique=True),
    Column("state", String(16), nullable=False),
    Column("samples", Integer),
    Column("tasks", Integer),
    Column("outputs_sha256", String(64), ForeignKey("blobs.sha256")),  # the raw JSONL, compressed
    Column("failures", Text),  # JSON: a few failed samples to read
    Column("termination_reason", String(32)),
    Column("created_at", UTCDateTime, nullable=False),
    Column("ended_at", UTCDateTime),
    # Two phases: eval_run_id is the run scoring the seed once its inference run committed its outputs here.
    Column("inference_run_id", String(32), ForeignKey("runs.run_id", name="fk_evaluation_seeds_inference_run_id_runs"),
           index=True),
    Column("inference_outputs", Text),  # the committed outputs' directory (a checkpoint, with its manifest)
    Column("inference_manifest_sha256", String(64)),
    Column("judge_answers_sha256", String(64),
           ForeignKey("blobs.sha256", name="fk_evaluation_seeds_judge_answers_sha256_blobs")),  # every judge answer
)

eval_task_results = Table(
    "eval_task_results",
    metadata,
    Column("eval_id", String(32), ForeignKey("evaluations.eval_id"), primary_key=True),
    Column("seed", BigInteger, primary_key=True, autoincrement=False),
    Column("task_id", String(200), primary_key=True),
    Column("samples", Integer, nullable=False),
    Column("correct", Integer, nullable=False),
)

eval_seed_metrics = Table(
    "eval_seed_metrics",
    metadata,
    Column("eval_id", String(32), ForeignKey("evaluations.eval_id"), primary_key=True),
    Column("seed", BigInteger, primary_key=True, autoincrement=False),
    Column("metric", String(32), primary_key=True),
    Column("value", Float, nullable=False),
)

# Seeds aggregated per metric; rewritten whenever a seed of the evaluation completes.
eval_metrics = Table(
    "eval_metrics",
    metadata,
    Column("eval_id", String(32), ForeignKey("evaluations.eval_id"), primary_key=True),
    Column("metric", String(32), primary_key=True),
    Column("mean", Float, nullable=False),
    Column("std", Float, nullable=False),
    Column("min", Float, nullable=False),
    Column("max", Float, nullable=False),
    Column("seeds", Integer, nullable=False),
)


# -- experiments: a hypothesis under test (experiments/) ------------------------------------------

experiments = Table(
    "experiments",
    metadata,
    Column("experiment_id", String(32), primary_key=True),
    Column("name", String(200), unique=True),
    Column("project", String(200), nullable=False),
    Column("title", Text, nullable=False),
    Column("hypothesis", Text, nullable=False),
    Column("baseline_run_id", String(32), ForeignKey("runs.run_id"), nullable=False),
    Column("parent_experiment_id", String(32)),  # `experiment new --from`: the iteration before
    Column("command", Text, nullable=False),  # JSON list of argv
    Column("workdir", Text, nullable=False),
    Column("config_sha256", String(64), ForeignKey("blobs.sha256")),  # the baseline's config with the changes
    Column("overrides", Text, nullable=False),  # JSON list: the --set as given
    Column("changes", Text, nullable=False),  # JSON list of {key, before, after}: the diff against the baseline
    Column("allow_multiple_changes", Boolean, nullable=False),
    Column("criteria", Text, nullable=False),  # JSON list of criterion texts (experiments/criteria.py)
    Column("eval_specs", Text),  # JSON list of {name, spec_sha256, trigger} attached to the full run
    Column("data_paths", Text),  # JSON list of paths hashed into each run's manifest
    Column("gpus", Integer, nullable=False),
    Column("time_limit_s", Float),  # the full run's
    Column("resource_request", String(200)),
    Column("status", String(16), nullable=False, index=True),
    Column("stop_reason", Text),
    Column("skip_test", Boolean),
    Column("test_plan", Text),  # JSON: max_steps, time limit, thresholds, budget (experiment start)
    Column("test_run_id", String(32), ForeignKey("runs.run_id")),
    Column("full_run_id", String(32), ForeignKey("runs.run_id")),
    Column("test_checks", Text),  # JSON list of {check, passed, detail}
    Column("estimate", Text),  # JSON: the full run's GPU-hours estimated from the test run
    Column("verdict", String(16)),
    Column("verdict_detail", Text),  # JSON: each criterion's outcome with the numbers
    Column("created_at", UTCDateTime, nullable=False),
    Column("started_at", UTCDateTime),
    Column("concluded_at", UTCDateTime),
    Column("updated_at", UTCDateTime, nullable=False),
    # The batch it belongs to (experiment batch, 0027); NULL: an experiment of its own.
    Column("batch_id", String(32), index=True),
)


# -- experiment batches: hypotheses against one baseline, a shared budget (experiments/batch.py, 0027) ----------

experiment_batches = Table(
    "experiment_batches",
    metadata,
    Column("batch_id", String(32), primary_key=True),
    Column("name", String(200), unique=True),
    Column("baseline_run_id", String(32), ForeignKey("runs.run_id"), nullable=False),
    Column("budget_gpu_hours", Float),  # shared by its experiments; NULL: none
    Column("max_running", Integer, nullable=False),  # its experiments in flight at once
    Column("plan", Text, nullable=False),  # JSON: the test plan each member is started with
    Column("status", String(16), nullable=False, index=True),  # running (starting members), done
    Column("note", Text),  # why it stopped starting members, when it did before all ran
    Column("created_at", UTCDateTime, nullable=False),
    Column("concluded_at", UTCDateTime),
)


# -- notifications: what needs a person, sent once (reports/notify.py) ------------------------------

notifications = Table(
    "notifications",
    metadata,
    Column("key", String(200), primary_key=True),  # "attempt_ended:r.../2": the same happening is told once
    Column("kind", String(32), nullable=False),
    Column("run_id", String(32)),
    Column("title", Text, nullable=False),
    Column("body", Text, nullable=False),
    Column("state", String(16), nullable=False, index=True),  # pending, sending, sent, failed
    Column("tries", Integer, nullable=False),
    Column("last_error", Text),
    Column("created_at", UTCDateTime, nullable=False),
    Column("claimed_at", UTCDateTime),  # the last claim: a pending row is tried again a while after it
    Column("sent_at", UTCDateTime),
    Column("claimed_by", String(200)),  # "host pid start-time" of the sender holding it (reports/outbox.py)
    Column("lease_until", UTCDateTime),  # another host's claim is taken over past this; its sender renews it
)

# Each destination's delivery of a message, so a retry goes only to those that did not take it. A
# destination is named by its scheme and a hash of its URL: apprise URLs hold tokens and passwords.
notification_deliveries = Table(
    "notification_deliveries",
    metadata,
    Column("key", String(200), ForeignKey("notifications.key"), primary_key=True),
    Column("destination", String(64), primary_key=True),  # "json:3f9a0c1b2d4e5f60"
    Column("state", String(16), nullable=False),  # pending (tried, will be again), sent, failed
    Column("tries", Integer, nullable=False),
    Column("idempotency_key", String(200), nullable=False),  # sent with it (an Idempotency-Key header to webhooks)
    Column("last_error", Text),
    Column("tried_at", UTCDateTime),
    Column("sent_at", UTCDateTime),
)


# -- memory calibrations: measured peaks against the preflight's estimate (resources/calibration.py) --------

memory_calibrations = Table(
    "memory_calibrations",
    metadata,
    Column("calibration_id", Integer, primary_key=True, autoincrement=True),
    Column("model_family", String(200), nullable=False),
    Column("precision", String(32), nullable=False),
    Column("factor", Float, nullable=False),  # measured reserved / estimate without the context
    Column("run_id", String(32), nullable=False),
    Column("estimated_bytes", Float, nullable=False),  # uncorrected, without the context
    Column("measured_allocated_bytes", BigInteger),
    Column("measured_reserved_bytes", BigInteger, nullable=False),
    Column("row_length", Integer),  # the padded length the estimate was taken at
    Column("created_at", UTCDateTime, nullable=False),
    Index("ix_memory_calibrations_family", "model_family", "precision"),
)


# -- API tokens: who may call `trackway serve`, and as what (ledger/tokens.py) -----------------------

api_tokens = Table(
    "api_tokens",
    metadata,
    Column("name", String(64), primary_key=True),  # what `started_by` records for what the token started
    Column("role", String(16), nullable=False),  # read, submit or admin
    Column("token_sha256", String(64), nullable=False, unique=True),  # the token itself is never stored
    Column("created_at", UTCDateTime, nullable=False),
    Column("created_by", Text),
    Column("revoked_at", UTCDateTime),
)
