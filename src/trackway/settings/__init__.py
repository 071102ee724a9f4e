"""Where things live: TRACKWAY_HOME, the ledger URL, and the project's trackway.toml.

Precedence for the ledger URL: `--db` > `TRACKWAY_DB` > `[ledger] url` in trackway.toml >
SQLite at `$TRACKWAY_HOME/ledger.db`. `TRACKWAY_HOME` defaults to `./.trackway`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trackway.errors import InputError
from trackway.settings.resources import Resource, default_local, parse_resources, parse_selection
from trackway.settings.preflight import preflight_section
from trackway.validation import finite

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
# group `step` is the step, every other named group a metric (`submit --metric-pattern` overrides).
# metrics = ['iter (?P<step>\\d+): loss (?P<loss>\\S+)']

[supervisor]
# An attempt whose SDK heartbeat stops, or that logs no new step, for this long is stalled:
# it is ended (SIGTERM, grace, SIGKILL) and retried once.
stall_seconds = 600
# Other watchers only record what they notice; list the ones that should end the attempt too:
# loss_rising (→ nan_loss), memory_growing (→ oom), plateau, throughput_falling, gpu_underused (→ stalled).
stop_on = []
# `trackway submit --detach` (and `eval --detach`) start a supervisor in the background when none is
# running; it exits after nothing has been in flight for this long (TRACKWAY_SUPERVISOR_IDLE_S overrides).
idle_exit_seconds = 300

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
# events = ["attempts", "watchers", "evaluations", "experiments"]

# The memory preflight (`trackway preflight`), run by `submit` when the run's config declares the model
# and batch shape: a [preflight] section with the command's keys (layers, hidden, heads, vocab,
# batch_size, seq_lengths, max_length, precision, sharding, ...), or the config keys named here.
# Resources it says would run out of GPU memory are passed over; `submit --strict` (or mode =
# "strict") refuses a run that fits nowhere, before anything is recorded.
# [preflight]
# mode = "warn"               # warn | strict | off
# keys = { batch_size = "train.batch_size", max_length = "data.max_len", model_config = "model.config" }
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
    eval_max_running: int = 2  # [evals] max_running: evaluation attempts running at once
    idle_exit_seconds: float = 300.0  # [supervisor] idle_exit_seconds: when a background supervisor exits
    # Scripts without the SDK: defaults for `submit --metric-pattern` and `--checkpoint-path`.
    log_metric_patterns: tuple[str, ...] = ()  # [logs] metrics: regexes with a (?P<step>...) group
    checkpoint_paths: tuple[str, ...] = ()  # [checkpoints] path: globs relative to the run's working directory
    # [notify]: where what needs a person is sent (apprise URLs), the dashboard to link to, and which kinds.
    notify_urls: tuple[str, ...] = ()
    notify_link: str | None = None
    notify_events: tuple[str, ...] = ("attempts", "watchers", "evaluations", "experiments")
    # [preflight] (resources/run_preflight.py): warn, strict or off; where a run config holds each preflight key.
    preflight_mode: str = "warn"
    preflight_keys: dict[str, str] = field(default_factory=dict)

    def resource(self, name: str = "local") -> Resource:
        """The resource called `name`; an undeclared one (a run recorded before it was removed) runs locally."""
        return self.resources.get(name) or (default_local() if name == "local" else Resource(name=name, declared=False))

    @property
    def runs_dir(self) -> Path:
        return self.home / "runs"


def _read_toml(path: Path) -> tuple[dict[str, Any], str]:
    import tomllib  # here: most commands run where there is no trackway.toml, and every command reads settings

    text = path.read_text()
    try:
        return tomllib.loads(text), text
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: not valid TOML: {exc}") from None


def _number(value: Any, field: str, low: float, high: float, unit: str) -> float:
    """A number from trackway.toml; TOML spells inf and nan, which no timer or cost should take."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"{field}: expected a number of {unit} from {low:g} to {high:g}, got {value!r}")
    return finite(float(value), field, low, high, unit)


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
    doc, text = _read_toml(toml_path) if toml_path.is_file() else ({}, "")
    url = db or os.environ.get("TRACKWAY_DB") or (doc.get("ledger") or {}).get("url")
    if not url:
        url = f"sqlite:///{home_path / 'ledger.db'}"
    retention = doc.get("checkpoints") or {}
    if not isinstance(retention, dict):
        raise InputError(f"{toml_path}: [checkpoints] must be a table")
    retention = dict(retention)
    checkpoint_paths = _strings(
        retention.pop("path", []), f"{toml_path}: [checkpoints] path", "paths relative to the run's working directory"
    )
    logs = doc.get("logs") or {}
    if not isinstance(logs, dict):
        raise InputError(f"{toml_path}: [logs] must be a table")
    log_metric_patterns = _strings(logs.get("metrics", []), f"{toml_path}: [logs] metrics", "regular expressions")
    retry = doc.get("retry") or {}
    if not isinstance(retry, dict):
        raise InputError(f"{toml_path}: [retry] must be a table")
    supervisor = doc.get("supervisor") or {}
    if not isinstance(supervisor, dict):
        raise InputError(f"{toml_path}: [supervisor] must be a table")
    stall_seconds = _number(
        supervisor.get("stall_seconds", 600.0), f"{toml_path}: [supervisor] stall_seconds", 1.0, 7 * 86400.0, "seconds"
    )
    idle_exit_seconds = _number(
        supervisor.get("idle_exit_seconds", 300.0), f"{toml_path}: [supervisor] idle_exit_seconds",
        0.0, 7 * 86400.0, "seconds",
    )
    stop_on = supervisor.get("stop_on", [])
    known = ("loss_rising", "plateau", "throughput_falling", "memory_growing", "gpu_underused")
    if not isinstance(stop_on, list) or any(kind not in known for kind in stop_on):
        raise InputError(f"{toml_path}: [supervisor] stop_on: expected a list of {', '.join(known)}")
    evals = doc.get("evals") or {}
    max_running = evals.get("max_running", 2) if isinstance(evals, dict) else None
    if not isinstance(max_running, int) or isinstance(max_running, bool) or max_running < 1:
        raise InputError(f"{toml_path}: [evals] max_running: expected a whole number ≥ 1")
    resources = parse_resources(doc, toml_path, text)
    notify_urls, notify_link, notify_events = _notify(doc.get("notify"), toml_path)
    preflight_mode, preflight_keys = preflight_section(doc.get("preflight"), toml_path)
    return Settings(
        home=home_path,
        db_url=url,
        resources=resources,
        selection=parse_selection(doc, toml_path, text, resources),
        retention=retention,
        retry=retry,
        stall_seconds=stall_seconds,
        stop_on=tuple(stop_on),
        eval_max_running=max_running,
        idle_exit_seconds=idle_exit_seconds,
        log_metric_patterns=log_metric_patterns,
        checkpoint_paths=checkpoint_paths,
        notify_urls=notify_urls,
        notify_link=notify_link,
        notify_events=notify_events,
        preflight_mode=preflight_mode,
        preflight_keys=preflight_keys,
    )


