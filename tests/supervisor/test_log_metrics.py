"""Scripts without the SDK still leave metrics: log patterns read from output.log, and a NaN there ends the attempt."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import pytest

from trackway.errors import InputError
from trackway.ledger import open_ledger
from trackway.ledger.records import get_attempt
from trackway.settings import load_settings
from trackway.supervisor.log_metrics import compile_patterns, ingest_log_metrics, is_loss_name, parse_text, split_log_line
from trackway.supervisor.watchers import STOP_MARKER

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "nanogpt_style.py"
PATTERN = r"iter (?P<step>\d+): loss (?P<loss>\S+), time (?P<time_ms>[\d.]+)ms"
GPU_PATTERN = r"GPU (?P<gpu>\d+): (?P<gpu_mem_gb>[\d.]+)GB / [\d.]+GB allocated \((?P<gpu_util>[\d.]+)% utilization\)"
DEADLINE_S = 240  # generous: a busy 2-core machine


def _supervise_until(cli, done, deadline_s: float = DEADLINE_S):
    deadline = time.time() + deadline_s
    while time.time() < deadline:
        result = cli("supervise", "--once")
        assert result.code == 0, result.err
        value = done()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError("the run did not get there before the deadline")


def _finish(cli, run: str) -> None:
    """Leave no process behind: cancel what still runs (a retry the policy started) and record its end."""
    runs = {r["name"]: r for r in cli("runs", "--json").json()}
    if runs.get(run, {}).get("state") in ("running", "queued"):
        cli("cancel", run)
        _supervise_until(cli, lambda: all(a["state"] == "ended" for a in _attempts(cli, run)))


def _attempts(cli, run: str) -> list[dict]:
    result = cli("attempts", run, "--json")
    assert result.code == 0, result.err
    return result.json()


def _ended(cli, run: str, count: int = 1):
    def check():
        attempts = _attempts(cli, run)
        ended = [a for a in attempts if a["state"] == "ended"]
        return attempts if len(ended) >= count else None

    return check


# -- pure parts -----------------------------------------------------------------------------------


def test_patterns_name_the_step_and_metrics():
    (regex,) = compile_patterns([PATTERN])
    assert parse_text("iter 120: loss 3.2145, time 42.1ms", [regex]) == [(120, {"loss": 3.2145, "time_ms": 42.1})]
    assert parse_text("step 7 nothing", [regex]) == []
    (nan,) = parse_text("iter 3: loss nan, time 1.0ms", [regex])
    assert nan[0] == 3 and math.isnan(nan[1]["loss"])
    # A trailing comma is not part of the number; a value that is no number is left out.
    (loose,) = compile_patterns([r"it=(?P<step>\d+) loss=(?P<loss>\S+) lr=(?P<lr>\S+)"])
    assert parse_text("it=5 loss=0.5, lr=abc", [loose]) == [(5, {"loss": 0.5})]
    assert split_log_line(b"2026-11-24T21:50:28.123456Z out iter 1: loss 2.0")[1] == "iter 1: loss 2.0"
    assert split_log_line(b"no prefix here") == (None, "no prefix here")
    assert [is_loss_name(k) for k in ("loss", "val_loss", "train/loss", "lossy", "lr")] == [True, True, True, False, False]


@pytest.mark.parametrize(
    ("pattern", "words"),
    [
        ("iter (?P<step", "not a valid regular expression"),
        (r"iter (?P<n>\d+): loss (?P<loss>\S+)", "named group for the step"),
        (r"iter (?P<step>\d+)", "besides (?P<step>...)"),
    ],
)
def test_bad_pattern_exits_2_naming_the_option_and_records_nothing(cli, pattern, words):
    result = cli("submit", "--metric-pattern", pattern, "--", sys.executable, "-c", "pass")
    assert result.code == 2
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and "--metric-pattern" in lines[0] and words in lines[0], result.err
    assert cli("runs", "--json").json() == []


def test_bad_toml_pattern_names_the_table(cli):
    Path("trackway.toml").write_text("[logs]\nmetrics = ['loss (?P<loss>\\\\S+)']\n")
    result = cli("submit", "--", sys.executable, "-c", "pass")
    assert result.code == 2 and "[logs] metrics" in result.err, result.err


def test_compile_refuses_without_step():
    with pytest.raises(InputError, match="--metric-pattern.*step in at least one pattern"):
        compile_patterns([r"loss (?P<loss>\S+)"])
    with pytest.raises(InputError, match="besides"):
        compile_patterns([PATTERN, r"GPU (?P<gpu>\d+)"])  # a device index alone is no metric


def test_gpu_lines_without_a_step_are_kept_per_device():
    regexes = compile_patterns([PATTERN, GPU_PATTERN])
    line = "GPU 1: 45.2GB / 141GB allocated (32.0% utilization)"
    assert parse_text(line, regexes) == [(None, {"gpu_mem_gb/gpu1": 45.2, "gpu_util/gpu1": 32.0})]
    assert parse_text("GPU x: 1GB / 2GB allocated (3% utilization)", regexes) == []  # no device number


def test_a_stepless_pattern_alone_exits_2_and_records_nothing(cli):
    result = cli("submit", "--metric-pattern", GPU_PATTERN, "--", sys.executable, "-c", "pass")
    assert result.code == 2
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and "--metric-pattern" in lines[0] and "step in at least one pattern" in lines[0], result.err
    assert cli("runs", "--json").json() == []


# -- through the real CLI, real processes ----------------------------------------------------------


def test_log_metrics_reach_the_ledger_once(cli):
    submitted = cli(
        "submit", "--detach", "--name", "nano", "--metric-pattern", PATTERN, "--",
        sys.executable, str(EXAMPLE), "--max-iters", "40", "--delay", "0.01", "--ckpt-every", "1000",
    )
    assert submitted.code == 0, submitted.err
    (attempt,) = _supervise_until(cli, _ended(cli, "nano"))
    assert attempt["termination_reason"] == "completed"
    points = cli("metrics", "nano", "--key", "loss", "--json").json()
    assert [p["step"] for p in points] == list(range(41))
    assert all(p["attempt_number"] == 1 and math.isfinite(p["value"]) for p in points)
    # What the pattern names; a run past 10 s (a loaded machine) also has the shim's node/ samples beside them.
    logged = {p["key"] for p in cli("metrics", "nano", "--json").json() if not p["key"].startswith("node/")}
    assert logged == {"loss", "time_ms"}
    assert (attempt["first_step"], attempt["last_step"]) == (0, 40)

    # The offset is durable: another supervisor (a fresh process's view) reads nothing twice.
    settings = load_settings()
    ledger = open_ledger(settings.db_url)
    try:
        with ledger.read() as conn:
            row = get_attempt(conn, attempt["attempt_id"])
        again = ingest_log_metrics(ledger, row, [PATTERN])
        assert again.points == 0 and again.lines == 0
    finally:
        ledger.dispose()
    assert len(cli("metrics", "nano", "--key", "loss", "--json").json()) == 41


def test_patterns_from_trackway_toml(cli):
    Path("trackway.toml").write_text("[logs]\nmetrics = ['iter (?P<step>\\d+): loss (?P<loss>\\S+),']\n")
    submitted = cli("submit", "--detach", "--name", "toml", "--", sys.executable, str(EXAMPLE),
                    "--max-iters", "5", "--delay", "0", "--ckpt-every", "1000")
    assert submitted.code == 0, submitted.err
    _supervise_until(cli, _ended(cli, "toml"))
    assert [p["step"] for p in cli("metrics", "toml", "--key", "loss", "--json").json()] == [0, 1, 2, 3, 4, 5]


GPU_SCRIPT = """
import sys, time
print("GPU 0: 0.5GB / 141GB allocated (1.0% utilization)", flush=True)  # before any step: nothing to attach to
for step in range(1, 4):
    print(f"iter {step}: loss {1.0 / step}, time 1.0ms", flush=True)
    print(f"GPU 0: {40 + step}.5GB / 141GB allocated ({step}.0% utilization)", flush=True)
    print(f"GPU 1: {50 + step}.5GB / 141GB allocated ({step}.5% utilization)", flush=True)
