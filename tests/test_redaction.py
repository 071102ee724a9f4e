"""Secret shapes are hidden from text the ledger keeps; ordinary log lines pass through untouched."""

from __future__ import annotations

import json
import signal
from contextlib import contextmanager

import pytest

from trackway.redaction import is_secret_name, looks_secret, redact, redact_lines, redact_structure, redact_url

HF = "hf_" + "aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dE3f"
GHP = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
OPENAI = "sk-proj-" + "Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0Fe"
ANTHROPIC = "sk-ant-api03-" + "q1W2e3R4t5Y6u7I8o9P0a1S2d3F4g5H6j7K8l9"
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ"
    ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
)
AWS_ID = "AKIAIOSFODNN7EXAMPLE"
PEM = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA1c7+9z5Pad7OejecsQ0bu3aumJ\nq9o6TkCpV0Ah\n-----END RSA PRIVATE KEY-----"


@pytest.mark.parametrize(
    "name",
    [
        "HF_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN", "OPENAI_API_KEY", "PGPASSWORD",
        "ANTHROPIC_API_KEY", "SENTRY_DSN", "GITLAB_PAT", "HUGGING_FACE_HUB_TOKEN", "MY_PASSPHRASE", "DB_PASSWD",
        "GOOGLE_APPLICATION_CREDENTIALS", "SSH_PRIVATE_KEY", "AUTHORIZATION", "OAUTH_CLIENT_SECRET", "SESSION_KEY",
        "SESSION_COOKIE", "hfToken", "apiKey", "hf-token", "model.wandb_api_key", "STRIPE_KEY",
    ],
)  # fmt: skip
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "DATABASE_URL", "PATH", "HOME", "CUDA_VISIBLE_DEVICES", "TOKENIZERS_PARALLELISM", "MAX_NEW_TOKENS",
        "num_tokens", "eos_token_id", "pad_token", "GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "lr", "loss", "step",
        "KEY", "MASTER_ADDR", "WORLD_SIZE", "PYTHONPATH", "keyboard",
    ],
)  # fmt: skip
def test_ordinary_names(name):
    assert not is_secret_name(name)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"HF_TOKEN={HF}", "HF_TOKEN=***"),
        (f"export WANDB_API_KEY={'0' * 40}", "export WANDB_API_KEY=***"),
        ("connecting to postgresql://trainer:hunter2@db.internal:5432/metrics", "connecting to postgresql://trainer:***@db.internal:5432/metrics"),
        ("redis://:s3cret@cache:6379/0", "redis://:***@cache:6379/0"),
        (f"using token {HF} for the hub", "using token hf_*** for the hub"),
        (f"git clone https://{GHP}@github.com/x/y", "git clone https://ghp_***@github.com/x/y"),
        (f"openai key {OPENAI}", "openai key sk-***"),
        (f"anthropic {ANTHROPIC}", "anthropic sk-ant-***"),
        ("slack xoxb-123456789012-abcdefABCDEF", "slack xoxb-***"),
        (f"aws {AWS_ID} in us-east-1", "aws AKIA*** in us-east-1"),
        ("gitlab glpat-abcdefghij0123456789", "gitlab glpat-***"),
        ("npm npm_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8", "npm npm_***"),
        (f"cookie {JWT}", "cookie eyJ***"),
        ("Authorization: Bearer abc.def-ghi_jkl", "Authorization: Bearer ***"),
        ("authorization: Basic dXNlcjpwYXNzd29yZA==", "authorization: Basic ***"),
        ('{"api_key": "abc123", "lr": 0.001}', '{"api_key": "***", "lr": 0.001}'),
        ("password: hunter2", "password: ***"),
        ("db_password='hunter2' host=db", "db_password='***' host=db"),
        ("train.py --lr 3e-4 --password hunter2 --hf-token xyz --tokenizer gpt2", "train.py --lr 3e-4 --password *** --hf-token *** --tokenizer gpt2"),
        ("GET https://api.example.com/v1?api_key=abc&page=2", "GET https://api.example.com/v1?api_key=***&page=2"),
        ("url=https://host/x?token=abc&page=2", "url=https://host/x?token=***&page=2"),
        ('password="cut off in the middle', 'password="***'),
        (PEM, "-----BEGIN RSA PRIVATE KEY-----***-----END RSA PRIVATE KEY-----"),
    ],
)  # fmt: skip
def test_secrets_are_hidden_and_the_rest_is_kept(text, expected):
    assert redact(text) == expected
    assert redact(expected) == expected  # idempotent
    assert looks_secret(text)


