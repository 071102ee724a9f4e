"""What a memory preflight is asked: the model, how it is trained and the lengths it sees, checked field by field.

The same keys come from `trackway preflight`'s options (`--batch-size`) and from a run config's
`[preflight]` section (`batch_size`), so one reader checks both and names the field as the user
wrote it. A Hugging Face `config.json` (`model_config`) gives the shape; keys given beside it win.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trackway import validation
from trackway.errors import InputError
from trackway.settings.preflight import KEYS
from trackway.resources.memory_model import OPTIMIZERS, PRECISIONS, SHARDINGS, ModelShape, TrainingSetup
from trackway.resources.seq_lengths import PADDINGS, Lengths, Progress, read_jsonl_lengths, read_lengths_file

LORA_MODULES = ("q", "k", "v", "o", "gate", "up", "down")
# Hugging Face config keys for each shape field, in the order tried (Llama/Mistral/Qwen, GPT-2, T5/BART).
_HF_KEYS = {
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "heads": ("num_attention_heads", "n_head"),
    "kv_heads": ("num_key_value_heads",),
    "ffn": ("intermediate_size", "n_inner", "ffn_dim", "d_ff"),
    "vocab": ("vocab_size",),
}
_PLAIN_MLP_TYPES = ("gpt2", "gpt_neox", "gptj", "opt", "bloom", "falcon", "phi", "bert", "roberta", "t5")


@dataclass(frozen=True)
class PreflightSpec:
    """A checked preflight question."""

    model: ModelShape
    setup: TrainingSetup
    grad_accum: int = 1
    lengths: Lengths | None = None
    padding: str = "dynamic"
    max_length: int | None = None
    group_by_length: bool = False
    steps: int | None = None
    model_family: str | None = None
    model_name: str | None = None  # what config.json calls it, when one was given

    def describe(self) -> str:
        """One line: `6.74B params, 32 layers × 4096, bf16-mixed adamw, micro-batch 4, fsdp over 8, flash`."""
        s = self.setup
        parts = [f"{_count(self.model.total_params)} params, {self.model.layers} layers × {self.model.hidden}",
                 f"{s.precision} {s.optimizer}", f"micro-batch {s.micro_batch}"
                 + (f" × {self.grad_accum} accumulation" if self.grad_accum > 1 else "")]
        if s.sharding != "none":
            parts.append(f"{s.sharding} over {s.world_size}")
        elif s.world_size > 1:
            parts.append(f"{s.world_size} GPUs, unsharded")
        parts += [word for flag, word in ((s.flash_attention, "flash attention"),
                                          (s.activation_checkpointing, "activation checkpointing"),
                                          (s.fused_cross_entropy, "fused cross-entropy")) if flag]
        if s.lora_rank:
            parts.append(f"LoRA r={s.lora_rank} on {','.join(s.lora_modules)}" + (" (4-bit base)" if s.base_bits == 4 else ""))
        parts.append(f"{self.padding} padding" + (", grouped by length" if self.group_by_length else ""))
        return ", ".join(parts)


def read_spec(
    values: Mapping[str, Any], name: Callable[[str], str], base_dir: Path, progress: Progress | None = None,
) -> PreflightSpec:
    """A PreflightSpec from `values` (keys as in KEYS); `name(key)` is how an error names the field."""
    unknown = sorted(set(values) - set(KEYS))
    if unknown:
        raise InputError(f"{name(unknown[0])}: unknown key; expected some of {', '.join(KEYS)}")
    given = {key: value for key, value in values.items() if value is not None}
    shape: dict[str, Any] = {}
    model_name = None
    if "model_config" in given:
        shape, model_name = _hf_shape(_path(given["model_config"], name("model_config"), base_dir), name("model_config"))
    for key in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab"):
        if key in given:
            shape[key] = _whole(given[key], name(key), 1, 10**7)
    for key in ("gated_mlp", "tied_embeddings"):
        if key in given:
            shape[key] = _flag(given[key], name(key))
    missing = [key for key in ("layers", "hidden", "heads", "vocab") if key not in shape]
    if missing:
        raise InputError(f"{name(missing[0])}: expected the model's {missing[0]} (or a Hugging Face config.json through "
                         f"{name('model_config')}): activations and logits depend on it")
    if shape["hidden"] % shape["heads"]:
        raise InputError(f"{name('heads')} {shape['heads']}: expected a divisor of the hidden size {shape['hidden']}")
    if "kv_heads" in shape and shape["heads"] % shape["kv_heads"]:
        raise InputError(f"{name('kv_heads')} {shape['kv_heads']}: expected a divisor of the heads ({shape['heads']})")
    if "params" in given:
        shape["params"] = _number(given["params"], name("params"), 1, 1e14)
    model = ModelShape(**shape)

    setup = TrainingSetup(
        precision=_choice(given.get("precision", "bf16-mixed"), name("precision"), tuple(PRECISIONS)),
        optimizer=_choice(given.get("optimizer", "adamw"), name("optimizer"), tuple(OPTIMIZERS)),
        micro_batch=_whole(given.get("batch_size", 1), name("batch_size"), 1, 1_000_000),
        sharding=_choice(given.get("sharding", "none"), name("sharding"), SHARDINGS),
        world_size=_whole(given.get("world_size", 1), name("world_size"), 1, 1_000_000),
        activation_checkpointing=_flag(given.get("activation_checkpointing", False), name("activation_checkpointing")),
        flash_attention=_flag(given.get("flash_attention", False), name("flash_attention")),
        fused_cross_entropy=_flag(given.get("fused_cross_entropy", False), name("fused_cross_entropy")),
        lora_rank=_whole(given["lora_rank"], name("lora_rank"), 1, 65_536) if "lora_rank" in given else None,
        lora_modules=_modules(given.get("lora_modules", ("q", "k", "v", "o")), name("lora_modules")),
        base_bits=_choice(given.get("base_bits", 16), name("base_bits"), (16, 4)),
    )
    if setup.sharding != "none" and setup.world_size == 1:
        raise InputError(f"{name('world_size')}: expected the number of GPUs {setup.sharding} shards over (≥ 2)")
    padding = _choice(given.get("padding", "dynamic"), name("padding"), PADDINGS)
    if padding == "padding-free" and not setup.flash_attention:
        raise InputError(f"{name('padding')} padding-free: expected {name('flash_attention')} too "
                         "(concatenated rows need flash attention's variable-length kernels)")
    max_length = _whole(given["max_length"], name("max_length"), 1, 10**8) if "max_length" in given else None
    if "seq_lengths" in given and "data" in given:
        raise InputError(f"{name('seq_lengths')}/{name('data')}: expected one source of lengths, not both")
    lengths = None
    if "seq_lengths" in given:
        counts = read_lengths_file(_path(given["seq_lengths"], name("seq_lengths"), base_dir), progress)
        lengths = Lengths(counts, max_length)
    elif "data" in given:
        if "length_field" not in given:
            raise InputError(f"{name('length_field')}: expected the JSONL field holding each sample's tokens or text")
        counts, proxy = read_jsonl_lengths(_path(given["data"], name("data"), base_dir), str(given["length_field"]), progress)
        lengths = Lengths(counts, max_length, proxy=proxy)
    if lengths is None and max_length is None:
        raise InputError(f"{name('seq_lengths')}, {name('data')} or {name('max_length')}: expected the sequence lengths "
                         "(a file of lengths or a JSONL dataset), or at least the longest")
    return PreflightSpec(
        model=model,
        setup=setup,
        grad_accum=_whole(given.get("grad_accum", 1), name("grad_accum"), 1, 1_000_000),
        lengths=lengths,
        padding=padding,
        max_length=max_length,
        group_by_length=_flag(given.get("group_by_length", False), name("group_by_length")),
        steps=_whole(given["steps"], name("steps"), 1, 10**12) if "steps" in given else None,
        model_family=str(given["model_family"]) if "model_family" in given else None,
        model_name=model_name,
    )


def _hf_shape(path: Path, field: str) -> tuple[dict[str, Any], str | None]:
    """The shape fields of a Hugging Face config.json, and the model's name or type."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{field} {path}: expected a Hugging Face config.json ({exc})") from None
    if not isinstance(config, dict):
        raise InputError(f"{field} {path}: expected a JSON object")
    if isinstance(config.get("text_config"), dict):
        config = {**config["text_config"], "model_type": config.get("model_type")}  # multimodal: the language model
    shape: dict[str, Any] = {}
    for key, candidates in _HF_KEYS.items():
        value = next((config[c] for c in candidates if isinstance(config.get(c), int) and config[c] > 0), None)
        if value is not None:
            shape[key] = value
    model_type = str(config.get("model_type") or "")
    shape["gated_mlp"] = model_type not in _PLAIN_MLP_TYPES and config.get("hidden_act", "silu") in ("silu", "swiglu", "gelu_pytorch_tanh")
    shape["tied_embeddings"] = bool(config.get("tie_word_embeddings", True))
    return shape, config.get("_name_or_path") or model_type or None


