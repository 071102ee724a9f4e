"""Where things live: TRACKWAY_HOME, the ledger URL, and the project's trackway.toml.

Precedence for the ledger URL: `--db` > `TRACKWAY_DB` > `[ledger] url` in trackway.toml >
SQLite at `$TRACKWAY_HOME/ledger.db`. `TRACKWAY_HOME` defaults to `./.trackway`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trackway.errors import InputError
from trackway.settings.resources import Resource, default_local, resource_from

if TYPE_CHECKING:
    from trackway.settings.model import TrackwayToml


CONFIG_FILE_NAME = "trackway.toml"

DEFAULT_TRACKWAY_TOML = """\
# trackway.toml: where trackway keeps its ledger and which resources it may run on.
# Every setting here is optional; these are the embedded defaults.

[ledger]
# SQLite file under $TRACKWAY_HOME by default. For a team, point every member at PostgreSQL:
# url = "postgresql+psycopg://user@db-host:5432/trackway"

[resources.local]
# The machine trackway runs on. Attempts get free GPUs through CUDA_VISIBLE_DEVICES.
executor = "local"
# What one GPU-hour (or, with no GPU, one wall-clock hour) costs here; receipts record cost from it.
cost_per_gpu_hour = 0.0
# Seconds between SIGTERM and SIGKILL when a time limit is hit or a run is cancelled.
grace_seconds = 30
# Also: gpu = "RTX 5090", gpu_memory_gb = 32, gpus_per_node (NVML's count by default),
# preemptible = false, use_for = ["test", "full", "eval"] (the run kinds it takes).

# A Slurm cluster (`trackway resources` shows what each can take now):
# [resources.ailab]
# executor = "slurm"
# gpu = "B200"
# gpu_memory_gb = 180
# gpus_per_node = 8
# cost_per_gpu_hour = 2.5
# partition = "lab"
# account = "ml-group"
# grace_seconds = 60          # USR1 this long before a time limit; the SDK saves and exits
# sbatch = ["--constraint=b200"]
# setup = "module load cuda && source ~/venv/bin/activate"
# [[resources.ailab.qos]]     # the smallest tier whose max_hours covers --time-limit is used
# name = "gpu-short"
# max_hours = 24

# Machines over SSH: a workstation, a shared box, rented spot pods:
# [resources.pods]
# executor = "ssh"
# hosts = ["root@203.0.113.7:22", "root@203.0.113.8"]
# key_file = "~/.ssh/id_ed25519"
# workdir = "/workspace/trackway"
# setup = "source /workspace/venv/bin/activate"
# gpus_per_node = 1
# preemptible = true          # a lost host ends the attempt `preempted` (else `infra_transient`)
# unreachable_seconds = 600   # how long a silent host may come back with the job still running
# forward_env = ["AWS_*"]     # the submitter's variables the host gets
# checkpoint_root = "s3://bucket/checkpoints"   # any resource: checkpoints that outlive the machine

# A Kubernetes namespace: each attempt a batch/v1 Job (docs/guide/kubernetes.md):
# [resources.k8s]
# executor = "kubernetes"
# namespace = "ml-team"
# image = "registry.example.com/train@sha256:..."   # needs sh, tar, base64, awk and your Python stack
# gpus_per_node = 8
# context = "prod"            # kubeconfig context
# pvc = "team-checkpoints"    # checkpoints on a PersistentVolumeClaim (or checkpoint_root = "s3://...")

# [selection]
# With resources declared, `submit` chooses (--resource auto): kind, GPUs, --gpu-memory-min and
# --time-limit filter; then free GPUs now, this order per run kind, and cost rank. The choice and
# every resource passed over are recorded with the reason (`trackway explain`).
# full = ["ailab", "local"]
# test = ["local", "ailab"]

