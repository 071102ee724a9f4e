"""The resources trackway.toml declares: `[resources.NAME]` tables, read and checked into `Resource`s.

    [resources.ailab]
    executor = "slurm"            # local | slurm | ssh
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

A bad entry is refused with one line naming the file, the line, the field and what was expected.
This module imports nothing beyond the standard library and trackway's errors: every command
reads trackway.toml, and none should pay for more.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trackway.errors import InputError

EXECUTORS = ("local", "slurm", "ssh")
RUN_KINDS = ("test", "full", "eval")
MAX_GPUS_PER_NODE = 1024
MAX_NODES = 100_000
_HOST = re.compile(r"^(?:[A-Za-z0-9._-]+@)?(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::\d{1,5})?$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# Options trackway sets itself in the sbatch script; a resource's own `sbatch` list must not fight them.
SBATCH_OWNED = ("--signal", "--requeue", "--no-requeue", "--output", "--error", "--open-mode", "--job-name",
                "--time", "--qos", "--partition", "--account", "--nodes", "--gres", "--gpus", "--chdir", "--parsable")


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


def parse_resources(doc: dict[str, Any], path: Path, text: str = "") -> dict[str, Resource]:
    """Every `[resources.NAME]` in a parsed trackway.toml (`text` is its source, for line numbers)."""
    tables = doc.get("resources") or {}
    where = _Locator(path, text)
    if not isinstance(tables, dict):
        raise where.error(("resources",), None, "expected tables [resources.NAME]")
    return {name: _resource(name, body, where) for name, body in tables.items()}


def _resource(name: str, body: Any, where: _Locator) -> Resource:
    table = ("resources", name)
    if not _NAME.match(name):
        raise where.error(table, None, "a resource name: letters, digits, '_', '.', '-' (up to 64), first a letter or digit")
    if not isinstance(body, dict):
        raise where.error(table, None, "expected a table")
    known = {f.name for f in Resource.__dataclass_fields__.values()} - {"name", "declared"}
    for key in body:
        if key not in known:
            raise where.error(table, key, f"not a resource field (known: {', '.join(sorted(known))})")
    get = _Fields(body, table, where)
    executor = get.choice("executor", EXECUTORS, "local")
    use_for = get.strings("use_for", RUN_KINDS) or RUN_KINDS
    for kind in use_for:
        if kind not in RUN_KINDS:
            raise where.error(table, "use_for", f"expected run kinds among {', '.join(RUN_KINDS)}, got {kind!r}")
    slurm_only = [key for key in ("partition", "account", "qos", "sbatch") if key in body]
    if executor != "slurm" and slurm_only:
        raise where.error(table, slurm_only[0], f"a Slurm setting, but executor is {executor!r}")
    if executor == "local" and "setup" in body:
        raise where.error(table, "setup", "a Slurm or SSH setting, but executor is 'local'")
    ssh_only = [key for key in ("hosts", "key_file", "workdir", "python", "ssh_options", "forward_env",
                                "unreachable_seconds")
                if key in body]
    if executor != "ssh" and ssh_only:
        raise where.error(table, ssh_only[0], f"an SSH setting, but executor is {executor!r}")
    hosts = get.strings("hosts", None)
    if executor == "ssh" and not hosts:
        raise where.error(table, "hosts" if "hosts" in body else None,
                          "executor 'ssh' needs hosts = [\"user@host:port\", ...]")
    for spec in hosts:
        if not _HOST.match(spec):
            raise where.error(table, "hosts", f"expected user@host or user@host:port, got {spec!r}")
    ssh_options = get.strings("ssh_options", None)
    for option in ssh_options:
        if "\n" in option or option in ("-O", "-M", "-S", "-f", "-N"):
            raise where.error(table, "ssh_options", f"{option!r} is set by trackway or would stop it working")
    sbatch = get.strings("sbatch", None)
    for option in sbatch:
        if not option.startswith("-") or "\n" in option:
            raise where.error(table, "sbatch", f"expected sbatch options such as '--constraint=b200', got {option!r}")
        if option.split("=", 1)[0] in SBATCH_OWNED:
            raise where.error(table, "sbatch", f"{option.split('=', 1)[0]} is set by trackway (or by its own field)")
    return Resource(
        name=name,
        executor=executor,
        gpu=get.text("gpu"),
        gpu_memory_gb=get.number("gpu_memory_gb", None, 0.0, 10_000.0, "GB", low_open=True),
        gpus_per_node=get.whole("gpus_per_node", None, 0, MAX_GPUS_PER_NODE),
        nodes=get.whole("nodes", 1, 1, MAX_NODES),
        cost_per_gpu_hour=get.number("cost_per_gpu_hour", 0.0, 0.0, 1e6, "dollars per GPU-hour"),
        preemptible=get.flag("preemptible", False),
        grace_seconds=get.number("grace_seconds", 30.0, 0.0, 86400.0, "seconds"),
        use_for=tuple(use_for),
        partition=get.text("partition"),
        account=get.text("account"),
        qos=_qos_tiers(body.get("qos"), table, where),
        sbatch=tuple(sbatch),
        setup=get.text("setup", multiline=True),
        hosts=tuple(dict.fromkeys(hosts)),
        key_file=get.text("key_file"),
        workdir=get.text("workdir") or "trackway",
        python=get.text("python") or "python3",
        ssh_options=tuple(ssh_options),
        forward_env=tuple(_env_patterns(get.strings("forward_env", None), table, where)),
        unreachable_seconds=get.number("unreachable_seconds", 600.0, 0.0, 7 * 86400.0, "seconds"),
        checkpoint_root=get.text("checkpoint_root"),
    )


def _env_patterns(patterns: list[str], table: tuple[str, ...], where: _Locator) -> list[str]:
    for pattern in patterns:
        if not re.match(r"^[A-Za-z_*?][A-Za-z0-9_*?]*$", pattern):
            raise where.error(table, "forward_env", f"expected variable names or globs such as AWS_*, got {pattern!r}")
    return patterns


def _qos_tiers(value: Any, table: tuple[str, ...], where: _Locator) -> tuple[QosTier, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise where.error(table, "qos", "expected [[resources.NAME.qos]] tables with name and max_hours")
    tiers = []
    for index, item in enumerate(value):
        tier_table = (*table, "qos", str(index))
        for key in item:
            if key not in ("name", "max_hours"):
                raise where.error(tier_table, key, "not a QoS field (known: max_hours, name)")
        get = _Fields(item, tier_table, where)
        name = get.text("name")
        if name is None:
            raise where.error(tier_table, None, "expected name = \"...\" in each [[resources.NAME.qos]]")
        hours = get.number("max_hours", None, 0.0, 10 * 365 * 24.0, "hours", low_open=True)
        if hours is None:
            raise where.error(tier_table, None, f"QoS {name!r}: expected max_hours = <hours>")
        tiers.append(QosTier(name, hours))
    names = [tier.name for tier in tiers]
    if len(set(names)) != len(names):
        raise where.error(table, "qos", f"expected each QoS once, got {', '.join(names)}")
    return tuple(sorted(tiers, key=lambda tier: tier.max_hours))


class _Fields:
    """Typed reads of one table's fields, each refused with the file, line and field when wrong."""

    def __init__(self, body: dict[str, Any], table: tuple[str, ...], where: _Locator):
        self.body, self.table, self.where = body, table, where

    def _fail(self, key: str, expected: str) -> InputError:
        return self.where.error(self.table, key, f"expected {expected}, got {self.body[key]!r}")

    def choice(self, key: str, options: tuple[str, ...], default: str) -> str:
        value = self.body.get(key, default)
        if value not in options:
            raise self._fail(key, " or ".join(repr(option) for option in options))
        return value

    def text(self, key: str, multiline: bool = False) -> str | None:
        value = self.body.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip() or (not multiline and any(c in value for c in "\n\r\0")):
            raise self._fail(key, "a non-empty string" + ("" if multiline else " on one line"))
        return value

    def strings(self, key: str, options: tuple[str, ...] | None) -> list[str]:
        value = self.body.get(key, [])
        if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
            raise self._fail(key, f"a list of strings{' among ' + ', '.join(options) if options else ''}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.body.get(key, default)
        if not isinstance(value, bool):
            raise self._fail(key, "true or false")
        return value

    def whole(self, key: str, default: int | None, low: int, high: int) -> int | None:
        value = self.body.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self._fail(key, f"a whole number from {low} to {high}")
        return value

    def number(
        self, key: str, default: float | None, low: float, high: float, unit: str, low_open: bool = False
    ) -> float | None:
        value = self.body.get(key, default)
        if value is None:
            return None
        below = (value <= low if low_open else value < low) if isinstance(value, int | float) else True
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or below \
                or value > high:
            bound = f"above {low:g} and at most" if low_open else f"from {low:g} to"
            raise self._fail(key, f"a number of {unit} {bound} {high:g}")
        return float(value)


class _Locator:
    """Finds the line of a table's field in trackway.toml's text, so that an error can point at it.

    tomllib keeps no positions; the text is scanned for the table's header and then the key, which
    is right for every trackway.toml written by hand (dotted keys and inline tables fall back to
    the header's line, or to none).
    """

    def __init__(self, path: Path, text: str):
        self.path, self.lines = path, text.splitlines()

    def error(self, table: tuple[str, ...], key: str | None, message: str) -> InputError:
        line = self._line(table, key)
        place = f"{self.path}:{line}" if line else str(self.path)
        shown = _table_name(table) + (f" {key}" if key else "")
        return InputError(f"{place}: {shown}: {message}")

    def _line(self, table: tuple[str, ...], key: str | None) -> int | None:
        header, index = _header(table)
        seen = -1
        start = None
        for number, raw in enumerate(self.lines, 1):
            line = raw.split("#", 1)[0].strip()
            if not line.startswith("["):
                if start is not None and key and re.match(rf"^\"?{re.escape(key)}\"?\s*=", line):
                    return number
                continue
            if start is not None:  # the next table: the key was not in ours
                return start
            if _normalize(line) == header:
                seen += 1
                if seen == index:
                    start = number
        return start


def _header(table: tuple[str, ...]) -> tuple[str, int]:
    """The header text of a table path (`[[resources.a.qos]]` for ('resources', 'a', 'qos', '1')) and its index."""
    if len(table) == 4 and table[2] == "qos":
        return f"[[{'.'.join(table[:3])}]]", int(table[3])
    return f"[{'.'.join(table)}]", 0


def _normalize(header: str) -> str:
    return re.sub(r"\s+", "", header).replace('"', "")


def _table_name(table: tuple[str, ...]) -> str:
    if len(table) == 4 and table[2] == "qos":
        return f"[[{'.'.join(table[:3])}]] #{int(table[3]) + 1}"
    return f"[{'.'.join(table)}]"


def parse_selection(doc: dict[str, Any], path: Path, text: str, resources: dict[str, Resource]) -> dict[str, tuple[str, ...]]:
    """`[selection]`: for each run kind, the resources in the order they are preferred."""
    table = doc.get("selection") or {}
    where = _Locator(path, text)
    if not isinstance(table, dict):
        raise where.error(("selection",), None, "expected a table of run kinds to lists of resources")
    order: dict[str, tuple[str, ...]] = {}
    for kind, names in table.items():
        if kind not in RUN_KINDS:
            raise where.error(("selection",), kind, f"expected a run kind among {', '.join(RUN_KINDS)}")
        if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
            raise where.error(("selection",), kind, f"expected a list of resource names, got {names!r}")
        for name in names:
            if name not in resources and name != "local":
                declared = ", ".join(sorted(resources)) or "none"
                raise where.error(("selection",), kind, f"{name!r} is not a declared resource (declared: {declared})")
        order[kind] = tuple(dict.fromkeys(names))
    return order
