"""Peak GPU memory of one training step, per GPU: the formulas, and nothing that reads files or the ledger.

    peak = context + states + gathered layers + activations + logits

The peak comes at the loss, at the start of backward, when every saved activation and the logits
are live. Sources and hand-computed cases: docs/memory-preflight.md.

    states       bytes/param = w + g + m + K·n_states (bf16-mixed AdamW: 2+2+4+4·2 = 16), split by
                 ZeRO stage: 1 shards m and the optimizer states, 2 also g, 3/FSDP everything
    gathered     ZeRO-3/FSDP only: two layers' bf16 weights and one layer's gradient, ≈ 6·P_layer
    activations  per layer s·b·h·(34 + 5·a·s/h) (Korthikanti et al. 2022); flash attention drops the
                 5·a·s² term; full activation checkpointing keeps 2·s·b·h per layer plus one layer
                 recomputed in backward
    logits       k·b·s·V with k = 12 (bf16 logits, their fp32 upcast, the saved log-softmax);
                 a fused cross-entropy never materialises them (k = 0)
    context      1 GiB of CUDA context and allocator slack, +0.5 GiB for NCCL when sharded

The coefficients (34, 12, 6·P_layer, the context) are published estimates, not measurements on
our GPUs: `trackway preflight --calibrate RUN` compares them with a run's measured peak and keeps
a correction (resources/calibration.py).
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30
ACTIVATION_COEFFICIENT = 34.0  # bytes per s·b·h per layer besides attention scores (16-bit, with dropout)
LOGIT_BYTES = 12.0  # bytes per logit element: bf16 logits 2 + fp32 upcast 4 + saved log-softmax 4 + transients
GATHERED_LAYER_BYTES = 6.0  # ZeRO-3/FSDP: two gathered bf16 layers and one layer's bf16 gradient
CONTEXT_GIB = 1.0
NCCL_GIB = 0.5
FITS_BELOW = 0.95  # a peak at or under this share of the GPU's memory fits; the margin is a heuristic
OOM_ABOVE = 1.0

# (weight, gradient, master copy, bytes per optimizer state) for trainable parameters.
PRECISIONS: dict[str, tuple[float, float, float, float]] = {
    "bf16-mixed": (2, 2, 4, 4),
    "fp16-mixed": (2, 2, 4, 4),
    "fp32": (4, 4, 0, 4),
    "bf16": (2, 2, 0, 2),  # pure bf16: the optimizer states follow the parameters' dtype
}
# Optimizer states per trainable parameter, and their size in bytes when it is not the precision's.
OPTIMIZERS: dict[str, tuple[int, float | None]] = {
    "adamw": (2, None),
    "adamw8bit": (2, 1.0),
    "sgd": (0, None),
    "sgd-momentum": (1, None),
    "adafactor": (0, None),  # a factored second moment, O(rows + columns) per matrix: nothing per parameter
}
SHARDINGS = ("none", "zero1", "zero2", "zero3", "fsdp")
VERDICTS = ("FITS", "TIGHT", "OOM")


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer, as much as the estimate needs of it."""

    layers: int
    hidden: int
    heads: int
    vocab: int
    ffn: int | None = None  # None: 4·hidden
    kv_heads: int | None = None  # None: heads (no grouped-query attention)
    gated_mlp: bool = True  # SwiGLU (Llama, Mistral, Qwen): three matrices; GPT-2's MLP has two
    tied_embeddings: bool = False
    params: float | None = None  # the real count when known; None: computed from the shape

    @property
    def ffn_width(self) -> int:
        return self.ffn if self.ffn is not None else 4 * self.hidden

    @property
    def kv_width(self) -> int:
        return self.hidden * (self.kv_heads or self.heads) // self.heads

    @property
    def layer_params(self) -> float:
        """One layer's weights: q and o (h²), k and v (h·h_kv), and the MLP (2 or 3 matrices of h·f)."""
        attention = 2 * self.hidden**2 + 2 * self.hidden * self.kv_width
        mlp = (3 if self.gated_mlp else 2) * self.hidden * self.ffn_width
        return float(attention + mlp)

    @property
    def total_params(self) -> float:
        if self.params is not None:
            return float(self.params)
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return self.layers * self.layer_params + embeddings

    def lora_params(self, rank: int, modules: tuple[str, ...] = ("q", "k", "v", "o")) -> float:
        """Trainable LoRA parameters: r·(d_in + d_out) per adapted matrix per layer."""
        h, kv, f = self.hidden, self.kv_width, self.ffn_width
        sizes = {"q": (h, h), "k": (h, kv), "v": (h, kv), "o": (h, h), "gate": (h, f), "up": (h, f), "down": (f, h)}
        return float(self.layers * sum(rank * sum(sizes[m]) for m in modules))


@dataclass(frozen=True)
class TrainingSetup:
    """How the model is trained: precision, optimizer, batch, sharding and the memory savers in use."""

    precision: str = "bf16-mixed"
    optimizer: str = "adamw"
    micro_batch: int = 1
    sharding: str = "none"
    world_size: int = 1
    activation_checkpointing: bool = False
    flash_attention: bool = False
    fused_cross_entropy: bool = False
    lora_rank: int | None = None
    lora_modules: tuple[str, ...] = ("q", "k", "v", "o")
    base_bits: int = 16  # a LoRA base model's weights: 16, or 4 (QLoRA)
    activation_coefficient: float = ACTIVATION_COEFFICIENT
    logit_bytes: float = LOGIT_BYTES

    @property
    def sharded_over(self) -> int:
        return self.world_size if self.sharding != "none" else 1


