"""`trackway preflight` and the preflight at submit, end to end: the verdicts a user reads, the refusals, the
selection that passes over a resource that would OOM, calibration from recorded peaks, an OOM's numbers in explain."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from memory_cases import MOTIVATING, lognormal_values

PY = sys.executable
SHAPE = ["--layers", "32", "--hidden", "4096", "--heads", "32", "--ffn", "11008", "--vocab", "32000",
         "--batch-size", "4", "--sharding", "fsdp", "--world-size", "8", "--flash-attention"]
RESOURCES = """
[resources.h100box]
executor = "local"
gpu = "H100"
cost_per_gpu_hour = 2.0

[resources.h200box]
executor = "local"
gpu = "H200"
cost_per_gpu_hour = 3.5
"""


def _lengths(tmp_path: Path) -> Path:
    path = tmp_path / "lengths.txt"
    path.write_text("\n".join(map(str, lognormal_values(50_000))) + "\n")
    return path


def _config(tmp_path: Path, **changes) -> Path:
    values = {**MOTIVATING, "seq_lengths": str(_lengths(tmp_path)), **changes}
    path = tmp_path / "train.toml"
    path.write_text("[preflight]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items()))
    return path


def _flat(text: str) -> str:
    """Text as one line: explain and show wrap at the terminal's width."""
    return " ".join(text.split())


def _row(out: str, gpu: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(gpu + " "))


def test_the_motivating_case_on_the_known_gpus(cli_sqlite, tmp_path):
    result = cli_sqlite("preflight", *SHAPE, "--seq-lengths", str(_lengths(tmp_path)), "--max-length", "4096",
                        "--steps", "2500")
    assert result.code == 0, result.err
    h100 = _row(result.out, "H100").split()
    assert h100[2:8] == ["FITS", "0.81", "OOM", "1.12", "OOM", "1.12"]
    assert _row(result.out, "A100-80").split()[6:8] == ["OOM", "1.11"]
    assert _row(result.out, "H200").split()[6:8] == ["FITS", "0.63"]
    assert "total                          64." in result.out and "89.04" in result.out
    assert "of steps per GPU meet one" in result.out
    fixes = result.out.split("H100: OOM at the longest batch")[1].split("\n\n")[0]
    assert "1. micro-batch 2 with 2 gradient accumulation steps" in fixes
    assert "2. a token budget of 13,4" in fixes and "activation checkpointing" in fixes and "H200 (140.4 GiB)" in fixes

    data = cli_sqlite("preflight", *SHAPE, "--seq-lengths", str(_lengths(tmp_path)), "--max-length", "4096",
                      "--gpu", "h100", "--json").json()
    assert [t["name"] for t in data["targets"]] == ["H100"]
    assert data["targets"][0]["at"]["median"]["verdict"] == "FITS" and data["targets"][0]["verdict"] == "OOM"
    assert data["peak_gib"] == 89.041


def test_a_jsonl_dataset_and_a_hugging_face_config(cli_sqlite, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257}))
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"input_ids": [1] * n}) + "\n" for n in (100, 900, 1024)))
    result = cli_sqlite("preflight", "--model-config", str(tmp_path / "config.json"), "--data",
                        str(tmp_path / "train.jsonl"), "--length-field", "input_ids", "--batch-size", "8",
                        "--gpu", "RTX 5090", "--json")
    assert result.code == 0, result.err
    data = result.json()
    assert data["lengths"] == {"samples": 3, "longest": 1024, "median": 900, "cut_at_max_length": 0,
                               "whitespace_proxy": False}
    assert data["points"]["max"]["tokens"] == 8 * 1024


