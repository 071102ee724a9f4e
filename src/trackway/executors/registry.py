"""The executors by name: which module runs a resource's `executor = "..."`, imported only when it is asked for."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from trackway.errors import InputError
from trackway.executors.base import Executor


def _local(home: Path) -> Executor:
    from trackway.executors.local import LocalExecutor

    return LocalExecutor(home)


# Factories import their module on use, so that naming an executor never loads the others.
def _inline(home: Path) -> Executor:
    from trackway.executors.inline import InlineExecutor

    return InlineExecutor(home)


def _slurm(home: Path) -> Executor:
    from trackway.executors.slurm import SlurmExecutor

    return SlurmExecutor(home)


def _ssh(home: Path) -> Executor:
    from trackway.executors.ssh import SshExecutor

    return SshExecutor(home)


def _kubernetes(home: Path) -> Executor:
    # The client is an extra (pip install 'trackway[kubernetes]'), imported when a cluster is first asked.
    from trackway.executors.kubernetes import KubernetesExecutor

    return KubernetesExecutor(home)


_REGISTRY: dict[str, Callable[[Path], Executor]] = {"local": _local, "inline": _inline, "slurm": _slurm, "ssh": _ssh,
                                                     "kubernetes": _kubernetes}


def is_remote(name: str) -> bool:
    """Whether the executor called `name` runs commands on another machine (without importing it)."""
    return name in ("ssh", "kubernetes")


def known_executors() -> list[str]:
    return sorted(_REGISTRY)


def get_executor(name: str, home: Path) -> Executor:
    """The executor called `name`, keeping its state under `home`."""
    factory = _REGISTRY.get(name)
    if factory is None:
        raise InputError(f"executor {name!r}: expected one of {', '.join(known_executors())}")
    return factory(home)
