"""A prefilter never turns away text its pattern matches, and turns away what it cannot match."""

from __future__ import annotations

import random
import re

import pytest

from trackway.regex_prefilter import Need, Prefilter, fold, needs
from trackway.supervisor.classify import LOG_RULES


def test_every_character_a_case_insensitive_ascii_letter_matches_folds_to_that_letter():
    """The fold's table is complete: every code point `re` matches to an ASCII letter under IGNORECASE is that
    letter, lowered, once folded."""
    letter = re.compile("[a-z]", re.IGNORECASE)
    for code in range(0x110000):
        char = chr(code)
        if letter.fullmatch(char):
            folded = fold("x" + char)[1:]  # beside an ASCII one: the non-ASCII path is what a log of any text takes
            assert re.fullmatch(re.escape(folded), char, re.IGNORECASE) and folded.isascii(), hex(code)
    # Nothing but a letter has another case `re` matches.
    other = re.compile(r"[\x00-\x40\x5b-\x60\x7b-\x7f]", re.IGNORECASE)
    assert not [code for code in range(0x80, 0x110000) if other.fullmatch(chr(code))]


def test_what_every_match_holds_is_read_from_the_pattern():
    assert needs(re.compile("CUDA out of memory|OutOfMemoryError", re.I)) == Need(
        False, ("cuda out of memory", "outofmemoryerror"))
    # A small class spells the run each way it allows; an optional group needs nothing.
    assert needs(re.compile(r"grad[_ ]norm(?: is)?")) == Need(False, ("grad norm", "grad_norm"))
    # A class too wide to spell out (a category, a negation, many letters) ends the run: both sides are needed.
    assert needs(re.compile(r"grad\w+norm[^x]?[a-z]s")) == Need(True, ("grad", "norm", "s"))
    assert needs(re.compile(r"xox[abpr]-", re.I)) == Need(False, ("xoxa-", "xoxb-", "xoxp-", "xoxr-"))
    # One branch that needs nothing leaves the alternation needing nothing.
    assert needs(re.compile(r"\berror\b|\d+ failed|x*")) is None
    assert needs(re.compile(r"(?:ab)+c{2,}")) == Need(True, ("ab", "c"))
    assert needs(re.compile(r"^\s*$")) is None


@pytest.mark.parametrize("rule", LOG_RULES, ids=lambda rule: rule.name)
def test_each_log_rule_has_a_prefilter_that_turns_away_an_ordinary_training_log(rule):
    """A log of steps and losses matches no rule, and each rule's prefilter says so without its pattern."""
    log = [f"step {i} loss {2.0 / (i + 1):.4f} lr 0.0003 throughput 1234.5 samples/s" for i in range(200)]
    folded = fold("\n".join(log))
    assert not any(rule.pattern.search(line) for line in log)
    if rule.name == "log:non-finite-loss":
        # Its pieces (a loss, and "nan" or "inf") are in any log of losses that says "info": it may match.
        assert Prefilter(rule.pattern).may_match(fold("step 3 loss 1.2 info: saved"))
    assert not Prefilter(rule.pattern).may_match(folded)


def _lines_that_match(pattern: re.Pattern[str], rng: random.Random) -> list[str]:
    """Lines the pattern matches, made by writing matches of it into noise of every kind of character."""
    lines = []
    for sample in _SAMPLES:
        for found in pattern.finditer(sample):
            text = found.group(0)
            cased = "".join(c.upper() if rng.random() < 0.5 else c for c in text)
            noise = "".join(rng.choice("aé\u0130\u0131\u017f\u212a Σ█…\t:/-0") for _ in range(rng.randint(0, 12)))
            lines.append(noise + cased + noise)
            lines.append(noise + text.replace("s", "\u017f").replace("i", "\u0131").replace("k", "\u212a") + noise)
    return lines


_SAMPLES = [
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    "Out of memory: Killed process 4242 (python)", "MemoryError",
    "OSError: [Errno 28] No space left on device: '/ckpt/step-100'", "ENOSPC", "disk full: /data",
    "step 12 loss nan", "grad_norm inf at step 3", "non-finite loss", "RuntimeError: EADDRINUSE",
    "OSError: [Errno 98] Address already in use", "NCCL error in: ProcessGroupNCCL.cpp",
    "Watchdog caught collective operation timeout", "ConnectionResetError: Connection reset by peer",
    "OSError: [Errno 5] Input/output error", "RendezvousTimeoutError", "json.decoder.JSONDecodeError: x",
    "manifest hash mismatch", "corrupted shard 3", "ModuleNotFoundError: No module named 'x'",
    "train.py: error: unrecognized arguments: --lrr", "usage: train.py [-h]",
    "ValueError: Unknown config key: lrr", "KeyError: missing required option 'lr'",
    "Traceback (most recent call last):", "2026-11-30T10:00:00Z err Traceback (most recent call last):",
]


@pytest.mark.parametrize("rule", LOG_RULES, ids=lambda rule: rule.name)
def test_no_line_a_log_rule_matches_is_turned_away(rule):
    """Every line the rule's pattern matches, in any case and among any characters, passes its prefilter, alone and
    within a log."""
    rng = random.Random(rule.name)
    prefilter = Prefilter(rule.pattern)
    lines = [line for line in _lines_that_match(rule.pattern, rng) if rule.pattern.search(line)]
    assert lines, "no sample line matches this rule: add one to _SAMPLES"
    for line in lines:
        assert prefilter.may_match(fold(line)), line
    assert prefilter.may_match(fold("\n".join(["step 1 loss 2.0", *lines[:1], "done"])))

