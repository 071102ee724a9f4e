"""The submitted command line: redacted in the ledger, kept as typed beside the run for its attempts.

`trackway submit train.py --token sk-... --db postgresql://u:pw@host/db` must run with those
values on every attempt (a retry with `--token ***` trains nothing), yet the ledger is read by
everyone who can run `trackway sql`, `show` or the API. So, as for secret variables
(receipts/submitted_env.py):

- the ledger's `runs.command` holds the argv with its secret parts replaced by `***`
  (`redaction.redact_argv`: by shape, by `--key value` flags naming a secret, and by the values of
  the run's secret variables);
- when that hid anything, the words as typed live in `runs/<run>/secret-argv.json`, mode 0600,
  with the recorded form beside them, and every launch (first attempt, retry, resume) reads them
  back from there. A recorded command holding `***` whose file is gone or belongs to another
  command is refused rather than run with `***` in it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from trackway.redaction import MASK, hidden_values, known_values, redact_argv

SECRET_FILE = "secret-argv.json"


@dataclass(frozen=True)
class SubmittedCommand:
    """A run's command: the words as typed (what attempts run) and what the ledger records."""

    argv: list[str]
    recorded: list[str]

    @property
    def needs_file(self) -> bool:
        """Whether the recorded form cannot be run as it is: it hides something, or holds `***` at all."""
        return self.argv != self.recorded or any(MASK in word for word in self.recorded)

    def hidden(self) -> list[str]:
        """The values the recorded form hides, to mask wherever else the run's output repeats them."""
        return [value for typed, shown in zip(self.argv, self.recorded) for value in hidden_values(typed, shown)]


def capture(argv: Sequence[str], secret_values: Sequence[str] = ()) -> SubmittedCommand:
    """The command as typed and as the ledger may hold it; `secret_values`: the run's secret variables' values."""
    return SubmittedCommand(argv=list(argv), recorded=redact_argv(argv, known_values(secret_values)))


def write_secret_file(run_dir: Path, command: SubmittedCommand) -> None:
    """Keep the words as typed beside the run, readable by its owner only, from the first byte on."""
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = run_dir / SECRET_FILE
    tmp = path.with_name(f".{SECRET_FILE}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(json.dumps({"recorded": command.recorded, "argv": command.argv}).encode())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read(recorded: Sequence[str], run_dir: Path) -> SubmittedCommand:
    """The run's command as submitted, given the form the ledger recorded.

    A run whose recorded command runs as it is (nothing was hidden; or recorded before commands
    were redacted) needs no file. Raises `MissingArguments` when the words as typed are needed
    and cannot be read back.
    """
    recorded = list(recorded)
    stored = _stored(run_dir)
    if stored is not None and stored.recorded == recorded:
        return stored
    if not any(MASK in word for word in recorded):
        return SubmittedCommand(argv=recorded, recorded=recorded)
    raise MissingArguments(run_dir / SECRET_FILE)


def hidden(recorded: Sequence[str], run_dir: Path) -> list[str]:
    """The values the run's recorded command hides ([] when they cannot be read back)."""
    stored = _stored(run_dir)
    return stored.hidden() if stored is not None and stored.recorded == list(recorded) else []


def _stored(run_dir: Path) -> SubmittedCommand | None:
    try:
        data = json.loads((run_dir / SECRET_FILE).read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    argv, recorded = data.get("argv"), data.get("recorded")
    if not (_words(argv) and _words(recorded)) or len(argv) != len(recorded):
        return None
    return SubmittedCommand(argv=list(argv), recorded=list(recorded))


def _words(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(word, str) for word in value)


class MissingArguments(Exception):
    """The words a run's command hides in the ledger can no longer be read back."""

    def __init__(self, path: Path):
        self.path = path
        super().__init__(
            f"the run's command holds `{MASK}` in the ledger and its words as typed are kept in {path}; that file is "
            "missing or belongs to another command, so the attempt was not started with a masked command: submit "
            "the run again"
        )
