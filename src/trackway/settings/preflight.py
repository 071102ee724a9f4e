"""The words of trackway.toml's `[preflight]`: its modes (warn, strict, off) and the preflight keys a run config may hold.

The keys are those of `trackway preflight`'s options (resources/preflight_spec.py reads their values);
they are declared here, beside the settings, so that reading trackway.toml needs nothing of the
preflight itself (settings/model.py checks the table).
"""

from __future__ import annotations

MODES = ("warn", "strict", "off")
KEYS = (
    "model_config", "params", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "gated_mlp", "tied_embeddings",
    "optimizer", "precision", "batch_size", "grad_accum", "seq_lengths", "data", "length_field", "max_length",
    "padding", "group_by_length", "activation_checkpointing", "flash_attention", "fused_cross_entropy", "sharding",
    "world_size", "lora_rank", "lora_modules", "base_bits", "steps", "model_family",
)
