"""The resources trackway.toml declares: `[resources.NAME]` tables, read and checked into `Resource`s.

    [resources.ailab]
    executor = "slurm"            # local | slurm | ssh | kubernetes
    gpu = "B200"                  # the GPU model, as people name it
    gpu_memory_gb = 180           # per GPU
    gpus_per_node = 8
    nodes = 1
    cost_per_gpu_hour = 2.5
    preemptible = false
    grace_seconds = 60            # notice before a time limit or a preemption ends the attempt
    use_for = ["full", "eval"]    # run kinds this resource takes (default: all of test, full, eval)
    partition = "lab"             # Slurm only, like everything below
    account = "ml-group"
    sbatch = ["--constraint=b200"]   # extra options, one per string
    setup = "module load cuda/12.4 && source ~/venv/bin/activate"

    [[resources.ailab.qos]]       # tiers, tried from the shortest limit up
    name = "gpu-test"
    max_hours = 1

    [resources.spot]
    executor = "ssh"
    hosts = ["root@203.0.113.7:22", "root@203.0.113.8"]   # tried in order
    key_file = "~/.ssh/id_ed25519"
    workdir = "/workspace/trackway"   # on the host (relative: to the login directory); {host} is the host's name
    python = "python3"                # runs trackway's stdlib-only shim there
    setup = "source /workspace/venv/bin/activate"
    ssh_options = ["-o", "ProxyJump=bastion"]
    forward_env = ["AWS_*", "WANDB_API_KEY"]   # the submitter's variables the host gets (names or globs)
    unreachable_seconds = 600         # how long a silent host may come back before its attempt is lost
    preemptible = true                # a lost host then ends the attempt `preempted`, else `infra_transient`
    checkpoint_root = "s3://bucket/checkpoints"   # any executor: checkpoints that outlive the machine

    [resources.k8s]
    executor = "kubernetes"           # each attempt a batch/v1 Job (docs/guide/kubernetes.md)
    namespace = "ml-team"
    image = "registry.example.com/train@sha256:..."
    gpu_resource = "nvidia.com/gpu"   # the extended resource the GPUs are asked as
    gpus_per_node = 8
    node_selector = { "cloud.google.com/gke-accelerator" = "nvidia-h100-80gb" }
    priority_class = "training"
    service_account = "trainer"
    context = "prod"                  # kubeconfig context (kubeconfig = "..." for another file)
    cpu = "32"
    memory = "256Gi"
    pvc = "team-checkpoints"          # checkpoints on a PersistentVolumeClaim, mounted at pvc_mount
    pvc_mount = "/checkpoints"
    pending_seconds = 600             # image pull failing or unschedulable this long: config_error
    keep_pods = false                 # true: the Job and its pod stay after the attempt, for debugging
    [[resources.k8s.tolerations]]
    key = "nvidia.com/gpu"
    operator = "Exists"
    effect = "NoSchedule"

What a table may hold is checked by settings/model.py (a bad entry is refused with one line naming
the file, the line, the field and what was expected); this module turns a checked table into the
`Resource` the rest of trackway reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

RUN_KINDS = ("test", "full", "eval")


@dataclass(frozen=True)
class QosTier:
    """A Slurm QoS a resource may submit under, and the longest job it takes."""

    name: str
    max_hours: float


@dataclass(frozen=True)
class Resource:
    """A named place to run, as trackway.toml declares it."""

    name: str
    executor: str = "local"
    gpu: str | None = None
    gpu_memory_gb: float | None = None
    gpus_per_node: int | None = None  # None: what the machine shows (local), or unknown
    nodes: int = 1
    cost_per_gpu_hour: float = 0.0
    preemptible: bool = False
    grace_seconds: float = 30.0
    use_for: tuple[str, ...] = RUN_KINDS
    partition: str | None = None
    account: str | None = None
    qos: tuple[QosTier, ...] = ()  # ordered by max_hours, shortest first
    sbatch: tuple[str, ...] = ()
    setup: str | None = None
    hosts: tuple[str, ...] = ()
    key_file: str | None = None
    workdir: str = "trackway"
    python: str = "python3"
    ssh_options: tuple[str, ...] = ()
    forward_env: tuple[str, ...] = ()
    unreachable_seconds: float = 600.0
    checkpoint_root: str | None = None  # an fsspec URL or a path (a network volume); None: under trackway's home
    # Kubernetes only (executors/kubernetes.py).
    namespace: str | None = None
    image: str | None = None
    gpu_resource: str = "nvidia.com/gpu"
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[dict, ...] = ()  # as a pod spec says them
    priority_class: str | None = None
    service_account: str | None = None
    context: str | None = None
    kubeconfig: str | None = None
    keep_pods: bool = False
    pvc: str | None = None
    pvc_mount: str = "/checkpoints"
    cpu: str | None = None
    memory: str | None = None
    pending_seconds: float = 600.0
    declared: bool = True  # False for the implicit `local` of a trackway.toml that names none

    @property
    def total_gpus(self) -> int | None:
        return None if self.gpus_per_node is None else self.gpus_per_node * self.nodes

    def describe(self) -> str:
        """One line: `slurm, 8×B200 (180 GB), lab partition, $2.50/GPU-h`; `ssh, 2 hosts × 1×GPU, preemptible`."""
        parts = [self.executor]
        hosts = f"{len(self.hosts)} host{'s' if len(self.hosts) != 1 else ''}" if self.hosts else ""
        if self.gpus_per_node is not None or self.gpu:
            count = f"{self.total_gpus}×" if self.total_gpus is not None else ""
            memory = f" ({self.gpu_memory_gb:g} GB)" if self.gpu_memory_gb is not None else ""
            parts.append(f"{hosts + ' × ' if hosts else ''}{count}{self.gpu or 'GPU'}{memory}")
        elif hosts:
            parts.append(hosts)
        if self.partition:
            parts.append(f"partition {self.partition}")
        if self.cost_per_gpu_hour:
            parts.append(f"${self.cost_per_gpu_hour:.2f}/GPU-h")
        if self.preemptible:
            parts.append("preemptible")
        return ", ".join(parts)


def default_local() -> Resource:
    return Resource(name="local", declared=False)


def resource_from(name: str, table: dict[str, Any]) -> Resource:
    """The `Resource` a checked `[resources.NAME]` table declares (settings/model.py's ResourceTable, as plain values)."""
    return Resource(
        name=name,
        executor=table["executor"],
        gpu=table["gpu"],
        gpu_memory_gb=None if table["gpu_memory_gb"] is None else float(table["gpu_memory_gb"]),
        gpus_per_node=table["gpus_per_node"],
        nodes=table["nodes"],
        cost_per_gpu_hour=float(table["cost_per_gpu_hour"]),
        preemptible=table["preemptible"],
        grace_seconds=float(table["grace_seconds"]),
        use_for=tuple(table["use_for"]) or RUN_KINDS,
        partition=table["partition"],
        account=table["account"],
        # Tiers are tried from the shortest limit up, whatever order the file lists them in.
        qos=tuple(sorted((QosTier(tier["name"], float(tier["max_hours"])) for tier in table["qos"]), key=lambda tier: tier.max_hours)),
        sbatch=tuple(table["sbatch"]),
        setup=table["setup"],
        hosts=tuple(dict.fromkeys(table["hosts"])),
        key_file=table["key_file"],
        workdir=table["workdir"] or "trackway",
        python=table["python"] or "python3",
        ssh_options=tuple(table["ssh_options"]),
        forward_env=tuple(table["forward_env"]),
        unreachable_seconds=float(table["unreachable_seconds"]),
        checkpoint_root=table["checkpoint_root"],
        namespace=table.get("namespace"),
        image=table.get("image"),
        gpu_resource=table.get("gpu_resource") or "nvidia.com/gpu",
        node_selector=tuple(sorted((table.get("node_selector") or {}).items())),
        tolerations=tuple(_toleration(item) for item in table.get("tolerations") or ()),
        priority_class=table.get("priority_class"),
        service_account=table.get("service_account"),
        context=table.get("context"),
        kubeconfig=table.get("kubeconfig"),
        keep_pods=bool(table.get("keep_pods", False)),
        pvc=table.get("pvc"),
        pvc_mount=table.get("pvc_mount") or "/checkpoints",
        cpu=table.get("cpu"),
        memory=table.get("memory"),
        pending_seconds=float(table.get("pending_seconds", 600.0)),
    )


def _toleration(item: dict) -> dict:
    """A toleration as a pod spec says it (camelCase, unset fields left out)."""
    found = {"key": item.get("key"), "operator": item.get("operator"), "value": item.get("value"),
             "effect": item.get("effect"), "tolerationSeconds": item.get("toleration_seconds")}
    return {key: value for key, value in found.items() if value is not None}