def test_bad_input_is_one_line_and_exit_2(cli_sqlite, tmp_path):
    for args, message in (
        ([*SHAPE, "--max-length", "8", "--batch-size", "0"], "--batch-size 0: expected a whole number from 1"),
        (["--hidden", "64", "--heads", "4", "--vocab", "10", "--max-length", "8"], "--layers: expected the model's layers"),
        ([*SHAPE, "--max-length", "8", "--gpu", "K80"], "--gpu 'K80': expected one of A100-80, H100"),
        ([*SHAPE, "--seq-lengths", str(tmp_path / "missing.txt")], "--seq-lengths"),
    ):
        result = cli_sqlite("preflight", *args)
        assert result.code == 2, (args, result.out)
        assert message in result.err and "Traceback" not in result.err and len(result.err.strip().splitlines()) == 1


def test_submit_passes_over_the_resource_that_would_oom_and_keeps_the_verdict(cli_sqlite, tmp_path):
    Path("trackway.toml").write_text(RESOURCES)
    result = cli_sqlite("submit", "--config", str(_config(tmp_path)), "--", PY, "-c", "print('trained')")
    assert result.code == 0, result.err
    assert "memory preflight: 89.0 GiB per GPU at the longest batch (4 × 4,096 tokens): h100box OOM 1.12, " \
           "h200box FITS 0.63" in result.err
    (run,) = cli_sqlite("runs", "--json").json()
    assert run["resource"] == "h200box"
    explained = _flat(cli_sqlite("explain", run["run_id"]).out)
    assert "h100box: the memory preflight predicts OOM: 89.0 GiB per GPU at the longest batch > 79.65 GiB (1.12)" in explained
    assert "preflight at submit (warn): 89.0 GiB per GPU at the longest batch" in explained
    assert "on h200box: FITS 0.63" in explained
    shown = _flat(cli_sqlite("show", run["run_id"]).out)
    assert "memory warn: 89.0 GiB per GPU at the longest batch (16,384 tokens, rows of 4,096): h100box OOM 1.12" in shown
    receipt = cli_sqlite("show", run["run_id"], "--json").json()["preflight"]
    assert receipt["mode"] == "warn" and receipt["report"]["peak_gib"] == 89.041


def test_strict_refuses_a_run_that_would_oom_and_records_nothing(cli_sqlite, tmp_path):
    Path("trackway.toml").write_text(RESOURCES)
    result = cli_sqlite("submit", "--strict", "--resource", "h100box", "--config", str(_config(tmp_path)), "--",
                        PY, "-c", "print('never')")
    assert result.code == 2
    assert result.err.strip().splitlines() == [
        "trackway: error: --strict: the memory preflight predicts OOM on h100box (79.65 GiB, 1.12): 89.0 GiB per GPU "
        "at the longest batch; it fits with micro-batch 2 with 2 gradient accumulation steps (the same effective "
        "batch of 4 per GPU); `trackway preflight` shows the breakdown"]
    assert cli_sqlite("runs", "--json").json() == []
    # With activation checkpointing the same run fits, and strict lets it through.
    fitted = _config(tmp_path, activation_checkpointing=True)
    result = cli_sqlite("submit", "--strict", "--resource", "h100box", "--config", str(fitted), "--", PY, "-c", "1")
    assert result.code == 0, result.err
    assert "h100box FITS 0.34" in result.err


def test_warn_runs_where_it_was_asked_and_says_it_would_oom(cli_sqlite, tmp_path):
    Path("trackway.toml").write_text(RESOURCES + '\n[preflight]\nmode = "warn"\nkeys = { batch_size = "train.micro_batch" }\n')
    config = tmp_path / "mapped.toml"
    config.write_text("[train]\nmicro_batch = 4\n")
    # No [preflight] section: trackway.toml's keys find the batch, and the shape is missing.
    result = cli_sqlite("submit", "--resource", "h100box", "--config", str(config), "--", PY, "-c", "1")
    assert result.code == 2
    assert "--config [preflight] layers: expected the model's layers" in result.err
    values = {k: v for k, v in MOTIVATING.items() if k != "batch_size"}
    config.write_text("[train]\nmicro_batch = 4\n[preflight]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items())
                      + f'seq_lengths = "{_lengths(tmp_path)}"\n')
    result = cli_sqlite("submit", "--resource", "h100box", "--config", str(config), "--set", "train.micro_batch=0",
                        "--", PY, "-c", "1")
    assert "--config train.micro_batch (trackway.toml [preflight] keys.batch_size) 0: expected a whole number" in result.err
    result = cli_sqlite("submit", "--resource", "h100box", "--config", str(config), "--", PY, "-c", "1")
    assert result.code == 0, result.err
    assert "h100box would run out of memory (asked for by name, it runs there anyway)" in result.err
    (run,) = cli_sqlite("runs", "--json").json()
    assert run["resource"] == "h100box"
    # The mapped batch follows --set: at micro-batch 2 it fits.
    result = cli_sqlite("submit", "--resource", "h100box", "--config", str(config), "--set", "train.micro_batch=2",
                        "--", PY, "-c", "1")
    assert result.code == 0 and "h100box FITS 0.65" in result.err


