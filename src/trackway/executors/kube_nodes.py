"""A Kubernetes resource's GPUs now: allocatable and requested per node pool, and the pods of its namespace.

The nodes are those the resource's pods may land on (its node_selector), ready and schedulable; a
node's pool is the first of the providers' pool labels it carries (GKE, EKS, Karpenter, AKS), else
its instance type. Allocatable is what each node's device plugin advertises as the resource's
`gpu_resource`; requested is what the pods bound to those nodes and not yet ended ask of it (their
limits, which for an extended resource are the request). Reading every namespace's pods may be
forbidden by RBAC: requested is then not known, and said so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

POOL_LABELS = ("cloud.google.com/gke-nodepool", "eks.amazonaws.com/nodegroup", "karpenter.sh/nodepool",
               "kubernetes.azure.com/agentpool", "agentpool", "node.kubernetes.io/instance-type")


@dataclass(frozen=True)
class Pool:
    name: str
    nodes: int
    allocatable: int
    requested: int | None  # None: the pods could not be read

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ClusterGpus:
    pools: tuple[Pool, ...]
    running: int
    pending: int
    note: str | None = None  # what could not be read

    @property
    def total(self) -> int:
        return sum(pool.allocatable for pool in self.pools)

    @property
    def free(self) -> int | None:
        if any(pool.requested is None for pool in self.pools):
            return None
        return sum(max(0, pool.allocatable - pool.requested) for pool in self.pools)


def _gpus(value) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0


def pool_of(node: dict) -> str:
    labels = (node.get("metadata") or {}).get("labels") or {}
    return next((labels[key] for key in POOL_LABELS if labels.get(key)), "(no pool label)")


def usable(node: dict, selector: dict[str, str]) -> bool:
    labels = (node.get("metadata") or {}).get("labels") or {}
    if any(labels.get(key) != value for key, value in selector.items()):
        return False
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    ready = [c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"]
    return not ready or ready[0].get("status") == "True"


def gpus_of(resource, timeout_s: float) -> ClusterGpus:
    """The resource's node pools and namespace now; ExecutorError (one line) when the API cannot be asked."""
    from trackway.errors import ExecutorError
    from trackway.executors.kubernetes import KubeCluster

    cluster = KubeCluster(resource.kubeconfig, resource.context)
    cluster.timeout_s = timeout_s
    selector = dict(resource.node_selector)
    nodes = cluster.call(cluster.core.list_node) or {}
    chosen = {(n.get("metadata") or {}).get("name"): n for n in nodes.get("items") or [] if usable(n, selector)}
    requested: dict[str, int] | None = {}
    note = None
    try:
        pods = cluster.call(cluster.core.list_pod_for_all_namespaces,
                            field_selector="status.phase!=Succeeded,status.phase!=Failed") or {}
    except ExecutorError as exc:
        requested, pods, note = None, {}, f"GPUs requested not known: {exc}"
    for pod in pods.get("items") or []:
        node = (pod.get("spec") or {}).get("nodeName")
        if node not in chosen or ((pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")):
            continue
        asked = sum(_gpus(((c.get("resources") or {}).get("limits") or {}).get(resource.gpu_resource)
                          or ((c.get("resources") or {}).get("requests") or {}).get(resource.gpu_resource))
                    for c in (pod.get("spec") or {}).get("containers") or [])
        requested[node] = requested.get(node, 0) + asked
    by_pool: dict[str, list[str]] = {}
    for name, node in chosen.items():
        by_pool.setdefault(pool_of(node), []).append(name)
    pools = tuple(Pool(name=pool, nodes=len(names),
                       allocatable=sum(_gpus(((chosen[n].get("status") or {}).get("allocatable") or {})
                                             .get(resource.gpu_resource)) for n in names),
                       requested=None if requested is None else sum(requested.get(n, 0) for n in names))
                  for pool, names in sorted(by_pool.items()))
    own = cluster.call(cluster.core.list_namespaced_pod, resource.namespace) or {}
    phases = [((pod.get("status") or {}).get("phase")) for pod in own.get("items") or []
              if (pod.get("metadata") or {}).get("namespace", resource.namespace) == resource.namespace]
    return ClusterGpus(pools=pools, running=phases.count("Running"), pending=phases.count("Pending"), note=note)
