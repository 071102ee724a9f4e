"""The memory formulas against the hand-computed cases of docs/memory-preflight.md, to their stated precision."""

from __future__ import annotations

import pytest

from trackway.resources.gpu_catalog import KNOWN_GPUS
from trackway.resources.memory_model import (
    GIB,
    ModelShape,
    TrainingSetup,
    activation_bytes_per_layer,
    deepspeed_state_bytes,
    estimate,
    state_bytes,
    verdict,
)

LLAMA2_7B = ModelShape(layers=32, hidden=4096, heads=32, ffn=11008, vocab=32000)


def test_llama2_7b_has_6_738b_parameters_from_its_shape():
    assert LLAMA2_7B.total_params == pytest.approx(6.738e9, rel=1e-4)


@pytest.mark.parametrize("sharding, gb", [("none", 120.0), ("zero1", 31.4), ("zero2", 16.6), ("zero3", 1.9)])
def test_zero_stages_match_the_zero_paper(sharding, gb):
    # Case 1: Ψ = 7.5B over N = 64, mixed-precision Adam (16 bytes per parameter unsharded).
    assert state_bytes(7.5e9, "bf16-mixed", "adamw", sharding, 64) / 1e9 == pytest.approx(gb, abs=0.05)


def test_deepspeed_estimators_are_reproduced_for_comparison():
    # Case 2: P = 7e9, N = 8.
    assert deepspeed_state_bytes(7e9, 8, 2) == pytest.approx(42.0e9)
    assert deepspeed_state_bytes(7e9, 8, 2) / GIB == pytest.approx(39.12, abs=0.005)
    assert deepspeed_state_bytes(7e9, 8, 3, largest_module=131_072_000) == pytest.approx(16_274_288_000)


def test_korthikanti_activations_per_layer():
    # Case 3: s = 2048, b = 1, h = 12288, a = 96 (5as/h = 80).
    model = ModelShape(layers=1, hidden=12288, heads=96, vocab=1)
    eager = activation_bytes_per_layer(2048, 2048, model, TrainingSetup(micro_batch=1))
    flash = activation_bytes_per_layer(2048, 2048, model, TrainingSetup(micro_batch=1, flash_attention=True))
    assert eager == 2_868_903_936
    assert flash == 855_638_016
    checkpointed = estimate(model, TrainingSetup(micro_batch=1, flash_attention=True, activation_checkpointing=True), 2048)
    assert checkpointed.activations - flash == 50_331_648  # 2·sbh kept per layer, plus one layer recomputed


def test_logits_at_k_12():
    # Case 4: b = 4, s = 4096, V = 128,256.
    model = ModelShape(layers=1, hidden=64, heads=1, vocab=128_256)
    logits = estimate(model, TrainingSetup(micro_batch=4), 4096).logits
    elements = 4 * 4096 * 128_256
    assert elements == 2_101_346_304
    assert elements * 4 / GIB == pytest.approx(7.83, abs=0.005)  # the fp32 copy alone
    assert logits / GIB == pytest.approx(23.48, abs=0.005)
    assert estimate(model, TrainingSetup(micro_batch=4, fused_cross_entropy=True), 4096).logits == 0


# Section 4's table: bf16-mixed AdamW, flash attention, b = 4.
LLAMA_TABLE = [
    # gpus, s, AC, states+gather+ctx, acts, logits, total, H100 verdict/ratio, H200 verdict/ratio
    (1, 4096, False, 101.4, 68.0, 5.9, 175.3, ("OOM", 2.20), ("OOM", 1.25)),
    (1, 4096, True, 101.4, 6.1, 5.9, 113.4, ("OOM", 1.42), ("FITS", 0.81)),
    (1, 8192, False, 101.4, 136.0, 11.7, 249.1, ("OOM", 3.13), ("OOM", 1.77)),
    (1, 8192, True, 101.4, 12.25, 11.7, 125.4, ("OOM", 1.57), ("FITS", 0.89)),
    (8, 4096, False, 15.2, 68.0, 5.9, 89.0, ("OOM", 1.12), ("FITS", 0.63)),
    (8, 4096, True, 15.2, 6.1, 5.9, 27.2, ("FITS", 0.34), ("FITS", 0.19)),
    (8, 8192, False, 15.2, 136.0, 11.7, 162.9, ("OOM", 2.05), ("OOM", 1.16)),
    (8, 8192, True, 15.2, 12.25, 11.7, 39.2, ("FITS", 0.49), ("FITS", 0.28)),
]