[checkpoints]
# Retention, applied by `trackway gc`. The newest committed checkpoint, the one a running
# attempt resumed from, one an evaluation in flight reads, and the best evaluated checkpoint of
# each run and eval spec are always kept.
keep_last = 2          # at least 2
# keep_evaluated = "all"   # keep every checkpoint an evaluation references (default "best")
# keep_every = 1000    # also keep every checkpoint whose step is a multiple of this
# keep_best = 1        # also keep the best N by a metric recorded at save time
# best_metric = "loss"
# best_mode = "min"
# For a script without the SDK: its own checkpoint file(s), committed and restored by trackway
# (a glob relative to the run's working directory; `submit --checkpoint-path` overrides).
# path = "out/ckpt.pt"

[logs]
# For a script without the SDK: metrics read from its output, one regex per line format; the named
# group `step` is the step (a pattern without one takes the last step another matched), `gpu` a
# device index, every other named group a metric (`submit --metric-pattern` overrides).
# metrics = ['iter (?P<step>\\d+): loss (?P<loss>\\S+)']

[supervisor]
# An attempt whose SDK heartbeat stops, or that logs no new step, for this long is stalled:
# it is ended (SIGTERM, grace, SIGKILL) and retried once.
stall_seconds = 600
# Other watchers only record what they notice; list the ones that should end the attempt too:
# loss_rising, plateau, throughput_falling, memory_growing, gpu_underused (→ watcher_stop, not retried),
# rank_stalled (one rank left behind the others → stalled, retried once).
stop_on = []
# `trackway submit --detach` (and `eval --detach`) start a supervisor in the background when none is
# running; it exits after nothing has been in flight for this long (TRACKWAY_SUPERVISOR_IDLE_S overrides).
idle_exit_seconds = 300

[watchers.loss_rising]
# A rise over the last `window` (steps, or time: "3h") that is significant, at least `min_rise` of the
# level it rose from and `min_z` times the loss's own noise. A few log points can be enough.
window = "500 steps"
min_rise = 0.10
min_z = 8

[watchers.plateau]
# Over a whole `window`, the loss improved by less than `min_improvement` of its level.
window = "2000 steps"
min_improvement = 0.01

[watchers.throughput_falling]
# Steps per second over the last `window` below `ratio` of the window before it.
window = "500 steps"
ratio = 0.5

[watchers.gpu_underused]
# Every GPU of the attempt below `threshold` % in every reading (NVML on this machine, else the
# run's logged gpu_util) for `duration`.
threshold = 70
duration = "10m"

[evals]
# Evaluation attempts the supervisor runs at once (each seed of an evaluation is one run of kind eval).
max_running = 2

[retry]
# What the supervisor does after an attempt ends, per termination reason (defaults: docs/taxonomy.md).
# gpu_hours_budget = 100
# [retry.reasons.preempted]
# budget = 10
# [retry.reasons.infra_transient]
# budget = 3
# backoff_seconds = 30

# What needs a person (an attempt that ended other than completed or a resumed preemption, a
# watcher's alarm, an evaluation's result, an experiment's verdict), sent once by the supervisor
# through apprise: any URL it knows (json://, slack://, discord://, mailto://, ...).
# [notify]
# urls = ["slack://TOKEN_A/TOKEN_B/TOKEN_C/#training", "json://hooks.example.com/trackway"]
# link = "http://gpu-box:8080"   # the dashboard (`trackway serve`): messages link to the run's page
# events = ["attempts", "watchers", "evaluations", "experiments", "expectations"]

# The memory preflight (`trackway preflight`), run by `submit` when the run's config declares the model
# and batch shape: a [preflight] section with the command's keys (layers, hidden, heads, vocab,
# batch_size, seq_lengths, max_length, precision, sharding, ...), or the config keys named here.
# Resources it says would run out of GPU memory are passed over; `submit --strict` (or mode =
# "strict") refuses a run that fits nowhere, before anything is recorded.
# [preflight]
# mode = "warn"               # warn | strict | off
# keys = { batch_size = "train.batch_size", max_length = "data.max_len", model_config = "model.config" }

