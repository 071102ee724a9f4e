"""What the shim samples of the node an attempt runs on: its process tree's memory and CPU time, and the GPUs.

Stdlib only: copied beside the shim wherever the shim goes (a Slurm job's state directory, an SSH
host's support directory), where trackway is not installed. The shim calls `NodeSamples.maybe()`
from its wait loop; every `every_s` it appends one JSON line to `spool/node-samples.jsonl`:

    {"t": 1764352000.1, "rss_bytes": 512000000, "cpu_seconds": 81.2, "processes": 3,
     "gpus": [{"index": 0, "util": 97.0, "memory_bytes": 41000000000}], "gpu_source": "nvidia-smi"}

`gpus` is absent where no GPU can be read (no `nvidia-smi` on the node): never zeros. The CPU time
is that of the processes alive at the sample: a child that exited took its CPU time with it, so the
figure can step down; the supervisor reads the newest line. A sample never fails the job: the first
error is said once in the shim's log and sampling stops.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

SAMPLES_FILE = "node-samples.jsonl"
EVERY_S = 10.0
EVERY_ENV = "TRACKWAY_NODE_SAMPLE_S"  # another interval (the tests sample every half second)
MAX_BYTES = 1 << 20  # then moved aside to .1: a week of samples every 10 s would be 10 MB
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
NVIDIA_SMI_TIMEOUT_S = 5.0


def tree_usage(pids: list[int]) -> tuple[int, float, int]:
    """(resident bytes, CPU seconds, processes read) summed over `pids`; a process gone meanwhile is skipped."""
    rss, cpu, read = 0, 0.0, 0
    for pid in pids:
        try:
            resident = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
            stat = Path(f"/proc/{pid}/stat").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        fields = stat.rsplit(b")", 1)[1].split()
        rss += resident * PAGE
        cpu += (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime (fields 14, 15 of stat)
        read += 1
    return rss, cpu, read


def parse_nvidia_smi(text: str) -> list[dict]:
    """`nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader,nounits` as GPU readings."""
    gpus = []
    for line in text.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) != 3:
            continue
        try:
            gpus.append({"index": int(parts[0]), "util": float(parts[1]), "memory_bytes": int(float(parts[2]) * 2**20)})
        except ValueError:
            continue  # "[N/A]" for a GPU that cannot say
    return gpus


def gpu_readings(visible: list[int]) -> list[dict] | None:
    """The attempt's GPUs' utilization and memory through nvidia-smi; None for an attempt given no GPU (the node's
    other GPUs are not its business) or where nvidia-smi is not on the node."""
    smi = shutil.which("nvidia-smi")
    if smi is None or not visible:
        return None
    out = subprocess.run([smi, "--query-gpu=index,utilization.gpu,memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=False)
    gpus = parse_nvidia_smi(out.stdout) if out.returncode == 0 else []
    return [g for g in gpus if g["index"] in visible] or None


class NodeSamples:
    """Appends a sample of the job's processes (found by `find`) and GPUs to the spool every `every_s`."""

    def __init__(self, spool: Path, find: Callable[[], list[int]], visible_gpus: list[int],
                 say: Callable[[str], None], every_s: float | None = None) -> None:
        self.path = spool / SAMPLES_FILE
        self.find, self.visible, self.say = find, visible_gpus, say
        try:
            self.every_s = every_s or max(0.1, float(os.environ.get(EVERY_ENV) or EVERY_S))
        except ValueError:
            self.every_s = EVERY_S
        self.next_at = 0.0
        self.broken = False

    def maybe(self) -> None:
        now = time.monotonic()
        if self.broken or now < self.next_at:
            return
        self.next_at = now + self.every_s
        try:
            self._append(self.sample())
        except Exception as exc:  # noqa: BLE001 - a sample must never end the job
            self.broken = True
            self.say(f"node samples stopped: {type(exc).__name__}: {exc}")

    def sample(self) -> dict:
        rss, cpu, read = tree_usage(self.find())
        sample = {"t": time.time(), "rss_bytes": rss, "cpu_seconds": round(cpu, 2), "processes": read}
        gpus = gpu_readings(self.visible)
        if gpus:
            sample["gpus"], sample["gpu_source"] = gpus, "nvidia-smi"
        return sample

    def _append(self, sample: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists() and self.path.stat().st_size > MAX_BYTES:
            os.replace(self.path, self.path.with_name(SAMPLES_FILE + ".1"))
        # One write of one whole line: a reader never takes a torn line for a sample (it drops a last line
        # without its newline).
        with open(self.path, "a", encoding="utf-8") as out:
            out.write(json.dumps(sample, separators=(",", ":")) + "\n")


def newest_sample(spool: str | os.PathLike, max_bytes: int = 8192) -> dict | None:
    """The last whole line of the spool's samples, or None."""
    # os.open and one pread, not a file object: the supervisor asks this of every running attempt it watches.
    try:
        fd = os.open(os.path.join(spool, SAMPLES_FILE), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        tail = os.pread(fd, min(size, max_bytes), max(0, size - max_bytes))
    except OSError:
        return None
    finally:
        os.close(fd)
    lines = tail.split(b"\n")[:-1]  # whatever follows the last newline is still being written
    for line in reversed(lines):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None