@pytest.mark.parametrize("gpus, s, ac, fixed, acts, logits, total, h100, h200", LLAMA_TABLE)
def test_the_llama2_7b_table(gpus, s, ac, fixed, acts, logits, total, h100, h200):
    setup = TrainingSetup(micro_batch=4, flash_attention=True, activation_checkpointing=ac,
                          sharding="fsdp" if gpus > 1 else "none", world_size=gpus)
    b = estimate(LLAMA2_7B, setup, s)
    assert (b.context + b.states + b.gathered) / GIB == pytest.approx(fixed, abs=0.05)
    assert b.activations / GIB == pytest.approx(acts, abs=0.05)
    assert b.logits / GIB == pytest.approx(logits, abs=0.05)
    assert b.total / GIB == pytest.approx(total, abs=0.05)
    for gpu, (expected, ratio) in (("H100", h100), ("H200", h200)):
        said, measured = verdict(b.total, KNOWN_GPUS[gpu])
        assert said == expected and measured == pytest.approx(ratio, abs=0.005)


@pytest.mark.parametrize("gpu, expected, ratio", [("A100-80", "OOM", 1.11), ("H100", "OOM", 1.12),
                                                  ("H200", "FITS", 0.63), ("B200", "FITS", 0.50)])
def test_fsdp8_at_4096_without_checkpointing(gpu, expected, ratio):
    # Case 7: 89.04 GiB.
    b = estimate(LLAMA2_7B, TrainingSetup(micro_batch=4, flash_attention=True, sharding="fsdp", world_size=8), 4096)
    assert b.total / GIB == pytest.approx(89.04, abs=0.005)
    said, measured = verdict(b.total, KNOWN_GPUS[gpu])
    assert said == expected and measured == pytest.approx(ratio, abs=0.005)


def test_fsdp8_at_4096_with_checkpointing_fits_everywhere():
    # Case 8: 27.17 GiB, RTX 5090 included (0.85).
    b = estimate(LLAMA2_7B, TrainingSetup(micro_batch=4, flash_attention=True, sharding="fsdp", world_size=8,
                                          activation_checkpointing=True), 4096)
    assert b.total / GIB == pytest.approx(27.17, abs=0.005)
    assert all(verdict(b.total, gib)[0] == "FITS" for gib in KNOWN_GPUS.values())
    assert verdict(b.total, KNOWN_GPUS["RTX 5090"])[1] == pytest.approx(0.85, abs=0.005)


def test_one_gpu_with_checkpointing_at_8192():
    # Case 9: 125.38 GiB; H200 FITS 0.89, H100 OOM 1.57.
    b = estimate(LLAMA2_7B, TrainingSetup(micro_batch=4, flash_attention=True, activation_checkpointing=True), 8192)
    assert b.total / GIB == pytest.approx(125.38, abs=0.005)
    assert verdict(b.total, KNOWN_GPUS["H200"]) == ("FITS", pytest.approx(0.89, abs=0.005))
    assert verdict(b.total, KNOWN_GPUS["H100"]) == ("OOM", pytest.approx(1.57, abs=0.005))


def test_lora_and_qlora_states():
    # Case 10: r = 16 on q/k/v/o.
    assert LLAMA2_7B.lora_params(16) == 16_777_216
    lora = estimate(LLAMA2_7B, TrainingSetup(lora_rank=16), 1)
    qlora = estimate(LLAMA2_7B, TrainingSetup(lora_rank=16, base_bits=4), 1)
    assert lora.states / GIB == pytest.approx(12.80, abs=0.005)
    assert qlora.states / GIB == pytest.approx(3.39, abs=0.005)


def test_optimizers_and_precisions_change_the_bytes_per_parameter():
    assert state_bytes(1.0, "bf16-mixed", "adamw") == 16
    assert state_bytes(1.0, "fp32", "adamw") == 16
    assert state_bytes(1.0, "bf16", "adamw") == 8
    assert state_bytes(1.0, "bf16-mixed", "adamw8bit") == 10  # 2 + 2 + 4 + 2×1
    assert state_bytes(1.0, "bf16-mixed", "sgd") == 8
    assert state_bytes(1.0, "bf16-mixed", "sgd-momentum") == 12


def test_a_correction_scales_everything_but_the_context():
    setup = TrainingSetup(micro_batch=4, flash_attention=True)
    plain = estimate(LLAMA2_7B, setup, 2048)
    corrected = estimate(LLAMA2_7B, setup, 2048, correction=1.1)
    assert corrected.total - corrected.context == pytest.approx(1.1 * (plain.total - plain.context))
    assert corrected.gib()["activations"] == pytest.approx(1.1 * plain.gib()["activations"])


def test_grouped_query_attention_shrinks_k_and_v():
    gqa = ModelShape(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128_256)  # Llama-3-8B
    assert gqa.total_params == pytest.approx(8.03e9, rel=2e-3)
