"""The demo's evaluator: samples the tiny CharLM's completions of "a+b=" from one checkpoint and scores each.

Owns the evaluator side of trackway's eval contract for examples/train_tiny.py checkpoints.
trackway runs it once per (checkpoint, seed) with

    TRACKWAY_CHECKPOINT     the committed checkpoint directory (read only)
    TRACKWAY_EVAL_TASKS     the task set: JSON lines {"task_id", "prompt", "answer"}
                            (examples/make_arith_tasks.py writes it)
    TRACKWAY_EVAL_SEED      the sampling seed
    TRACKWAY_EVAL_DECODING  {"samples", "temperature", "max_new_tokens"}
    TRACKWAY_EVAL_OUTPUT    where to write one JSON line per sample:
                            {"task_id", "sample", "correct", "output", "prompt", "expected"}
    TRACKWAY_EVAL_PARAMS    a JSON file holding all of the above, plus the checkpoint's step
    TRACKWAY_RUN_CONFIG     a JSON file: the config the checkpoint's training attempt ran with
                            (the model's sizes come from it; by hand, from the weights' shapes)

and it exits 0 once every line is written. Each setting also has a flag, so it runs by hand:

    python examples/eval_arith.py --checkpoint RUN/checkpoints/step-00000300 \\
        --tasks examples/evals/arith_tasks.jsonl --output /tmp/out.jsonl --seed 0

`--crash-at-step STEP` is the demo's fault injection: on the checkpoint at STEP, the first
attempt ($TRACKWAY_ATTEMPT_NUMBER = 1) writes part of its output and then raises, so trackway
records an evaluator_crash and its retry succeeds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

# The script's own directory is on sys.path: the evaluator builds the very model it trained, not a copy.
from train_tiny import CharLM

import trackway.checkpoints
from trackway.errors import TrackwayError

# train_tiny.py's vocabulary is sorted(set(corpus text)) and is not stored in the checkpoint. Every
# make_corpus.py corpus ("a+b=c" lines) has exactly this alphabet; the embedding's row count is
# checked against it, so a checkpoint trained on some other corpus fails loudly instead of
# being decoded with the wrong characters.
VOCAB = sorted(set("0123456789+=\n"))
STOI = {c: i for i, c in enumerate(VOCAB)}
NEWLINE = STOI["\n"]

DEFAULT_DECODING = {"samples": 4, "temperature": 0.3, "max_new_tokens": 4}
CRASH_MESSAGE = "simulated crash during a distributed gather (demo fault injection)"


def parse_args() -> argparse.Namespace:
    params_path = os.environ.get("TRACKWAY_EVAL_PARAMS")
    params = json.loads(Path(params_path).read_text()) if params_path else {}
    decoding = dict(DEFAULT_DECODING)
    decoding.update(json.loads(os.environ["TRACKWAY_EVAL_DECODING"]) if "TRACKWAY_EVAL_DECODING" in os.environ
                    else params.get("decoding") or {})

    def setting(env: str, key: str, default=None):
        return os.environ.get(env) or params.get(key, default)

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, default=setting("TRACKWAY_CHECKPOINT", "checkpoint"),
                        help="committed checkpoint directory (default: $TRACKWAY_CHECKPOINT)")
    parser.add_argument("--tasks", type=Path, default=setting("TRACKWAY_EVAL_TASKS", "task_set"),
                        help="task set JSONL (default: $TRACKWAY_EVAL_TASKS)")
    parser.add_argument("--output", type=Path, default=setting("TRACKWAY_EVAL_OUTPUT", "output"),
                        help="where to write one JSON line per sample (default: $TRACKWAY_EVAL_OUTPUT)")
    parser.add_argument("--seed", type=int, default=int(setting("TRACKWAY_EVAL_SEED", "seed", 0)),
                        help="sampling seed (default: $TRACKWAY_EVAL_SEED, else 0)")
    parser.add_argument("--samples", type=int, default=int(decoding["samples"]),
                        help="samples per task (default: $TRACKWAY_EVAL_DECODING's samples)")
    parser.add_argument("--temperature", type=float, default=float(decoding["temperature"]),
                        help="sampling temperature; 0 is greedy (default: $TRACKWAY_EVAL_DECODING's temperature)")
    parser.add_argument("--max-new-tokens", type=int, default=int(decoding["max_new_tokens"]),
                        help="characters to generate at most, the closing newline included")
    parser.add_argument("--crash-at-step", type=int, metavar="STEP",
                        help="demo fault: on the checkpoint at STEP, attempt 1 crashes half-way through")
    args = parser.parse_args()
    for name in ("checkpoint", "tasks", "output"):
        if getattr(args, name) is None:
            parser.error(f"no --{name} given and its TRACKWAY_ variable is not set")
    if args.samples < 1 or args.max_new_tokens < 1 or args.temperature < 0:
        parser.error("samples and max_new_tokens must be ≥ 1 and temperature ≥ 0")
    args.step = params.get("step")
    return args


def load_model(checkpoint: Path) -> tuple[CharLM, int]:
    """The CharLM saved in `checkpoint` (sizes read from the weights' shapes) and the step it was saved at."""
    # trackway hands over committed checkpoints only; by hand, load() refuses a half-written or altered one.
    try:
        state = trackway.checkpoints.load(checkpoint)  # verified, then torch.load(weights_only=True)
    except TrackwayError as exc:
        raise SystemExit(str(exc)) from None
    step = json.loads((checkpoint / "MANIFEST.json").read_text())["step"]
    weights = state["model"]
    vocab = weights["embed.weight"].shape[0]
    # The sizes the checkpoint was trained with: $TRACKWAY_RUN_CONFIG under trackway, else the weights' shapes.
    config_path = os.environ.get("TRACKWAY_RUN_CONFIG")
    model_cfg = json.loads(Path(config_path).read_text()).get("model", {}) if config_path else {}
    embed = model_cfg.get("embed", weights["embed.weight"].shape[1])
    hidden = model_cfg.get("hidden", weights["rnn.weight_hh_l0"].shape[1])
    if vocab != len(VOCAB):
        raise SystemExit(
            f"{checkpoint}: the model has {vocab} characters, the arithmetic corpus has {len(VOCAB)} "
            f"({''.join(VOCAB)!r}); it was not trained on a make_corpus.py corpus"
        )
    model = CharLM(vocab, embed, hidden)
    model.load_state_dict(weights)
    return model.eval(), step


def read_tasks(path: Path) -> list[dict]:
    tasks = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for task in tasks:
        unknown = set(task["prompt"]) - set(VOCAB)
        if unknown:
            raise SystemExit(f"task {task['task_id']}: prompt {task['prompt']!r} has characters the model "
                             f"never saw: {''.join(sorted(unknown))!r}")
    return tasks


@torch.no_grad()
def complete(model: CharLM, prompt: str, samples: int, temperature: float, max_new_tokens: int,
             generator: torch.Generator) -> list[str]:
    """`samples` completions of `prompt`, each cut at the first newline or after max_new_tokens characters."""
    # Training lines follow a newline, so the prompt does too: "12+7=" alone could be the tail of "312+7=".
    ids = torch.tensor([[NEWLINE] + [STOI[c] for c in prompt]])
    out, hidden = model.rnn(model.embed(ids))
    # The prompt is encoded once; its final state is shared by every sample.
    logits = model.head(out[:, -1]).expand(samples, -1)
    hidden = hidden.expand(-1, samples, -1).contiguous()
    generated = []
    for _ in range(max_new_tokens):
        if temperature == 0:
            token = logits.argmax(-1)
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            token = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        generated.append(token)
        if (torch.stack(generated, 1) == NEWLINE).any(1).all():
            break
        out, hidden = model.rnn(model.embed(token[:, None]), hidden)
        logits = model.head(out[:, -1])
    texts = ["".join(VOCAB[i] for i in row) for row in torch.stack(generated, 1).tolist()]
    return [text.split("\n", 1)[0] for text in texts]


def main() -> int:
    started = time.perf_counter()
    args = parse_args()
    torch.set_num_threads(1)  # a few milliseconds of work per task; more threads only contend on a shared box
    model, step = load_model(args.checkpoint)
    if args.step is not None and args.step != step:
        raise SystemExit(f"TRACKWAY_EVAL_PARAMS says step {args.step}, {args.checkpoint}/MANIFEST.json says {step}")
    tasks = read_tasks(args.tasks)
    crash_after = None
    if args.crash_at_step == step and os.environ.get("TRACKWAY_ATTEMPT_NUMBER") == "1":
        crash_after = len(tasks) // 2
    generator = torch.Generator().manual_seed(args.seed)
    correct = 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with args.output.open("w") as out:
        for number, task in enumerate(tasks):
            if number == crash_after:
                out.flush()  # the partial output is part of what the demo shows trackway discarding
                raise RuntimeError(CRASH_MESSAGE)
            completions = complete(model, task["prompt"], args.samples, args.temperature, args.max_new_tokens,
                                   generator)
            for sample, text in enumerate(completions):
                ok = text == task["answer"]
                correct += ok
                out.write(json.dumps({
                    "task_id": task["task_id"], "sample": sample, "correct": ok, "output": text,
                    "prompt": task["prompt"], "expected": task["answer"],
                }) + "\n")
    total = len(tasks) * args.samples
    print(f"step {step} seed {args.seed}: {len(tasks)} tasks x {args.samples} samples at temperature "
          f"{args.temperature}: {correct}/{total} correct ({correct / total:.1%}) "
          f"in {time.perf_counter() - started:.2f}s -> {args.output}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
