"""The shim samples the attempt's process tree into the spool; `memory_growing` reads it for any script."""

import json
import sys
from pathlib import Path

from sqlalchemy import func, select

from trackway.executors.node_sampler import SAMPLES_FILE, newest_sample, parse_nvidia_smi, tree_usage
from trackway.ledger import open_ledger
from trackway.ledger.schema import metric_points, metric_series

SCRIPT = str(Path(__file__).parent / "scripts" / "tree_grows.py")


def test_a_child_that_leaks_ends_the_attempt_when_memory_growing_is_in_stop_on(cli, home, ledger_url, monkeypatch):
    monkeypatch.setenv("TRACKWAY_NODE_SAMPLE_S", "0.5")
    Path("trackway.toml").write_text('[supervisor]\nstop_on = ["memory_growing"]\n')
    result = cli("submit", "--name", "leaky", "--metric-pattern", r"step (?P<step>\d+) loss (?P<loss>\S+)",
                 "--", sys.executable, SCRIPT)
    assert result.code == 1, result.err
    (attempt,) = cli("attempts", "leaky", "--json").json()
    assert attempt["termination_reason"] == "watcher_stop"
    assert attempt["termination_evidence"]["rule"] == "watcher:memory_growing"
    said = attempt["termination_evidence"]["lines"][0]
    assert said.startswith("host memory growing: RSS") and "rule: ×2 and +1 GiB" in said
    assert attempt["last_step"] < 1100  # stopped while it ran: the script's own parent stayed small
    (path,) = home.glob(f"runs/*/attempts/1/spool/{SAMPLES_FILE}")
    samples = [json.loads(line) for line in path.read_text().splitlines()]
    assert max(s["processes"] for s in samples) >= 2 and max(s["rss_bytes"] for s in samples) > 1 << 30
    assert all("gpus" not in s for s in samples)  # no nvidia-smi here: no GPU readings, never zeros
    # In the ledger as the run's series, at the step reached: what `metrics` and the gate read.
    ledger = open_ledger(ledger_url)
    try:
        with ledger.read() as conn:
            keys = {key for (key,) in conn.execute(select(metric_series.c.key))}
            top = conn.execute(select(func.max(metric_points.c.value)).join(
                metric_series, metric_points.c.series_id == metric_series.c.series_id)
                .where(metric_series.c.key == "node/rss_bytes")).scalar()
    finally:
        ledger.dispose()
    assert {"node/rss_bytes", "node/cpu_seconds", "loss"} <= keys and top > 1 << 30


def test_tree_usage_sums_the_processes_it_can_read(tmp_path):
    import os

    rss, cpu, read = tree_usage([os.getpid(), 2**22 + 7])  # the second is no process
    assert read == 1 and rss > 10 << 20 and cpu > 0


def test_nvidia_smi_lines_become_readings_and_na_is_skipped():
    text = "0, 97, 40960\n1, [N/A], 1024\n2, 3, 512\n"
    assert parse_nvidia_smi(text) == [{"index": 0, "util": 97.0, "memory_bytes": 40960 << 20},
                                      {"index": 2, "util": 3.0, "memory_bytes": 512 << 20}]


def test_a_line_still_being_written_is_not_read_as_a_sample(tmp_path):
    (tmp_path / SAMPLES_FILE).write_text('{"t": 1, "rss_bytes": 5}\n{"t": 2, "rss_b')
    assert newest_sample(tmp_path) == {"t": 1, "rss_bytes": 5}
    assert newest_sample(tmp_path / "absent") is None


def test_samples_become_the_runs_node_series_at_the_step_reached():
    from trackway.supervisor.node_samples import sample_metrics

    assert sample_metrics({"t": 1.0, "rss_bytes": 5, "cpu_seconds": 2.5, "processes": 2,
                           "gpus": [{"index": 3, "util": 97.0, "memory_bytes": 1024}]}) == {
        "node/rss_bytes": 5.0, "node/cpu_seconds": 2.5, "node/gpu_util/gpu3": 97.0,
        "node/gpu_memory_bytes/gpu3": 1024.0}
    assert sample_metrics({"t": 1.0, "rss_bytes": True}) == {}
