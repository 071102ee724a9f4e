"""trackway.toml as typed models: what each table may hold, checked whole when the settings are read.

Every field's description says what it expects. The same words refuse a bad value, in one line
that names the file, the line, the table and the field (settings/refusal.py), and describe the
field in the JSON Schema that `trackway schema` writes for editors. Unknown keys are refused,
so a misspelt setting is never silently ignored. Relations between fields (a Slurm setting on an
SSH resource, a [selection] naming an undeclared resource) are checked here too, after the types.

`[retry]` is typed as a table here and checked by the retry policy itself (supervisor/policy.py)
when a run is submitted: a policy file given with `--retry-policy` is read by the same rules.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, create_model, model_validator
from pydantic_core import PydanticCustomError

from trackway.settings import kube_names
from trackway.settings.preflight import KEYS as PREFLIGHT_KEYS
from trackway.settings.preflight import MODES as PREFLIGHT_MODES
from trackway.settings.resources import RUN_KINDS

EXECUTORS = ("local", "slurm", "ssh", "kubernetes")
WATCHER_STOPS = ("loss_rising", "plateau", "throughput_falling", "memory_growing", "gpu_underused", "rank_stalled")
NOTIFY_EVENTS = ("attempts", "watchers", "evaluations", "experiments", "expectations")
MAX_GPUS_PER_NODE = 1024
MAX_NODES = 100_000
WEEK_S = 7 * 86400
RESOURCE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
HOST = re.compile(r"^(?:[A-Za-z0-9._-]+@)?(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::\d{1,5})?$")
ENV_PATTERN = re.compile(r"^[A-Za-z_*?][A-Za-z0-9_*?]*$")
# Options trackway sets itself in the sbatch script; a resource's own `sbatch` list must not fight them.
SBATCH_OWNED = ("--signal", "--requeue", "--no-requeue", "--output", "--error", "--open-mode", "--job-name",
                "--time", "--qos", "--partition", "--account", "--nodes", "--gres", "--gpus", "--chdir", "--parsable")
SSH_OWNED_OPTIONS = ("-O", "-M", "-S", "-f", "-N")

# A string on one line with something in it; a multi-line one (a setup script) with something in it.
Line = Annotated[str, StringConstraints(pattern=r"^[^\n\r\x00]*[^\s\x00][^\n\r\x00]*$")]
Text = Annotated[str, StringConstraints(pattern=r"\S")]
NonEmpty = Annotated[str, StringConstraints(min_length=1)]


def _one_or_many(value: Any) -> Any:
    """TOML lets a list of one be written as the string itself."""
    return [value] if isinstance(value, str) else value


def refuse(key: str | None, message: str, table: tuple[str, ...] | None = None) -> PydanticCustomError:
    """A refusal of a relation between fields: said as `[table] key: message` (settings/refusal.py)."""
    return PydanticCustomError("trackway", "{message}", {"key": key, "message": message, "table": table})


class Table(BaseModel):
    """One table of trackway.toml: strict types, no unknown keys."""

    # strict: TOML's "3" is not 3 and true is not 1; no inf/nan: a timer or a cost must end.
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)

    # How an unknown key is refused; {known} is the table's fields.
    unknown: ClassVar[str] = "unknown key; expected {known}"
    # What each element of a list (or value of a table) field must be, said with the element shown.
    items: ClassVar[dict[str, str]] = {}
    # What a missing required field is told (said of the table).
    missing: ClassVar[dict[str, str]] = {}


class QosTier(Table):
    """`[[resources.NAME.qos]]`: a Slurm QoS the resource may submit under, and the longest job it takes."""

    unknown: ClassVar[str] = "not a QoS field (known: {sorted})"
    missing: ClassVar[dict[str, str]] = {
        "name": 'expected name = "..." in each [[resources.NAME.qos]]',
        "max_hours": "expected max_hours = <hours> in each [[resources.NAME.qos]]",
    }

    name: Line = Field(description="a non-empty string on one line")
    max_hours: float = Field(gt=0, le=10 * 365 * 24, description="a number of hours above 0 and at most 87600")


class Toleration(Table):
    """`[[resources.NAME.tolerations]]`: a taint the resource's pods tolerate, as a pod spec says it."""

    unknown: ClassVar[str] = "not a toleration field (known: {sorted})"

    key: Line | None = Field(None, description="a taint key, such as nvidia.com/gpu")
    operator: Literal["Exists", "Equal"] = Field("Equal", description="'Exists' or 'Equal'")
    value: Line | None = Field(None, description="the taint's value (with operator 'Equal')")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="'NoSchedule', 'PreferNoSchedule' or 'NoExecute' (absent: every effect)")
    toleration_seconds: int | None = Field(None, ge=0, description="whole seconds (with effect 'NoExecute')")

    def as_pod_spec(self) -> dict:
        found = {"key": self.key, "operator": self.operator, "value": self.value, "effect": self.effect,
                 "tolerationSeconds": self.toleration_seconds}
        return {key: value for key, value in found.items() if value is not None}