def _peak_script(tmp_path: Path) -> Path:
    """A script that records the event the SDK writes on a GPU (sdk/cuda_memory.py), with an H200 run's numbers."""
    script = tmp_path / "peak.py"
    script.write_text(
        "import trackway\nrun = trackway.init()\n"
        "run._writer.event('cuda_memory', devices=[{'device': 0, 'name': 'NVIDIA H200', 'total_bytes': 150754820096,"
        " 'max_allocated_bytes': 85 * 2**30, 'max_reserved_bytes': 91 * 2**30}])\n"
        "run.log({'loss': 1.0}, step=1)\nrun.finish()\n")
    return script


def test_calibration_from_recorded_peaks_corrects_later_estimates(cli_sqlite, tmp_path):
    Path("trackway.toml").write_text(RESOURCES)
    script = _peak_script(tmp_path)
    assert cli_sqlite("submit", "--name", "cal", "--model-family", "llama2", "--config", str(_config(tmp_path)),
                      "--", PY, str(script)).code == 0
    result = cli_sqlite("preflight", "--calibrate", "cal", "--json")
    assert result.code == 0, result.err
    facts = result.json()
    assert abs(facts["estimated_gib"] - 87.541) < 1e-3  # 89.04 less the 1.5 GiB of context
    assert abs(facts["factor"] - 91 / facts["estimated_gib"]) < 1e-9
    assert facts["model_family"] == "llama2" and facts["precision"] == "bf16-mixed"

    later = cli_sqlite("preflight", *SHAPE, "--max-length", "4096", "--model-family", "llama2", "--gpu", "H200", "--json").json()
    assert later["correction"]["factor"] == facts["factor"]
    assert abs(later["peak_gib"] - (1.5 + 87.541 * facts["factor"])) < 1e-3
    plain = cli_sqlite("preflight", *SHAPE, "--max-length", "4096", "--model-family", "llama2", "--uncalibrated",
                       "--json").json()
    assert plain["correction"] is None and plain["peak_gib"] == 89.041
    explained = _flat(cli_sqlite("explain", "cal").out)
    assert "measured peak: 91.00 GiB reserved, 85.00 GiB allocated by PyTorch on NVIDIA H200" in explained

    nothing = cli_sqlite("submit", "--name", "cpu", "--", PY, "-c", "1")
    assert nothing.code == 0
    refused = cli_sqlite("preflight", "--calibrate", "cpu")
    assert refused.code == 2 and "no measured GPU peak" in refused.err