@dataclass(frozen=True)
class Breakdown:
    """Bytes per GPU at one padded length, by part; `correction` scales everything but the context."""

    context: float
    states: float
    gathered: float
    activations: float
    logits: float
    correction: float = 1.0

    @property
    def total(self) -> float:
        return self.context + self.correction * (self.states + self.gathered + self.activations + self.logits)

    @property
    def fixed(self) -> float:
        """What does not grow with the tokens of a batch."""
        return self.context + self.correction * (self.states + self.gathered)

    def gib(self) -> dict[str, float]:
        """Each part in GiB, corrected as the total is."""
        c = self.correction / GIB
        return {"context": self.context / GIB, "states": self.states * c, "gathered": self.gathered * c,
                "activations": self.activations * c, "logits": self.logits * c, "total": self.total / GIB}


def state_bytes(params: float, precision: str, optimizer: str, sharding: str = "none", world_size: int = 1) -> float:
    """Weights, gradients, master copy and optimizer states of `params` trainable parameters, per GPU."""
    w, g, m, k = PRECISIONS[precision]
    states, state_size = OPTIMIZERS[optimizer]
    rest = m + (state_size if state_size is not None else k) * states
    n = world_size if sharding != "none" else 1
    if sharding == "zero1":
        return (w + g) * params + rest * params / n
    if sharding == "zero2":
        return w * params + (g + rest) * params / n
    if sharding in ("zero3", "fsdp"):
        return (w + g + rest) * params / n
    return (w + g + rest) * params


def deepspeed_state_bytes(params: float, world_size: int, stage: int, largest_module: float = 0.0) -> float:
    """What DeepSpeed's own estimators say for states (more conservative than ours, for comparison).

    ZeRO-2: 4P + 16P/N (`estimate_zero2_model_states_mem_needs`); ZeRO-3: 4·P_largest + 18P/N.
    """
    if stage == 3:
        return 4 * largest_module + 18 * params / world_size
    if stage == 2:
        return 4 * params + 16 * params / world_size
    raise ValueError(f"DeepSpeed's estimators cover ZeRO stages 2 and 3, not {stage}")


def activation_bytes_per_layer(tokens: float, row_length: float, model: ModelShape, setup: TrainingSetup) -> float:
    """Saved activations of one layer for `tokens` tokens in rows of `row_length` (Korthikanti's A_layer).

    `tokens` is b·s for a padded batch; the attention-score term 5·a·s²·b (eager attention only)
    is 5·a·s·tokens.
    """
    scores = 0.0 if setup.flash_attention else 5 * model.heads * row_length * tokens
    return tokens * model.hidden * setup.activation_coefficient + scores


def estimate(
    model: ModelShape, setup: TrainingSetup, row_length: float, tokens: float | None = None, correction: float = 1.0
) -> Breakdown:
    """The peak per GPU with rows padded to `row_length` (`tokens`: the batch's tokens, default b·row_length)."""
    tokens = setup.micro_batch * row_length if tokens is None else tokens
    n = setup.sharded_over
    if setup.lora_rank:
        trainable = model.lora_params(setup.lora_rank, setup.lora_modules)
        base = model.total_params * (0.5 if setup.base_bits == 4 else PRECISIONS[setup.precision][0])
        shards = n if setup.sharding in ("zero3", "fsdp") else 1
        states = base / shards + state_bytes(trainable, setup.precision, setup.optimizer, setup.sharding, n)
    else:
        states = state_bytes(model.total_params, setup.precision, setup.optimizer, setup.sharding, n)
    gathered = GATHERED_LAYER_BYTES * model.layer_params if setup.sharding in ("zero3", "fsdp") and n > 1 else 0.0
    layer = activation_bytes_per_layer(tokens, row_length, model, setup)
    if setup.activation_checkpointing:
        # Each layer's input is kept; one layer at a time is recomputed, whole, during backward.
        activations = 2 * tokens * model.hidden * model.layers + layer
    else:
        activations = layer * model.layers
    logits = 0.0 if setup.fused_cross_entropy else setup.logit_bytes * tokens * model.vocab
    context = (CONTEXT_GIB + (NCCL_GIB if setup.world_size > 1 else 0.0)) * GIB
    return Breakdown(context, states, gathered, activations, logits, correction)


def verdict(peak_bytes: float, capacity_gib: float) -> tuple[str, float]:
    """FITS (≤ 0.95 of the GPU), TIGHT (≤ 1.0) or OOM, with the ratio of the peak to the capacity."""
    ratio = peak_bytes / (capacity_gib * GIB)
    return ("FITS" if ratio <= FITS_BELOW else "TIGHT" if ratio <= OOM_ABOVE else "OOM"), ratio


def bytes_per_token(model: ModelShape, setup: TrainingSetup, row_length: float) -> float:
    """What one more token in the batch costs at `row_length` (activations and logits), for token budgets."""
    one = estimate(model, setup, row_length, tokens=1.0)
    two = estimate(model, setup, row_length, tokens=2.0)
    return two.total - one.total
