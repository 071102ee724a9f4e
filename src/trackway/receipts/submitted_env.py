"""The submitter's environment variables: captured at submit, stored with the run, handed to every attempt.

A retry must run what was submitted, not whatever environment the supervisor that launches it
happens to have (a `FOO=bar trackway submit` whose retry sees no FOO trains something else).
So the variables are part of the run's spec:

- plain variables are stored in the ledger (a content-addressed blob of kind `environ`), where
  `explain` can show them and compare attempts;
- variables that look like secrets (by name, e.g. `HF_TOKEN`, or by value, e.g. a URL with a
  password) never reach the ledger: their values live in `runs/<run>/secret-env.json`, mode
  0600, beside the run's checkpoints, and the ledger keeps only their names and a digest
  salted with the run id (enough to tell that a value changed, useless to guess it).

Encrypting the values into the ledger was the alternative; its key would have to live on this
machine too, so it reaches no further than the file does, while a ledger that people query,
copy and back up would then carry secret material.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trackway.redaction import is_secret_name, looks_secret

SECRET_FILE = "secret-env.json"
# Set per attempt by the launcher (TRACKWAY_*), or shell bookkeeping that says nothing about the run.
NOT_STORED_PREFIXES = ("TRACKWAY_",)
NOT_STORED_NAMES = frozenset({"_", "OLDPWD", "SHLVL"})


@dataclass(frozen=True)
class SubmittedEnvironment:
    """The variables an attempt of a run gets: plain ones and secret ones."""

    plain: dict[str, str]
    secret: dict[str, str]

    @property
    def variables(self) -> dict[str, str]:
        return {**self.plain, **self.secret}

    def description(self, owner: str) -> dict[str, Any]:
        """What the ledger keeps: plain values, and for secrets only a digest salted with the owner run's id.

        `owner` is the run whose directory holds the secret values: the submitted run itself, also
        for the evaluation runs that share its environment.
        """
        return {
            "owner": owner,
            "variables": dict(sorted(self.plain.items())),
            "secrets": {name: secret_digest(owner, value) for name, value in sorted(self.secret.items())},
        }

    def canonical(self, owner: str) -> bytes:
        return json.dumps(self.description(owner), sort_keys=True, separators=(",", ":")).encode()


def is_stored(name: str) -> bool:
    return name not in NOT_STORED_NAMES and not name.startswith(NOT_STORED_PREFIXES)


def is_secret(name: str, value: str) -> bool:
    return is_secret_name(name) or looks_secret(value)


def capture(environ: Mapping[str, str] | None = None) -> SubmittedEnvironment:
    """Split the submitting process's environment into what the ledger may hold and what it may not."""
    environ = os.environ if environ is None else environ
    plain: dict[str, str] = {}
    secret: dict[str, str] = {}
    for name, value in environ.items():
        if not is_stored(name):
            continue
        (secret if is_secret(name, value) else plain)[name] = value
    return SubmittedEnvironment(plain=plain, secret=secret)


def secret_digest(salt: str, value: str) -> str:
    return "sha256:" + hashlib.sha256(f"{salt}\0{value}".encode()).hexdigest()[:16]


def write_secret_file(run_dir: Path, secret: Mapping[str, str]) -> None:
    """Keep secret values beside the run, readable by its owner only, from the first byte on."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / SECRET_FILE
    tmp = path.with_name(f".{SECRET_FILE}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(json.dumps(dict(secret), sort_keys=True).encode())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def restore(description: Mapping[str, Any], runs_dir: Path) -> SubmittedEnvironment:
    """The environment a run was submitted with, secrets read back from their owner run's file.

    Raises `MissingSecrets` when a secret's value is gone or is not the one submitted: the
    attempt must not start with a different environment than the one submitted.
    """
    wanted: dict[str, str] = dict(description.get("secrets") or {})
    secret: dict[str, str] = {}
    owner = str(description.get("owner", ""))
    run_dir = runs_dir / owner
    if wanted:
        try:
            stored = json.loads((run_dir / SECRET_FILE).read_bytes())
        except (OSError, ValueError):
            stored = {}
        missing = sorted(
            name for name, digest in wanted.items()
            if not isinstance(stored.get(name), str) or secret_digest(owner, stored[name]) != digest
        )
        if missing:
            raise MissingSecrets(missing, run_dir / SECRET_FILE)
        secret = {name: stored[name] for name in wanted}
    return SubmittedEnvironment(plain=dict(description.get("variables") or {}), secret=secret)


def kept_values(description: Mapping[str, Any] | None, runs_dir: Path) -> list[str]:
    """The values of the run's secret variables, as far as they can be read back ([] otherwise).

    For masking wherever the run's output repeats them (a script that prints `$MY_PASSWORD`);
    unlike `restore`, a missing file is no error here: there is then nothing to mask.
    """
    names = (description or {}).get("secrets") or {}
    if not names:
        return []
    try:
        stored = json.loads((runs_dir / str(description.get("owner", "")) / SECRET_FILE).read_bytes())
    except (OSError, ValueError):
        return []
    return [stored[name] for name in names if isinstance(stored, dict) and isinstance(stored.get(name), str)]


class MissingSecrets(Exception):
    """Secret variables the run was submitted with can no longer be read back."""

    def __init__(self, names: list[str], path: Path):
        self.names = names
        self.path = path
        super().__init__(
            f"the run was submitted with secret variable(s) {', '.join(names)}, whose values are kept in "
            f"{path}; that file is missing or does not hold the submitted values, so the attempt was not "
            "started with a different environment: submit the run again"
        )


def diff(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> list[str]:
    """Which variable names an attempt got that differ from the previous attempt's (values of secrets never shown)."""
    if before is None or after is None:
        return []
    changes: list[str] = []
    for section, show_values in (("variables", True), ("secrets", False)):
        old, new = before.get(section) or {}, after.get(section) or {}
        for name in sorted(old.keys() | new.keys()):
            if name not in old:
                changes.append(f"{name} added" + (f" ({_short(new[name])})" if show_values else " (secret)"))
            elif name not in new:
                changes.append(f"{name} removed")
            elif old[name] != new[name]:
                changes.append(
                    f"{name}: {_short(old[name])} → {_short(new[name])}" if show_values else f"{name} changed (secret)"
                )
    return changes


def _short(value: str, limit: int = 60) -> str:
    return repr(value if len(value) <= limit else value[: limit - 1] + "…")