KUBERNETES_ONLY = ("namespace", "image", "gpu_resource", "node_selector", "tolerations", "priority_class",
                   "service_account", "context", "kubeconfig", "keep_pods", "pvc", "pvc_mount", "cpu", "memory",
                   "pending_seconds")


class ResourceTable(Table):
    """`[resources.NAME]`: a named place to run."""

    unknown: ClassVar[str] = "not a resource field (known: {sorted})"
    items: ClassVar[dict[str, str]] = {"use_for": f"run kinds among {', '.join(RUN_KINDS)}"}

    executor: Literal[EXECUTORS] = Field("local", description="'local' or 'slurm' or 'ssh' or 'kubernetes'")
    gpu: Line | None = Field(None, description="a non-empty string on one line")
    gpu_memory_gb: float | None = Field(None, gt=0, le=10_000, description="a number of GB above 0 and at most 10000")
    gpus_per_node: int | None = Field(None, ge=0, le=MAX_GPUS_PER_NODE,
                                      description=f"a whole number from 0 to {MAX_GPUS_PER_NODE}")
    nodes: int = Field(1, ge=1, le=MAX_NODES, description=f"a whole number from 1 to {MAX_NODES}")
    cost_per_gpu_hour: float = Field(0.0, ge=0, le=1e6, description="a number of dollars per GPU-hour from 0 to 1e+06")
    preemptible: bool = Field(False, description="true or false")
    grace_seconds: float = Field(30.0, ge=0, le=86400, description="a number of seconds from 0 to 86400")
    use_for: list[Literal[RUN_KINDS]] = Field(
        list(RUN_KINDS), description=f"a list of strings among {', '.join(RUN_KINDS)}")
    partition: Line | None = Field(None, description="a non-empty string on one line")
    account: Line | None = Field(None, description="a non-empty string on one line")
    qos: list[QosTier] = Field([], description="[[resources.NAME.qos]] tables with name and max_hours")
    sbatch: list[NonEmpty] = Field([], description="a list of strings")
    setup: Text | None = Field(None, description="a non-empty string")
    hosts: list[NonEmpty] = Field([], description="a list of strings")
    key_file: Line | None = Field(None, description="a non-empty string on one line")
    workdir: Line | None = Field(None, description="a non-empty string on one line")
    python: Line | None = Field(None, description="a non-empty string on one line")
    ssh_options: list[NonEmpty] = Field([], description="a list of strings")
    forward_env: list[NonEmpty] = Field([], description="a list of strings")
    unreachable_seconds: float = Field(600.0, ge=0, le=WEEK_S, description=f"a number of seconds from 0 to {WEEK_S}")
    checkpoint_root: Line | None = Field(None, description="a non-empty string on one line")
    namespace: Line | None = Field(None, description="a Kubernetes namespace (a DNS-1123 label)")
    image: Line | None = Field(None, description="a container image, best by digest (repo@sha256:...)")
    gpu_resource: Line = Field("nvidia.com/gpu", description="an extended resource name such as nvidia.com/gpu")
    node_selector: dict[str, NonEmpty] = Field({}, description="a table of node labels and values")
    tolerations: list[Toleration] = Field([], description="[[resources.NAME.tolerations]] tables")
    priority_class: Line | None = Field(None, description="a PriorityClass name")
    service_account: Line | None = Field(None, description="a ServiceAccount name")
    context: Line | None = Field(None, description="a kubeconfig context")
    kubeconfig: Line | None = Field(None, description="a kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    keep_pods: bool = Field(False, description="true or false")
    pvc: Line | None = Field(None, description="a PersistentVolumeClaim name")
    pvc_mount: Line = Field("/checkpoints", description="an absolute path in the pod")
    cpu: Line | None = Field(None, description="a CPU quantity such as 16 or 500m")
    memory: Line | None = Field(None, description="a memory quantity such as 64Gi")
    pending_seconds: float = Field(600.0, ge=0, le=WEEK_S, description=f"a number of seconds from 0 to {WEEK_S}")

    @model_validator(mode="after")
    def _fits_its_executor(self) -> ResourceTable:
        given = self.model_fields_set
        slurm_only = [key for key in ("partition", "account", "qos", "sbatch") if key in given]
        if self.executor != "slurm" and slurm_only:
            raise refuse(slurm_only[0], f"a Slurm setting, but executor is {self.executor!r}")
        if self.executor == "local" and "setup" in given:
            raise refuse("setup", "a Slurm or SSH setting, but executor is 'local'")
        ssh_only = [key for key in ("hosts", "key_file", "workdir", "python", "ssh_options", "forward_env",
                                    "unreachable_seconds") if key in given]
        if self.executor != "ssh" and ssh_only:
            raise refuse(ssh_only[0], f"an SSH setting, but executor is {self.executor!r}")
        if self.executor == "ssh" and not self.hosts:
            raise refuse("hosts" if "hosts" in given else None, 'executor \'ssh\' needs hosts = ["user@host:port", ...]')
        for spec in self.hosts:
            if not HOST.match(spec):
                raise refuse("hosts", f"expected user@host or user@host:port, got {spec!r}")
        for option in self.ssh_options:
            if "\n" in option or option in SSH_OWNED_OPTIONS:
                raise refuse("ssh_options", f"{option!r} is set by trackway or would stop it working")
        for option in self.sbatch:
            if not option.startswith("-") or "\n" in option:
                raise refuse("sbatch", f"expected sbatch options such as '--constraint=b200', got {option!r}")
            if option.split("=", 1)[0] in SBATCH_OWNED:
                raise refuse("sbatch", f"{option.split('=', 1)[0]} is set by trackway (or by its own field)")
        for pattern in self.forward_env:
            if not ENV_PATTERN.match(pattern):
                raise refuse("forward_env", f"expected variable names or globs such as AWS_*, got {pattern!r}")
        names = [tier.name for tier in self.qos]
        if len(set(names)) != len(names):
            raise refuse("qos", f"expected each QoS once, got {', '.join(names)}")
        self._fits_kubernetes(given)
        return self

    def _fits_kubernetes(self, given: set[str]) -> None:
        """What the API server would refuse later, refused here with the field's name."""
        kube_only = [key for key in KUBERNETES_ONLY if key in given]
        if self.executor != "kubernetes":
            if kube_only:
                raise refuse(kube_only[0], f"a Kubernetes setting, but executor is {self.executor!r}")
            return
        if self.namespace is None:
            raise refuse(None, "executor 'kubernetes' needs namespace = \"...\"")
        if not kube_names.is_dns_label(self.namespace):
            raise refuse("namespace", f"expected a DNS-1123 label (lower-case letters, digits and '-', at most 63 "
                                      f"characters, alphanumeric at both ends), got {self.namespace!r}")
        if self.image is None:
            raise refuse(None, "executor 'kubernetes' needs image = \"registry/name@sha256:...\"")
        if not kube_names.EXTENDED_RESOURCE.match(self.gpu_resource):
            raise refuse("gpu_resource", f"expected an extended resource such as nvidia.com/gpu or amd.com/gpu "
                                         f"(domain/name), got {self.gpu_resource!r}")
        for key, value in self.node_selector.items():
            if not kube_names.is_label_key(key) or not kube_names.is_label_value(value):
                raise refuse("node_selector", f"expected label keys and values (at most 63 characters of letters, "
                                              f"digits, '-', '_', '.'), got {key} = {value!r}")
        for key in ("priority_class", "service_account", "pvc"):
            value = getattr(self, key)
            if value is not None and not kube_names.is_dns_subdomain(value):
                raise refuse(key, f"expected a DNS-1123 name (lower-case letters, digits, '-', '.'), got {value!r}")
        if not self.pvc_mount.startswith("/"):
            raise refuse("pvc_mount", f"expected an absolute path in the pod, got {self.pvc_mount!r}")
        if self.pvc is None and "pvc_mount" in given:
            raise refuse("pvc_mount", "the mount path of a PVC, but no pvc = \"...\" is given")
        for key in ("cpu", "memory"):
            value = getattr(self, key)
            if value is not None and not kube_names.QUANTITY.match(value):
                raise refuse(key, f"expected a Kubernetes quantity such as 16, 500m or 64Gi, got {value!r}")
        for item in self.tolerations:
            if item.operator == "Exists" and item.value is not None:
                raise refuse("tolerations", "a toleration with operator 'Exists' takes no value")
            if item.key is None and item.operator != "Exists":
                raise refuse("tolerations", "a toleration without a key needs operator = \"Exists\"")


class SelectionTable(Table):
    """`[selection]`: for each run kind, the resources in the order they are preferred."""

    unknown: ClassVar[str] = f"expected a run kind among {', '.join(RUN_KINDS)}"

    test: list[str] | None = Field(None, description="a list of resource names")
    full: list[str] | None = Field(None, description="a list of resource names")
    eval: list[str] | None = Field(None, description="a list of resource names")


class LedgerTable(Table):
    """`[ledger]`: where the ledger is (--db and TRACKWAY_DB win over it)."""

    url: Line | None = Field(None, description="a database URL such as postgresql+psycopg://user@host/db")


class CheckpointsTable(Table):
    """`[checkpoints]`: what `trackway gc` keeps, and where scripts without the SDK write checkpoints."""

    path: Annotated[list[NonEmpty], BeforeValidator(_one_or_many)] = Field(
        [], description="a string or a list of paths relative to the run's working directory")
    keep_last: int = Field(2, ge=2, description="a whole number ≥ 2 (the newest checkpoint may turn out corrupt)")
    keep_every: int | None = Field(None, ge=1, description="a whole number ≥ 1")
    keep_best: int = Field(0, ge=0, description="a whole number ≥ 0")
    best_metric: Line | None = Field(None, description="the metric recorded at save time that keep_best ranks by")
    best_mode: Literal["min", "max"] = Field("min", description="'min' or 'max'")
    keep_evaluated: Literal["best", "all"] = Field("best", description="\"best\" or \"all\"")


class LogsTable(Table):
    """`[logs]`: how `submit --metric-pattern` reads metrics from a script's log by default."""

    metrics: Annotated[list[NonEmpty], BeforeValidator(_one_or_many)] = Field(
        [], description="a string or a list of regular expressions")


class SupervisorTable(Table):
    """`[supervisor]`: when an attempt counts as stalled, which watchers end it, when a background supervisor exits."""

    items: ClassVar[dict[str, str]] = {"stop_on": f"a list of {', '.join(WATCHER_STOPS)}"}

    stall_seconds: float = Field(600.0, ge=1, le=WEEK_S, description=f"a number of seconds from 1 to {WEEK_S}")
    idle_exit_seconds: float = Field(300.0, ge=0, le=WEEK_S, description=f"a number of seconds from 0 to {WEEK_S}")
    stop_on: list[Literal[WATCHER_STOPS]] = Field(
        [], description=f"a list of {', '.join(WATCHER_STOPS)}")


def _window(value: Any) -> Any:
    """A watcher's window as written ("500 steps", "3h"); refused in the field description's words."""
    from trackway.settings.windows import Window

    if not isinstance(value, str):
        raise ValueError("not a string")
    Window.parse(value)  # its ValueError is said as "expected <the field's description>, got ..."
    return value


def _duration(value: Any) -> Any:
    """A watcher's duration ("10m", "90s", "2h"): a window of time, not of steps."""
    from trackway.settings.windows import Window

    if not isinstance(value, str) or Window.parse(value).unit != "seconds":
        raise ValueError("not a duration")
    return value


WindowText = Annotated[str, BeforeValidator(_window)]
DurationText = Annotated[str, BeforeValidator(_duration)]
WINDOW_DESCRIPTION = 'a number of steps or a duration, such as "500 steps", "90s", "10m" or "3h"'


class LossRisingTable(Table):
    """`[watchers.loss_rising]`: a rise over `window` at least `min_rise` of the level it rose from and `min_z` × the
    series' own noise (supervisor/trends.py)."""

    window: WindowText = Field("500 steps", description=WINDOW_DESCRIPTION)
    min_rise: float = Field(0.10, gt=0, le=100, description="a fraction of the loss's level above 0, such as 0.1")
    min_z: float = Field(8.0, gt=0, le=1000, description="a number of noise units above 0, such as 8")


class PlateauTable(Table):
    """`[watchers.plateau]`: over a whole `window`, the loss improved by less than `min_improvement` of its level."""

    window: WindowText = Field("2000 steps", description=WINDOW_DESCRIPTION)
    min_improvement: float = Field(0.01, gt=0, le=1, description="a fraction above 0 and at most 1, such as 0.01")


class ThroughputFallingTable(Table):
    """`[watchers.throughput_falling]`: steps per second over the last `window` below `ratio` of the window before."""

    window: WindowText = Field("500 steps", description=WINDOW_DESCRIPTION)
    ratio: float = Field(0.5, gt=0, lt=1, description="a fraction above 0 and below 1, such as 0.5")


class GpuUnderusedTable(Table):
    """`[watchers.gpu_underused]`: every GPU of the attempt below `threshold` % in every reading for `duration`."""

    threshold: float = Field(70.0, gt=0, le=100, description="a percentage above 0 and at most 100, such as 70")
    duration: DurationText = Field("10m", description='a duration such as "90s", "10m" or "2h"')


class WatchersTable(Table):
    """`[watchers]`: each trend watcher's window and thresholds."""

    loss_rising: LossRisingTable = Field(default_factory=LossRisingTable, description="a table")
    plateau: PlateauTable = Field(default_factory=PlateauTable, description="a table")
    throughput_falling: ThroughputFallingTable = Field(default_factory=ThroughputFallingTable, description="a table")
    gpu_underused: GpuUnderusedTable = Field(default_factory=GpuUnderusedTable, description="a table")


class AgentTable(Table):
    """`[agents.NAME]`: what one agent driving trackway over MCP may spend (trackway/agents/guardrails.py)."""

    gpu_hours_budget: float | None = Field(
        None, gt=0, le=10_000_000, description="a number of GPU-hours above 0, such as 50 (none: no budget)")
    max_running: int = Field(2, ge=1, le=10_000, description="a whole number of runs from 1 to 10000")
    approve_full_runs: bool = Field(False, description="true or false: a full run waits for `trackway approve`")
    approve_over_gpu_hours: float | None = Field(
        None, gt=0, le=10_000_000,
        description="a number of GPU-hours above 0: a run asking more (GPUs × time limit) waits for `trackway approve`")


class EvalsTable(Table):
    """`[evals]`: how many evaluation attempts run at once."""

    max_running: int = Field(2, ge=1, description="a whole number ≥ 1")


class NotifyTable(Table):
    """`[notify]`: where what needs a person is sent (apprise URLs), the dashboard to link to, and which kinds."""

    items: ClassVar[dict[str, str]] = {"events": f"some of {', '.join(NOTIFY_EVENTS)}"}

    urls: Annotated[list[NonEmpty], BeforeValidator(_one_or_many)] = Field(
        [], description="a string or a list of notification URLs (json://, slack://, mailto://)")
    link: Annotated[str, StringConstraints(pattern=r"^https?://")] | None = Field(
        None, description="the dashboard's http(s):// address")
    events: Annotated[list[Literal[NOTIFY_EVENTS]],
                      BeforeValidator(_one_or_many)] = Field(list(NOTIFY_EVENTS), description="a string or a list of event kinds")

    @model_validator(mode="after")
    def _urls_are_urls(self) -> NotifyTable:
        for url in self.urls:
            if "://" not in url:
                raise refuse("urls", f"{url.split(':')[0]!r}: expected a URL such as json://host/path, "
                                     "slack://TOKEN_A/TOKEN_B/TOKEN_C or mailto://user:pass@host")
        return self


PreflightKeys: type[Table] = create_model(
    "PreflightKeys",
    __base__=Table,
    __doc__="`[preflight] keys`: where a run's config holds each preflight key (preflight key = \"dotted.config.key\").",
    # `model_config` is pydantic's own name: that key is held under another and read by its alias.
    **{("hf_model_config" if key == "model_config" else key):
       (NonEmpty | None, Field(None, alias=key, description='a dotted config key such as "train.batch_size"'))
       for key in PREFLIGHT_KEYS},
)
PreflightKeys.unknown = f"unknown key; expected some of {', '.join(PREFLIGHT_KEYS)}"


class PreflightTable(Table):
    """`[preflight]`: warn, strict or off; where a run config holds each preflight key."""

    mode: Literal[PREFLIGHT_MODES] = Field("warn", description=f"one of {', '.join(PREFLIGHT_MODES)}")
    keys: PreflightKeys = Field(default_factory=PreflightKeys,  # type: ignore[valid-type]
                                description='a table of preflight key = "dotted.config.key"')


class TrackwayToml(Table):
    """A project's trackway.toml: every table optional, each with the embedded defaults."""

    unknown: ClassVar[str] = "unknown table; expected {known}"

    ledger: LedgerTable = Field(default_factory=LedgerTable, description="a table")
    resources: dict[str, ResourceTable] = Field({}, description="tables [resources.NAME]")
    selection: SelectionTable = Field(default_factory=SelectionTable,
                                      description="a table of run kinds to lists of resources")
    checkpoints: CheckpointsTable = Field(default_factory=CheckpointsTable, description="a table")
    logs: LogsTable = Field(default_factory=LogsTable, description="a table")
    retry: dict[str, Any] = Field({}, description="a table of retry settings")
    supervisor: SupervisorTable = Field(default_factory=SupervisorTable, description="a table")
    evals: EvalsTable = Field(default_factory=EvalsTable, description="a table")
    watchers: WatchersTable = Field(default_factory=WatchersTable, description="a table")
    notify: NotifyTable = Field(default_factory=NotifyTable, description="a table")
    preflight: PreflightTable = Field(default_factory=PreflightTable, description="a table")
    agents: dict[str, AgentTable] = Field({}, description="tables [agents.NAME]")

    @model_validator(mode="before")
    @classmethod
    def _resource_names(cls, doc: Any) -> Any:
        """A resource's name is refused before its fields: it is how every message names the table."""
        for name in (doc.get("resources") or {}) if isinstance(doc, dict) and isinstance(doc.get("resources"), dict) else ():
            if not RESOURCE_NAME.match(name):
                raise refuse(None, "a resource name: letters, digits, '_', '.', '-' (up to 64), first a letter or digit",
                             table=("resources", name))
        for name in (doc.get("agents") or {}) if isinstance(doc, dict) and isinstance(doc.get("agents"), dict) else ():
            if not RESOURCE_NAME.match(name):
                raise refuse(None, "an agent name: letters, digits, '_', '.', '-' (up to 64), first a letter or digit",
                             table=("agents", name))
        return doc

    @model_validator(mode="after")
    def _selection_names_declared_resources(self) -> TrackwayToml:
        for kind in RUN_KINDS:
            for name in getattr(self.selection, kind) or ():
                if name not in self.resources and name != "local":
                    declared = ", ".join(sorted(self.resources)) or "none"
                    raise refuse(kind, f"{name!r} is not a declared resource (declared: {declared})", table=("selection",))
        return self