NOTIFY_EVENTS = ("attempts", "watchers", "evaluations", "experiments")


def _notify(section: Any, toml_path: Path) -> tuple[tuple[str, ...], str | None, tuple[str, ...]]:
    """[notify] urls (apprise URLs: json://, slack://, mailto://, ...), link (the dashboard's address), events."""
    if section is None:
        return (), None, NOTIFY_EVENTS
    if not isinstance(section, dict):
        raise InputError(f"{toml_path}: [notify] must be a table")
    unknown = sorted(set(section) - {"urls", "link", "events"})
    if unknown:
        raise InputError(f"{toml_path}: [notify] {unknown[0]}: unknown key; expected urls, link, events")
    urls = _strings(section.get("urls", []), f"{toml_path}: [notify] urls", "notification URLs (json://, slack://, mailto://)")
    for url in urls:
        if "://" not in url:
            raise InputError(f"{toml_path}: [notify] urls: {url.split(':')[0]!r}: expected a URL such as "
                             "json://host/path, slack://TOKEN_A/TOKEN_B/TOKEN_C or mailto://user:pass@host")
    link = section.get("link")
    if link is not None and (not isinstance(link, str) or not link.startswith(("http://", "https://"))):
        raise InputError(f"{toml_path}: [notify] link: expected the dashboard's http(s):// address, got {link!r}")
    events = _strings(section.get("events", list(NOTIFY_EVENTS)), f"{toml_path}: [notify] events", "event kinds")
    wrong = [e for e in events if e not in NOTIFY_EVENTS]
    if wrong:
        raise InputError(f"{toml_path}: [notify] events: {wrong[0]!r}: expected some of {', '.join(NOTIFY_EVENTS)}")
    return urls, link.rstrip("/") if link else None, events


def _strings(value: Any, field: str, what: str) -> tuple[str, ...]:
    """A string or a list of strings from trackway.toml (checked further where they are used)."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise InputError(f"{field}: expected a string or a list of {what}")
    return tuple(value)
