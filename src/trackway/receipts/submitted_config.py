"""The submitted config: masked in the ledger, kept as given beside the run for its attempts.

A config may carry a credential among its hyperparameters (`api_key: sk-...`, `wandb: {token: ...}`,
`db: postgresql://u:pw@host/db`), yet the ledger's blobs are read by everyone who can run
`trackway sql`. So, as for the command line (receipts/submitted_argv.py):

- the ledger's config blob holds the config with its secret values replaced by `***`
  (`redaction.redact_structure`: a string under a key that names a secret, and secret shapes
  anywhere), and `config_sha256` is the digest of that masked form. A digest of the real values
  would let anyone who reads the ledger test guesses of a secret against it; over the masked
  form, two configs that differ only in a credential are one config, as they are for everything
  trackway compares them for (a credential is not a hyperparameter). `explain` says which values
  it cannot compare.
- the config as given lives in a `config.json` beside what runs it, mode 0600: `runs/<run>/`
  (submit), `runs/<run>/attempts/<n>/` (`resume --set`), `experiments/<exp>/`. It is what the
  script reads ($TRACKWAY_CONFIG) and what every config built later for a launch starts from. A
  recorded config holding `***` whose file is gone is refused rather than run with `***` in it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trackway.receipts.canonical import canonical_json
from trackway.redaction import MASK, redact_structure

CONFIG_FILE = "config.json"


def recorded(values: Mapping[str, Any]) -> bytes:
    """The canonical JSON the ledger holds for `values`: each secret value `***`."""
    return canonical_json(redact_structure(values))


def is_masked(blob: bytes | None) -> bool:
    """Whether a recorded config hides values: launched as it is, the script would read `***`."""
    return blob is not None and MASK.encode() in blob


def write_file(path: Path, canonical: bytes) -> None:
    """Keep the config as given at `path`, readable by its owner only from the first byte on."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)  # a leftover keeps its old mode through O_CREAT
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(canonical)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read(blob: bytes, path: Path) -> dict[str, Any]:
    """The config as given, for the config the ledger recorded as `blob` and kept at `path`.

    The file counts when its masked form is the recorded one (a config recorded before configs
    were masked compares the same way). A recorded config without `***` runs as it is and needs no
    file. Raises `MissingConfig` when the values it hides cannot be read back.
    """
    values = json.loads(blob)
    kept = _stored(path)
    if kept is not None and recorded(kept) == recorded(values):
        return kept
    if not is_masked(blob):
        return values
    raise MissingConfig(path)


def _stored(path: Path) -> dict[str, Any] | None:
    try:
        values = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return values if isinstance(values, dict) else None


class MissingConfig(Exception):
    """The values a recorded config hides can no longer be read back."""

    def __init__(self, path: Path):
        self.path = path
        super().__init__(
            f"the config holds `{MASK}` in the ledger and its values as given are kept in {path}; that file is missing "
            "or belongs to another config, so nothing was started with a masked config: submit the run again"
        )