time.sleep(float(sys.argv[1]))
"""


def test_gpu_lines_become_series_at_the_last_step_and_the_watcher_reads_them(cli, home):
    script = Path("gpu_log.py")
    script.write_text(GPU_SCRIPT)
    Path("trackway.toml").write_text('[watchers.gpu_underused]\nthreshold = 20\nduration = "2s"\n')
    submitted = cli("submit", "--detach", "--name", "gpus", "--metric-pattern", PATTERN, "--metric-pattern",
                    GPU_PATTERN, "--", sys.executable, str(script), "30")
    assert submitted.code == 0, submitted.err

    def gpu_finding():
        found = cli("sql", "--json", "SELECT payload FROM attempt_events WHERE kind = 'gpu_underused'")
        assert found.code == 0, found.err
        return found.json()

    (finding,) = _supervise_until(cli, gpu_finding)
    message = json.loads(finding["payload"])["message"]
    # Not NVML (no GPU here): what the script printed, below the 20 % threshold on both devices for 2 s.
    assert "GPU utilization low for " in message and ": 3%, 3.5% now (from the run's gpu_util metric)" in message
    assert "rule: below 20% for 2 s" in message, message
    by_key: dict[str, dict[int, float]] = {}
    for point in cli("metrics", "gpus", "--json").json():
        by_key.setdefault(point["key"], {})[point["step"]] = point["value"]
    assert by_key["gpu_mem_gb/gpu0"] == {1: 41.5, 2: 42.5, 3: 43.5}  # the 0.5 GB line before step 1 is not kept
    assert by_key["gpu_util/gpu1"] == {1: 1.5, 2: 2.5, 3: 3.5}
    assert by_key["loss"][3] == pytest.approx(1 / 3)
    _finish(cli, "gpus")


def _stop_marker(attempt: dict) -> dict:
    state_dir = Path(attempt["log_path"]).parent
    return json.loads((state_dir / STOP_MARKER).read_text())


def test_loss_nan_in_the_log_ends_a_running_attempt(cli):
    submitted = cli(
        "submit", "--detach", "--name", "diverged", "--metric-pattern", PATTERN, "--",
        sys.executable, str(EXAMPLE), "--max-iters", "100000", "--delay", "0.02", "--nan-from", "30",
        "--ckpt-every", "1000",
    )
    assert submitted.code == 0, submitted.err
    attempt = _supervise_until(cli, _ended(cli, "diverged"))[0]
    marker = _stop_marker(attempt)
    assert marker["kind"] == "nan_in_log"
    assert "loss is nan at step 30" in marker["why"] and "iter 30: loss nan" in marker["why"]
    evidence = attempt["termination_evidence"]
    assert evidence["rule"] == "watcher:nan_in_log"
    assert any("loss is nan at step 30" in line for line in evidence["lines"])
    assert attempt["termination_reason"] == "nan_loss"
    assert json.loads(attempt["retry_decision"])["action"] == "stop"
    assert attempt["last_step"] is None or attempt["last_step"] < 100000  # ended, not run to its end
    assert len(_attempts(cli, "diverged")) == 1
    by_step = {p["step"]: p["value"] for p in cli("metrics", "diverged", "--key", "loss", "--json").json()}
    assert by_step[30] is None and all(by_step[s] is not None for s in range(30))  # NaN is stored as null
    assert {r["name"]: r["state"] for r in cli("runs", "--json").json()}["diverged"] == "failed"
    _finish(cli, "diverged")


def test_loss_nan_then_exit_0_is_not_completed(cli, home):
    # Over before any tick saw it: the end is still the NaN's.
    submitted = cli(
        "submit", "--detach", "--name", "nan-exit0", "--metric-pattern", PATTERN, "--",
        sys.executable, str(EXAMPLE), "--max-iters", "12", "--delay", "0", "--nan-from", "5", "--ckpt-every", "1000",
    )
    assert submitted.code == 0, submitted.err
    # Wait for the process to end without looking through trackway (every listing reconciles).
    exit_file = home / "runs" / submitted.out.strip() / "attempts" / "1" / "exit.json"
    deadline = time.time() + DEADLINE_S
    while not exit_file.exists() and time.time() < deadline:
        time.sleep(0.2)
    attempt = _supervise_until(cli, _ended(cli, "nan-exit0"))[0]
    assert attempt["exit_code"] == 0
    assert _stop_marker(attempt)["kind"] == "nan_in_log"
    assert attempt["termination_evidence"]["rule"] == "watcher:nan_in_log"
    assert attempt["termination_reason"] == "nan_loss"
    assert json.loads(attempt["retry_decision"])["action"] == "stop"
    _finish(cli, "nan-exit0")


def test_a_declared_checkpoint_written_after_the_loss_went_nan_is_never_committed(cli):
    # nanoGPT-style: `iter N: loss nan` is printed, then ckpt.pt is saved in place. Before issue 30 that save
    # was committed and explain offered to resume from it (every weight NaN).
    submitted = cli(
        "submit", "--detach", "--name", "nanckpt", "--metric-pattern", PATTERN, "--checkpoint-path", "out/ckpt.pt",
        "--", sys.executable, str(EXAMPLE), "--max-iters", "100000", "--delay", "0.05", "--nan-from", "30",
        "--ckpt-every", "10",
    )
    assert submitted.code == 0, submitted.err
    attempt = _supervise_until(cli, _ended(cli, "nanckpt"))[0]
    assert attempt["termination_reason"] == "nan_loss"
    marker = _stop_marker(attempt)
    assert marker["kind"] == "nan_in_log" and marker["at"] <= marker["t"]
    import torch

    committed = [c for c in cli("checkpoints", "nanckpt", "--json").json() if c["state"] == "committed"]
    for checkpoint in committed:
        saved = torch.load(Path(checkpoint["path"]) / "payload" / "out" / "ckpt.pt", weights_only=True)
        assert saved["iter_num"] < 30, checkpoint  # written before the NaN line, or not at all
    # The file on disk was written after the NaN (iteration 30's save): it is what was refused.
    assert torch.load(Path.cwd() / "out" / "ckpt.pt", weights_only=True)["iter_num"] >= 30
    advice = cli("explain", "nanckpt", "--json").json()["next"]
    if committed:
        assert f"resumes from {committed[-1]['name']}" in advice
    _finish(cli, "nanckpt")