@pytest.mark.parametrize(
    "line",
    [
        "step 1200 loss=2.3415 lr=3e-4 grad_norm=0.8712 tokens_per_s=51234.5",
        "python train.py --lr 3e-4 --batch-size 32 --max-new-tokens 512 --tokenizer meta-llama/Llama-3-8B",
        "commit 3f2a9c1e8b7d6a5f4e3d2c1b0a9f8e7d6c5b4a39 on branch exp/skip-task",
        "saved /data/ckpt/step-00001200/model.safetensors (sha256 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08)",
        'Traceback (most recent call last):\n  File "/home/u/train.py", line 12, in <module>',
        "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity)",
        "eta 00:01:02 at 12:30:01, eos_token_id: 2, pad_token: <pad>, num_tokens=4096",
        "Author: Jane Doe <jane@example.com>",
        "visit https://huggingface.co/datasets/hf_internal/data and http://localhost:8080/metrics",
        "task-1234567890abcdefghijklmn finished; mask-0123456789abcdef0123456789",
        "",
    ],
)
def test_ordinary_log_lines_are_untouched(line):
    assert redact(line) == line
    assert not looks_secret(line)


def test_a_pem_key_printed_over_several_lines_is_hidden_line_by_line():
    lines = ["loading key", *PEM.splitlines(), "step 1 loss=0.5"]
    out = redact_lines(lines)
    assert len(out) == len(lines)
    assert out[0] == "loading key" and out[-1] == "step 1 loss=0.5"
    assert not any("MIIE" in line or "q9o6" in line for line in out)
    assert out[1].startswith("-----BEGIN RSA PRIVATE KEY-----") and out[-2].endswith("-----END RSA PRIVATE KEY-----")


def test_a_structure_keeps_its_shape_and_loses_its_secrets():
    evidence = {
        "rule": "log:traceback",
        "lines": [f"out HF_TOKEN={HF}", "err RuntimeError: boom"],
        "exit_code": 1,
        "executor": [],
        "env": {"WANDB_API_KEY": "plain-value-without-shape", "PATH": "/usr/bin"},
    }
    out = redact_structure(evidence)
    assert json.loads(json.dumps(out)) == {
        "rule": "log:traceback",
        "lines": ["out HF_TOKEN=***", "err RuntimeError: boom"],
        "exit_code": 1,
        "executor": [],
        "env": {"WANDB_API_KEY": "***", "PATH": "/usr/bin"},
    }


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql+psycopg://bob:pw@db:5432/ledger", "postgresql+psycopg://bob:***@db:5432/ledger"),
        ("postgresql://bob:p@ss@db/ledger", "postgresql://bob:***@db/ledger"),
        ("postgresql://bob@db/ledger?password=pw&sslmode=require", "postgresql://bob@db/ledger?password=***&sslmode=require"),
        ("postgresql://bob@db/ledger", "postgresql://bob@db/ledger"),
        ("sqlite:////home/u/.trackway/ledger.db", "sqlite:////home/u/.trackway/ledger.db"),
    ],
)  # fmt: skip
def test_redact_url(url, expected):
    assert redact_url(url) == expected


@contextmanager
def _hang_guard(seconds: int):
    """Fails the test if the block does not return at all (catastrophic backtracking takes hours here)."""

    def hung(*_):
        raise AssertionError(f"redact did not return within {seconds}s: a pattern backtracks")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize(
    "adversarial",
    [
        "a" * 200_000,
        "a://b:" * 40_000,
        "x=" * 100_000,
        '"' * 100_000,
        "ghp_" * 50_000,
        "a." * 100_000,
        "--a " * 50_000,
        "eyJaaaa." * 30_000,
        ":" * 100_000,
        "a://" + "b" * 100_000,
        "-----BEGIN PRIVATE KEY-----" * 10_000,
        "password=" * 30_000,
        "TOKEN" * 40_000 + "=",
    ],
)
def test_long_adversarial_lines_finish_and_stay_redacted(adversarial):
    secret_tail = f" HF_TOKEN={HF}"
    with _hang_guard(20):
        out = redact(adversarial + secret_tail)
    assert HF not in out
    assert out.endswith("HF_TOKEN=***") or out.endswith("***")
