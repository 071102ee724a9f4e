"""How many nodes a run may span on a resource, and the check of a run's `--nodes` against it.

A run asks for its nodes (`submit --nodes N`, the API's `nodes`); a resource bounds them: a
Slurm resource by its declared `nodes`, an SSH resource by its hosts, this machine and a Kubernetes
resource (one pod an attempt) by one.
"""

from __future__ import annotations

from trackway.errors import InputError
from trackway.settings.resources import Resource

# The most nodes one run may ask for anywhere (settings/model.py's bound on a resource's `nodes`).
MAX_NODES = 100_000


def node_limit(resource: Resource) -> int:
    """The most nodes a run may span on `resource`."""
    if resource.executor == "ssh":
        return max(1, len(resource.hosts))
    if resource.executor == "slurm":
        return resource.nodes
    return 1  # a local resource is this one machine, whatever `nodes` says


def unfit_nodes(resource: Resource, nodes: int) -> str | None:
    """Why `resource` cannot take a run over `nodes` nodes, or None when it can."""
    limit = node_limit(resource)
    if nodes <= limit:
        return None
    if resource.executor == "ssh":
        return f"{nodes} nodes asked, it lists {limit} host{'s' if limit != 1 else ''}"
    if resource.executor == "slurm":
        return f"{nodes} nodes asked, it declares nodes = {limit}"
    if resource.executor == "kubernetes":
        return f"{nodes} nodes asked, it runs one pod an attempt"
    return f"{nodes} nodes asked, it is one machine"


def check_nodes(resource: Resource, nodes: int, field: str = "--nodes") -> int:
    """`nodes` when `resource` can take a run over that many nodes; InputError naming `field` otherwise."""
    if not 1 <= nodes <= MAX_NODES:
        raise InputError(f"{field} {nodes}: expected a whole number from 1 to {MAX_NODES}")
    limit = node_limit(resource)
    if nodes > limit:
        if resource.executor == "local":
            where = f"resource {resource.name!r} is one machine (executor local)"
        elif resource.executor == "kubernetes":
            where = f"resource {resource.name!r} runs one pod an attempt (executor kubernetes)"
        elif resource.executor == "ssh":
            where = f"resource {resource.name!r} lists {limit} host{'s' if limit != 1 else ''}"
        else:
            where = f"resource {resource.name!r} declares nodes = {limit}"
        raise InputError(f"{field} {nodes}: expected 1 to {limit}; {where}")
    return nodes
