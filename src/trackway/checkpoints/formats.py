"""A PyTorch checkpoint's payload formats and the files they live in (no torch needed to name them).

    format         rank 0             rank r                    what it is
    "torch"        state.pt           rank-0000r.pt             torch.save's zip, read with weights_only=True
    "safetensors"  state.safetensors  rank-0000r.safetensors    tensors by name + the rest as JSON, no pickle
                   (state-1.safetensors, ... rank-0000r-1.safetensors, ...: the parts of a large state)

A checkpoint holds one of them per rank; readers take whichever the manifest lists.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

from trackway.errors import InputError

FORMATS = {"torch": ".pt", "safetensors": ".safetensors"}
DEFAULT_FORMAT = "torch"


def state_file(rank: int = 0, format: str = DEFAULT_FORMAT) -> str:  # noqa: A002 - the user-facing word
    """The file one rank's state lives in: `state.pt` for rank 0, `rank-0000r.pt` for rank r (`.safetensors` alike)."""
    suffix = FORMATS.get(format)
    if suffix is None:
        raise InputError(f"checkpoint format must be one of {', '.join(map(repr, FORMATS))}, got {format!r}")
    return f"state{suffix}" if rank == 0 else f"rank-{rank:05d}{suffix}"


def check_format(format: str) -> str:  # noqa: A002
    """`format` when this installation can write it; InputError saying what to do otherwise."""
    state_file(0, format)
    if format == "safetensors" and importlib.util.find_spec("safetensors") is None:
        raise InputError("format='safetensors' needs the safetensors package: pip install 'trackway[torch]'")
    return format


def find_state_file(files: Iterable[str], rank: int) -> str | None:
    """Which of `files` (a manifest's) holds `rank`'s state, in whichever format; None when none does."""
    listed = set(files)
    return next((name for f in FORMATS if (name := state_file(rank, f)) in listed), None)


def expected_state_files(rank: int) -> str:
    """`state.pt or state.safetensors`: for messages saying what was looked for."""
    return " or ".join(state_file(rank, f) for f in FORMATS)



def hashed_on_load(name: str | None) -> set[str]:
    """The files a loader of state file `name` hashes as it reads them (verified_read.py): none for others."""
    return {name} if name is not None and name.endswith(FORMATS["torch"]) else set()
