"""The preflight's answer: verdicts at the median and the longest batch, and fixes that really make it fit."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from memory_cases import MOTIVATING, lognormal_lengths
from trackway.errors import InputError
from trackway.resources.gpu_catalog import KNOWN_GPUS, Target, known_gpu, targets_for
from trackway.resources.memory_model import FITS_BELOW
from trackway.resources.preflight import Correction, run_preflight
from trackway.resources.preflight_spec import read_spec
from trackway.settings.resources import Resource


def motivating_report(targets=None, correction=None):
    spec = replace(read_spec(MOTIVATING, lambda k: k, Path(".")), lengths=lognormal_lengths())
    return run_preflight(spec, targets or targets_for([]), correction)


def test_the_motivating_case_fits_at_the_median_on_h100_and_ooms_at_the_maximum():
    report = motivating_report()
    verdicts = {row.target.name: row for row in report.targets}
    assert verdicts["H100"].at["median"][0] == "FITS" and verdicts["H100"].at["median"][1] == pytest.approx(0.81, abs=0.01)
    assert report.points["median"][1].total / 2**30 == pytest.approx(64.4, abs=0.5)
    assert report.peak_gib == pytest.approx(89.04, abs=0.01)
    assert verdicts["A100-80"].verdict == "OOM" and verdicts["A100-80"].at["max"][1] == pytest.approx(1.11, abs=0.005)
    assert verdicts["H100"].verdict == "OOM" and verdicts["H100"].at["max"][1] == pytest.approx(1.12, abs=0.005)
    assert verdicts["H200"].verdict == "FITS" and verdicts["H200"].at["max"][1] == pytest.approx(0.63, abs=0.005)


@pytest.mark.parametrize("gpu, longest", [("A100-80", 3372), ("H100", 3354), ("H200", 6554), ("B200", 8591)])
def test_the_longest_length_that_fits_at_micro_batch_4(gpu, longest):
    row = motivating_report().for_target(gpu)
    assert row.longest_fitting == pytest.approx(longest, abs=1)


def test_fixes_are_ranked_by_cost_and_each_one_fits():
    row = motivating_report().for_target("H100")
    changes = [fix.change for fix in row.fixes]
    assert changes[0].startswith("micro-batch 2 with 2 gradient accumulation steps")
    assert changes[1].startswith("a token budget of 13,4")  # ≈ 13.4k tokens per GPU
    assert any(change == "activation checkpointing" for change in changes)
    assert changes[-1].startswith("H200")
    assert all(fix.ratio <= FITS_BELOW for fix in row.fixes)
    # A fused cross-entropy alone leaves 83 GiB: not offered, since it does not fit.
    assert not any("cross-entropy" in change for change in changes)


def test_a_fix_is_offered_only_when_it_fits():
    report = motivating_report([Target("tiny", 8.0, "test")])
    row = report.for_target("tiny")
    assert row.verdict == "OOM" and all(fix.ratio <= FITS_BELOW for fix in row.fixes)


def test_declared_resources_are_judged_with_the_drivers_capacity():
    resources = [Resource("lab-h100", gpu="NVIDIA H100 80GB HBM3", gpu_memory_gb=80),
                 Resource("box", gpu="mystery", gpu_memory_gb=141), Resource("cpu")]
    targets = targets_for(resources)
    assert [(t.name, t.capacity_gib) for t in targets] == [("lab-h100", 79.65), ("box", 141.0)]
    report = motivating_report(targets)
    assert [row.verdict for row in report.targets] == ["OOM", "FITS"]
    assert "lab-h100 OOM 1.12" in report.summary()


def test_a_correction_is_applied_and_said():
    plain = motivating_report()
    corrected = motivating_report(correction=Correction(1.1, "calibrated ×1.100 on run r1"))
    grown = (corrected.peak_gib - 1.5) / (plain.peak_gib - 1.5)
    assert grown == pytest.approx(1.1)
    assert corrected.to_json()["correction"]["source"] == "calibrated ×1.100 on run r1"
    assert "(calibrated)" in corrected.summary()


def test_the_json_carries_every_number(tmp_path):
    data = motivating_report().to_json()
    json.dumps(data)
    assert data["points"]["max"]["gib"]["activations"] == pytest.approx(68.0, abs=0.01)
    assert data["longest_batches"]["steps_with_longest"] == pytest.approx(0.175, abs=0.007)


def test_a_hugging_face_config_gives_the_shape(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 32, "intermediate_size": 11008, "vocab_size": 32000, "tie_word_embeddings": False,
        "hidden_act": "silu", "_name_or_path": "meta-llama/Llama-2-7b-hf"}))
    spec = read_spec({"model_config": "config.json", "max_length": 4096}, lambda k: k, tmp_path)
    assert spec.model.total_params == pytest.approx(6.738e9, rel=1e-4) and spec.model_name == "meta-llama/Llama-2-7b-hf"
    gpt2 = tmp_path / "gpt2.json"
    gpt2.write_text(json.dumps({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
                                "activation_function": "gelu_new"}))
    spec = read_spec({"model_config": str(gpt2), "max_length": 1024}, lambda k: k, tmp_path)
    assert spec.model.total_params == pytest.approx(124.4e6, rel=0.01)  # GPT-2 small, tied embeddings


@pytest.mark.parametrize("values, message", [
    ({"hidden": 64, "heads": 4, "vocab": 10, "max_length": 8}, "layers: expected the model's layers"),
    ({**MOTIVATING, "heads": 33}, "heads 33: expected a divisor of the hidden size 4096"),
    ({**MOTIVATING, "precision": "fp8"}, "precision 'fp8': expected one of bf16-mixed"),
    ({**MOTIVATING, "batch_size": 0}, "batch_size 0: expected a whole number from 1"),
    ({**MOTIVATING, "world_size": 1}, "world_size: expected the number of GPUs fsdp shards over"),
    ({**MOTIVATING, "padding": "padding-free", "flash_attention": False}, "expected flash_attention too"),
    ({**MOTIVATING, "batch": 4}, "batch: unknown key"),
    ({**MOTIVATING, "flash_attention": "maybe"}, "flash_attention 'maybe': expected true or false"),
])
def test_bad_values_name_the_field(values, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(")):
        read_spec(values, lambda k: k, Path("."))


def test_gpu_names_as_people_write_them():
    assert known_gpu("NVIDIA H100 80GB HBM3") == "H100"
    assert known_gpu("NVIDIA GeForce RTX 5090") == "RTX 5090"
    assert known_gpu("A100-SXM4-80GB") == "A100-80"
    assert known_gpu("T4") is None
    assert set(KNOWN_GPUS) == {"A100-80", "H100", "H200", "B200", "RTX 5090", "RTX 6000 Ada"}