def _path(value: Any, field: str, base_dir: Path) -> Path:
    if not isinstance(value, str) or not value:
        raise InputError(f"{field}: expected a file path")
    path = Path(value).expanduser()
    path = path if path.is_absolute() else base_dir / path
    return Path(validation.existing_file(str(path), field, "a file"))


def _whole(value: Any, field: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise InputError(f"{field} {value!r}: expected a whole number from {low} to {high}")
    try:
        number = int(value)
    except ValueError:
        raise InputError(f"{field} {value!r}: expected a whole number from {low} to {high}") from None
    return validation.whole(number, field, low, high)


def _number(value: Any, field: str, low: float, high: float) -> float:
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    if not (math.isfinite(number) and low <= number <= high):
        raise InputError(f"{field} {value!r}: expected a number from {low:g} to {high:g} (e.g. 6.7e9)")
    return number


def _flag(value: Any, field: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.lower() in ("true", "yes", "1")
    raise InputError(f"{field} {value!r}: expected true or false")


def _choice(value: Any, field: str, choices: tuple) -> Any:
    if value not in choices:
        raise InputError(f"{field} {value!r}: expected one of {', '.join(str(c) for c in choices)}")
    return value


def _modules(value: Any, field: str) -> tuple[str, ...]:
    items = [part.strip() for part in value.split(",")] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items or any(item not in LORA_MODULES for item in items):
        raise InputError(f"{field} {value!r}: expected some of {', '.join(LORA_MODULES)}, comma-separated")
    return tuple(items)


def _count(params: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if params >= size:
            return f"{params / size:.3g}{unit}"
    return f"{params:.0f}"