def test_a_run_without_a_preflight_is_calibrated_from_the_shape_given_on_the_command_line(cli_sqlite, tmp_path):
    Path("trackway.toml").write_text(RESOURCES)
    script = _peak_script(tmp_path)
    assert cli_sqlite("submit", "--name", "bare", "--model-family", "llama2", "--", PY, str(script)).code == 0
    # A bad value is named as typed on this command line.
    bad = [("0" if previous == "--batch-size" else word) for previous, word in zip(["", *SHAPE], SHAPE)]
    refused = cli_sqlite("preflight", "--calibrate", "bare", *bad, "--max-length", "4096")
    assert refused.code == 2 and refused.err.count("\n") == 1 and "--batch-size" in refused.err, refused.err
    result = cli_sqlite("preflight", "--calibrate", "bare", *SHAPE, "--max-length", "4096", "--json")
    assert result.code == 0, result.err
    facts = result.json()
    assert abs(facts["estimated_gib"] - 87.541) < 1e-3  # the same shape as the recorded one above
    assert abs(facts["factor"] - 91 / facts["estimated_gib"]) < 1e-9


def test_explain_puts_an_ooms_numbers_beside_the_estimate(cli_sqlite, tmp_path):
    Path("trackway.toml").write_text(RESOURCES)
    script = tmp_path / "oom.py"
    script.write_text(
        "import trackway\nrun = trackway.init()\nrun.log({'loss': 2.0}, step=1)\n"
        "raise RuntimeError('CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB '"
        "'of which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.07 GiB memory in use. Of the '"
        "'allocated memory 75.12 GiB is allocated by PyTorch, and 2.31 GiB is reserved by PyTorch but unallocated.')\n")
    result = cli_sqlite("submit", "--name", "ooms", "--resource", "h100box", "--config", str(_config(tmp_path)),
                        "--retry-policy", str(_no_retry(tmp_path)), "--", PY, str(script))
    assert result.code == 1
    explained = _flat(cli_sqlite("explain", "ooms").out)
    assert "the OOM: asked 2.00 GiB on GPU 0 (79.15 GiB): 75.12 GiB allocated, 77.43 GiB reserved" in explained
    assert "PyTorch needed at least 79.43 GiB against the preflight's 89.0 GiB" in explained
    assert "on h100box: OOM 1.12" in explained


def _no_retry(tmp_path: Path) -> Path:
    path = tmp_path / "retry.toml"
    path.write_text("[reasons.oom]\nbudget = 0\n")
    return path


def test_warn_still_runs_a_job_that_fits_nowhere_and_says_why_it_went_where_it_did(cli_sqlite, tmp_path):
    Path("trackway.toml").write_text('[resources.h100box]\nexecutor = "local"\ngpu = "H100"\n')
    result = cli_sqlite("submit", "--config", str(_config(tmp_path)), "--", PY, "-c", "1")
    assert result.code == 0, result.err
    assert ("h100box would run out of memory (as would every resource it may go to: it runs anyway, `submit "
            "--strict` refuses)") in result.err
    (run,) = cli_sqlite("runs", "--json").json()
    assert run["resource"] == "h100box"
    explained = _flat(cli_sqlite("explain", run["run_id"]).out)
    assert "the memory preflight predicts OOM on every resource (89.0 GiB per GPU): warned at submit" in explained


def test_resume_set_runs_the_preflight_again_for_the_config_it_changed(cli_sqlite, tmp_path):
    # Before issue 30, the attempt after `resume --set` showed the verdict computed for the old config.
    Path("trackway.toml").write_text(RESOURCES)
    result = cli_sqlite("submit", "--name", "shrink", "--config", str(_config(tmp_path)), "--", PY, "-c",
                        "raise SystemExit(3)")
    assert result.code == 1, result.err
    resumed = cli_sqlite("resume", "shrink", "--set", "preflight.batch_size=2")
    assert resumed.code == 1, resumed.err
    first = _flat(cli_sqlite("explain", "shrink/1").out)
    second = _flat(cli_sqlite("explain", "shrink/2").out)
    assert "preflight at submit (warn): 89.0 GiB per GPU at the longest batch" in first
    assert "preflight at this attempt's launch, for its config (warn): " in second
    assert "89.0 GiB per GPU" not in second.split("Memory")[-1]
    data = cli_sqlite("explain", "shrink/2", "--json").json()["memory"]["preflight"]
    assert data["peak_gib"] < 89.0 and data["when"] == "at this attempt's launch, for its config"
