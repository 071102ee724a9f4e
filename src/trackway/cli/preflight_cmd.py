"""`trackway preflight`: will this training step fit in GPU memory, at the median, p99 and longest batch?"""

from __future__ import annotations

from pathlib import Path

import typer

from trackway.cli.context import app_context
from trackway.cli.jsonout import print_json


def preflight(
    ctx: typer.Context,
    model_config: str = typer.Option(None, "--model-config", help="A Hugging Face config.json giving the model's shape."),
    params: float = typer.Option(None, "--params", help="Parameters, e.g. 6.74e9 (default: computed from the shape)."),
    layers: int = typer.Option(None, "--layers", help="Transformer layers."),
    hidden: int = typer.Option(None, "--hidden", help="Hidden size."),
    heads: int = typer.Option(None, "--heads", help="Attention heads."),
    kv_heads: int = typer.Option(None, "--kv-heads", help="Key/value heads (grouped-query attention; default: --heads)."),
    ffn: int = typer.Option(None, "--ffn", help="MLP width (default: 4 × hidden)."),
    vocab: int = typer.Option(None, "--vocab", help="Vocabulary size."),
    optimizer: str = typer.Option("adamw", "--optimizer", help="adamw, adamw8bit, sgd, sgd-momentum or adafactor."),
    precision: str = typer.Option("bf16-mixed", "--precision", help="bf16-mixed, fp16-mixed, fp32 or bf16 (pure)."),
    batch_size: int = typer.Option(1, "--batch-size", help="Micro-batch per GPU."),
    grad_accum: int = typer.Option(1, "--grad-accum", help="Gradient accumulation steps."),
    seq_lengths: str = typer.Option(None, "--seq-lengths", help="A file of sample lengths in tokens, one per line."),
    data: str = typer.Option(None, "--data", help="A JSONL dataset; --length-field names each sample's tokens or text."),
    length_field: str = typer.Option(None, "--length-field", help="The JSONL field: a token count, token ids, or text (whitespace words as a proxy)."),
    max_length: int = typer.Option(None, "--max-length", help="Samples are cut at this many tokens."),
    padding: str = typer.Option("dynamic", "--padding", help="dynamic (to the batch's longest), fixed, packed or padding-free."),
    group_by_length: bool = typer.Option(False, "--group-by-length", help="Batches of similar lengths (lowers the median, not the max)."),
    activation_checkpointing: bool = typer.Option(False, "--activation-checkpointing", help="Full activation checkpointing."),
    flash_attention: bool = typer.Option(False, "--flash-attention", help="Flash/SDPA attention: no s² attention scores kept."),
    fused_cross_entropy: bool = typer.Option(False, "--fused-cross-entropy", help="A fused loss that never materialises logits."),
    sharding: str = typer.Option("none", "--sharding", help="none, zero1, zero2, zero3 or fsdp."),
    world_size: int = typer.Option(1, "--world-size", help="GPUs the model is trained on."),
    lora_rank: int = typer.Option(None, "--lora-rank", help="Train LoRA adapters of this rank (the base is frozen)."),
    lora_modules: str = typer.Option("q,k,v,o", "--lora-modules", help="Matrices LoRA adapts: q,k,v,o,gate,up,down."),
    base_bits: int = typer.Option(16, "--base-bits", help="A LoRA base model's weights: 16, or 4 (QLoRA)."),
    steps: int = typer.Option(None, "--steps", help="Optimizer steps of the run: how many meet the longest batch."),
    gpus: list[str] = typer.Option([], "--gpu", help="Judge on this GPU (repeatable; default: the resources in trackway.toml, else every GPU known)."),
    model_family: str = typer.Option(None, "--model-family", help="Use the calibration kept for this family (see --calibrate)."),
    uncalibrated: bool = typer.Option(False, "--uncalibrated", help="Ignore kept calibrations."),
    calibrate: str = typer.Option(None, "--calibrate", metavar="RUN", help="Compare RUN's measured peak with its estimate and keep the correction."),
    at_length: int = typer.Option(None, "--at-length", help="With --calibrate: the padded length the run's peak was reached at (default: its longest batch)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Estimate peak GPU memory per GPU at the median, p99 and longest batch, judge it per GPU, and rank the fixes."""
    from trackway.resources.preflight import run_preflight
    from trackway.resources.preflight_spec import read_spec
    from trackway.resources.gpu_catalog import targets_for

    app = app_context(ctx)
    options = dict(
        model_config=model_config, params=params, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
        ffn=ffn, vocab=vocab, optimizer=optimizer, precision=precision, batch_size=batch_size, grad_accum=grad_accum,
        seq_lengths=seq_lengths, data=data, length_field=length_field, max_length=max_length, padding=padding,
        group_by_length=group_by_length, activation_checkpointing=activation_checkpointing,
        flash_attention=flash_attention, fused_cross_entropy=fused_cross_entropy, sharding=sharding,
        world_size=world_size, lora_rank=lora_rank, lora_modules=lora_modules, base_bits=base_bits, steps=steps,
        model_family=model_family,
    )
    if calibrate is not None:
        from trackway.cli.preflight_calibrate import calibrate_run

        calibrate_run(app, calibrate, options, at_length, as_json, option_name)
        return
    from trackway.cli.render import err_console
    from trackway.resources.reading_progress import reading_progress

    with reading_progress(None if as_json else err_console, seq_lengths or data) as advance:
        spec = read_spec(options, option_name, Path.cwd(), advance)
    correction = None
    if spec.model_family and not uncalibrated:
        from trackway.resources.calibration import correction_for

        with app.ledger.read() as conn:
            correction = correction_for(conn, spec.model_family, spec.setup.precision)
    report = run_preflight(spec, targets_for(app.settings.resources.values(), gpus), correction)
    if as_json:
        print_json(report.to_json())
        return
    from trackway.cli.preflight_render import print_report

    print_report(report)


def option_name(key: str) -> str:
    """How an error names a preflight key on this command line: `batch_size` is `--batch-size`."""
    return "--" + key.replace("_", "-")


def register(app: typer.Typer) -> None:
    app.command("preflight")(preflight)
