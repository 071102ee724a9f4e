"""trackway.toml's `[preflight]`: the mode (warn, strict, off) and where a run config holds each preflight key.

The keys are those of `trackway preflight`'s options (resources/preflight_spec.py reads their values);
they are declared here, beside the settings, so that reading trackway.toml needs nothing of the
preflight itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trackway.errors import InputError

MODES = ("warn", "strict", "off")
KEYS = (
    "model_config", "params", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "gated_mlp", "tied_embeddings",
    "optimizer", "precision", "batch_size", "grad_accum", "seq_lengths", "data", "length_field", "max_length",
    "padding", "group_by_length", "activation_checkpointing", "flash_attention", "fused_cross_entropy", "sharding",
    "world_size", "lora_rank", "lora_modules", "base_bits", "steps", "model_family",
)


def preflight_section(section: Any, toml_path: Path) -> tuple[str, dict[str, str]]:
    """[preflight] mode (warn, strict, off) and keys (preflight key = "dotted.config.key")."""
    if section is None:
        return "warn", {}
    if not isinstance(section, dict):
        raise InputError(f"{toml_path}: [preflight] must be a table")
    unknown = sorted(set(section) - {"mode", "keys"})
    if unknown:
        raise InputError(f"{toml_path}: [preflight] {unknown[0]}: unknown key; expected mode, keys")
    mode = section.get("mode", "warn")
    if mode not in MODES:
        raise InputError(f"{toml_path}: [preflight] mode: expected one of {', '.join(MODES)}, got {mode!r}")
    return mode, check_keys(section.get("keys", {}), f"{toml_path}: [preflight] keys")


def check_keys(keys: Any, where: str) -> dict[str, str]:
    """trackway.toml's `[preflight] keys`: preflight key → dotted config key."""
    if not isinstance(keys, Mapping):
        raise InputError(f"{where}: expected a table of preflight key = \"dotted.config.key\"")
    for key, dotted in keys.items():
        if key not in KEYS:
            raise InputError(f"{where} {key}: unknown key; expected some of {', '.join(KEYS)}")
        if not isinstance(dotted, str) or not dotted:
            raise InputError(f"{where} {key}: expected a dotted config key such as \"train.batch_size\"")
    return dict(keys)
