"""Canonical JSON bytes and their sha256: the one encoding every receipt hash is taken over."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(obj: Any) -> bytes:
    """Encode `obj` so that equal values always give equal bytes (sorted keys, no spaces, UTF-8).

    Raises ValueError for NaN or infinity and TypeError for values JSON cannot hold.
    """
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.encode("utf-8")


def sha256_hex(data: bytes) -> str:
    """The lowercase hex sha256 of `data`."""
    return hashlib.sha256(data).hexdigest()