# Agents that drive trackway over MCP (`trackway mcp --agent NAME`): each one's GPU-hour budget (its
# runs' spent GPU-hours plus what each unfinished one may still take, checked before anything starts)
# and how many of its runs may be unfinished at once. An agent not declared here cannot start work.
# [agents.night-shift]
# gpu_hours_budget = 50
# max_running = 3
"""


@dataclass(frozen=True)
class Settings:
    home: Path
    db_url: str
    resources: dict[str, Resource] = field(default_factory=dict)  # [resources.NAME] in trackway.toml
    selection: dict[str, tuple[str, ...]] = field(default_factory=dict)  # [selection]: run kind → preferred resources
    retention: dict[str, Any] = field(default_factory=dict)  # [checkpoints] in trackway.toml
    retry: dict[str, Any] = field(default_factory=dict)  # [retry] in trackway.toml (supervisor/policy.py)
    stall_seconds: float = 600.0  # [supervisor] stall_seconds: no heartbeat or no new step for this long
    stop_on: tuple[str, ...] = ()  # [supervisor] stop_on: watcher findings that end the attempt
    # [watchers.KIND]: each trend watcher's window and thresholds (supervisor/trends.py), every default filled in.
    watchers: dict[str, dict[str, Any]] = field(default_factory=dict)
    eval_max_running: int = 2  # [evals] max_running: evaluation attempts running at once
    idle_exit_seconds: float = 300.0  # [supervisor] idle_exit_seconds: when a background supervisor exits
    # Scripts without the SDK: defaults for `submit --metric-pattern` and `--checkpoint-path`.
    log_metric_patterns: tuple[str, ...] = ()  # [logs] metrics: regexes, at least one with a (?P<step>...) group
    checkpoint_paths: tuple[str, ...] = ()  # [checkpoints] path: globs relative to the run's working directory
    # [notify]: where what needs a person is sent (apprise URLs), the dashboard to link to, and which kinds.
    notify_urls: tuple[str, ...] = ()
    notify_link: str | None = None
    notify_events: tuple[str, ...] = ("attempts", "watchers", "evaluations", "experiments", "expectations")
    # [preflight] (resources/run_preflight.py): warn, strict or off; where a run config holds each preflight key.
    preflight_mode: str = "warn"
    preflight_keys: dict[str, str] = field(default_factory=dict)
    # [agents.NAME]: each agent's GPU-hour budget and cap on runs at once (trackway/agents/guardrails.py).
    agents: dict[str, dict[str, Any]] = field(default_factory=dict)

    def resource(self, name: str = "local") -> Resource:
        """The resource called `name`; an undeclared one (a run recorded before it was removed) runs locally."""
        return self.resources.get(name) or (default_local() if name == "local" else Resource(name=name, declared=False))

    @property
    def runs_dir(self) -> Path:
        return self.home / "runs"


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except UnicodeDecodeError:
        raise InputError(f"{path}: expected a UTF-8 TOML file, found undecodable bytes") from None


def _parse_toml(text: str, path: Path) -> dict[str, Any]:
    import tomllib  # here: most commands run where trackway.toml was checked before, and every command reads settings

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: not valid TOML: {exc}") from None


def load_settings(home: str | Path | None = None, db: str | None = None, cwd: Path | None = None) -> Settings:
    """Resolve settings from arguments, the environment and ./trackway.toml."""
    cwd = cwd or Path.cwd()
    home_path = Path(home or os.environ.get("TRACKWAY_HOME") or cwd / ".trackway").expanduser().resolve()
    # The home is created on first use: the nearest part of it that exists must be a directory.
    existing = next(p for p in (home_path, *home_path.parents) if p.exists())
    if not existing.is_dir():
        source = "--home" if home else "TRACKWAY_HOME" if os.environ.get("TRACKWAY_HOME") else "home"
        raise InputError(f"{source} {home_path}: expected a directory, but {existing} is a file")
    toml_path = cwd / CONFIG_FILE_NAME
    text = _read_text(toml_path) if toml_path.is_file() else ""
    tables = checked_tables(text, toml_path, home_path / "cache" / "settings" if home_path.is_dir() else None)
    url = db or os.environ.get("TRACKWAY_DB") or tables["ledger"]["url"]
    if not url:
        url = f"sqlite:///{home_path / 'ledger.db'}"
    checkpoints, supervisor, notify = tables["checkpoints"], tables["supervisor"], tables["notify"]
    return Settings(
        home=home_path,
        db_url=url,
        resources={name: resource_from(name, table) for name, table in tables["resources"].items()},
        selection={kind: tuple(dict.fromkeys(names)) for kind, names in tables["selection"].items() if names is not None},
        # What `trackway gc` applies: only what the file sets, so that its own options fill the rest.
        retention={key: checkpoints[key] for key in tables["checkpoints_given"] if key != "path"},
        retry=dict(tables["retry"]),
        stall_seconds=float(supervisor["stall_seconds"]),
        stop_on=tuple(supervisor["stop_on"]),
        watchers=tables["watchers"],
        eval_max_running=tables["evals"]["max_running"],
        idle_exit_seconds=float(supervisor["idle_exit_seconds"]),
        log_metric_patterns=tuple(tables["logs"]["metrics"]),
        checkpoint_paths=tuple(checkpoints["path"]),
        notify_urls=tuple(notify["urls"]),
        notify_link=notify["link"].rstrip("/") if notify["link"] else None,
        notify_events=tuple(notify["events"]),
        preflight_mode=tables["preflight"]["mode"],
        preflight_keys={key: value for key, value in tables["preflight"]["keys"].items() if value is not None},
        agents=dict(tables.get("agents") or {}),
    )


def checked_tables(text: str, path: Path, remember_in: Path | None) -> dict[str, Any]:
    """trackway.toml's tables, checked (settings/model.py) and with every default filled in, as plain values.

    Checking imports pydantic and builds the models: more CPU than the rest of a command such as
    `runs`. So the tables of a file checked once are remembered under the home, by the file's
    bytes and the model's own (trackway/remembered.py), and an unchanged project reads them back
    as JSON. A file that is refused is checked, and refused, every time.
    """
    import json

    from trackway.remembered import entry_path, read_entry, write_entry

    entry = None
    if remember_in is not None:
        rules = [Path(__file__).with_name(name) for name in ("model.py", "preflight.py")]
        entry = entry_path(remember_in, [text], rules + _pydantic_files(), ".json")
        remembered = read_entry(entry) if entry is not None else None
        if remembered is not None:
            try:
                return json.loads(remembered)
            except ValueError:
                pass
    doc = _parse_toml(text, path)
    toml = validate_toml(doc, path, text)
    # Python values, not pydantic's JSON mode: that writes inf as null, and [retry] is checked later
    # (by the retry policy) from exactly what the file says.
    tables = toml.model_dump(by_alias=True)
    tables["checkpoints_given"] = sorted(toml.checkpoints.model_fields_set)
    if entry is not None:
        try:
            write_entry(entry, json.dumps(tables).encode())
        except (TypeError, ValueError):
            pass  # a value JSON cannot hold (a TOML date in [retry]): checked again next time
    return tables


def _pydantic_files() -> list[Path]:
    """pydantic's installed version, as a file whose stamp changes with it (found without importing it)."""
    import importlib.util

    spec = importlib.util.find_spec("pydantic")
    return [Path(spec.origin)] if spec is not None and spec.origin else []


def validate_toml(doc: dict[str, Any], path: Path, text: str) -> TrackwayToml:
    """trackway.toml checked whole against settings/model.py; the first thing wrong refused in one line."""
    from pydantic import ValidationError

    from trackway.settings.model import TrackwayToml
    from trackway.settings.refusal import refusal

    try:
        return TrackwayToml.model_validate(doc)
    except ValidationError as exc:
        raise refusal(exc, TrackwayToml, doc, path, text) from None
