"""A PyTorch checkpoint's state as safetensors: the tensors by name, everything else as JSON in the metadata.

    [8 bytes: header length, little-endian][header: JSON, padded with spaces][tensor bytes, back to back]
    header = {"__metadata__": {"format": "trackway.torch_state/1", "parts": "2", "state": "<the state as JSON>"},
              "model/0.weight": {"dtype": "F32", "shape": [2048, 2048], "data_offsets": [0, 16777216]}, ...}

A large state is split into parts, each a safetensors file of its own: `state.safetensors` (part 0,
with the state's JSON) and `state-1.safetensors`, ... (metadata {"format", "part": "k"}). The
manifest holds one sha256 per file, and SHA-256 runs at ~2 GB/s on one core: parts are hashed on
as many cores at once, which is what lets a save go faster than hashing one file. One part per
usable core and per 64 MiB, at most 16; tensors are dealt to the part with the fewest bytes so far,
so the parts' hashers start together.

Any safetensors reader can take the tensors (merge the parts), named by where they sit in the
state (`model/0.weight`, `optimizer/state/0/exp_avg`). `read()` puts the whole state back from the
JSON, which says what JSON alone cannot with one-key objects: {"$tensor": name}, {"$tuple": [...]},
{"$dict": [[key, value], ...]} (keys keep their types: an optimizer's int keys), {"$odict": [...],
"$meta": ...} (an OrderedDict and its `_metadata`), {"$set": [...]}, {"$bytes": base64},
{"$float": "nan"}, {"$complex": [re, im]}, {"$dtype": "float32"}, {"$device": "cuda:0"},
{"$size": [...]}. A tensor held under two names (tied weights) is stored once and comes back as one
tensor. Reading runs nothing from the file.
"""

from __future__ import annotations

import base64
import json
import math
import struct
from collections import OrderedDict
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trackway.checkpoints.digests import usable_cores
from trackway.checkpoints.layout import CheckpointError
from trackway.errors import InputError

SUFFIX = ".safetensors"
_ALIGN = 64  # the tensor bytes start this aligned in the file
_PART_MIN = 64 << 20
_PARTS_MAX = 16

_DTYPES = {
    name: getattr(torch, attr)
    for name, attr in (
        ("BOOL", "bool"), ("U8", "uint8"), ("I8", "int8"), ("U16", "uint16"), ("I16", "int16"),
        ("U32", "uint32"), ("I32", "int32"), ("U64", "uint64"), ("I64", "int64"), ("F16", "float16"),
        ("BF16", "bfloat16"), ("F32", "float32"), ("F64", "float64"), ("C64", "complex64"),
        ("F8_E4M3", "float8_e4m3fn"), ("F8_E5M2", "float8_e5m2"),
    )
    if hasattr(torch, attr)
}
_NAMES = {dtype: name for name, dtype in _DTYPES.items()}
_NON_FINITE = {"nan", "inf", "-inf"}


@dataclass(frozen=True)
class Part:
    """One file of a safetensors checkpoint: `header` (with its length), then each tensor's bytes in order."""

    header: bytes
    names: tuple[str, ...]
    tensors: tuple[torch.Tensor, ...]
    nbytes: int


@dataclass(frozen=True)
class Layout:
    """The files a state is written to, and the order to write the tensors in: (part, tensor), parts interleaved."""

    parts: tuple[Part, ...]
    order: tuple[tuple[int, torch.Tensor], ...]


def part_file(filename: str, index: int) -> str:
    """The file of part `index`: `state.safetensors` itself for part 0, `state-2.safetensors` for part 2."""
    if index == 0:
        return filename
    stem = filename.removesuffix(SUFFIX)
    return f"{stem}-{index}{SUFFIX}"


def parts_for(nbytes: int) -> int:
    """How many parts a state of `nbytes` is split into here: one per usable core and per 64 MiB, at most 16."""
    cores = usable_cores()
    return max(1, min(cores, nbytes // _PART_MIN, _PARTS_MAX))


def layout(state: dict, format_tag: str, parts: int | None = None) -> Layout:
    """Lay out a captured state (host tensors and plain values) in `parts` files (default: `parts_for`).

    Raises InputError naming a tensor that safetensors cannot hold.
    """
    encoder = _Encoder()
    skeleton = encoder.encode(state, ())
    count = parts or parts_for(sum(t.numel() * t.element_size() for t in encoder.tensors.values()))
    sizes, members = [0] * count, [[] for _ in range(count)]
    order = []
    for name, tensor in encoder.tensors.items():
        k = sizes.index(min(sizes))
        sizes[k] += tensor.numel() * tensor.element_size()
        members[k].append(name)
        order.append((k, tensor))
    built = []
    for k in range(count):
        metadata = {"format": format_tag, "part": str(k)}
        if k == 0:
            metadata = {"format": format_tag, "parts": str(count),
                        "state": json.dumps(skeleton, separators=(",", ":"), allow_nan=False)}
        entries, offset = {}, 0
        for name in members[k]:
            tensor = encoder.tensors[name]
            nbytes = tensor.numel() * tensor.element_size()
            entries[name] = {"dtype": _NAMES[tensor.dtype], "shape": list(tensor.shape),
                             "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
        header = json.dumps({"__metadata__": metadata, **entries}, separators=(",", ":")).encode()
        header += b" " * (-(8 + len(header)) % _ALIGN)
        built.append(Part(struct.pack("<Q", len(header)) + header, tuple(members[k]),
                          tuple(encoder.tensors[n] for n in members[k]), 8 + len(header) + offset))
    return Layout(tuple(built), tuple(order))


def read(path: Path, format_tag: str, map_location: Any = "cpu") -> dict:
    """The state a safetensors checkpoint file holds, tensors on `map_location` (a device)."""
    from safetensors import SafetensorError, safe_open

    device = _device(map_location)
    try:
        with ExitStack() as files:
            first = files.enter_context(safe_open(str(path), framework="pt", device="cpu"))
            metadata = first.metadata() or {}
            if metadata.get("format") == format_tag and "part" in metadata:
                raise CheckpointError(f"{path} is part {metadata['part']} of a checkpoint; load its part 0, "
                                      f"{path.name.rsplit('-', 1)[0]}{SUFFIX}")
            if metadata.get("format") != format_tag or "state" not in metadata:
                raise CheckpointError(f"{path} is not a trackway PyTorch checkpoint (expected format {format_tag!r})")
            where = {name: first for name in first.keys()}  # noqa: SIM118 - a safe_open, not a dict
            for k in range(1, int(metadata.get("parts", "1"))):
                part = path.with_name(part_file(path.name, k))
                if not part.is_file():
                    raise CheckpointError(f"{path} is in parts and its part {k}, {part.name}, is missing")
                handle = files.enter_context(safe_open(str(part), framework="pt", device="cpu"))
                where.update((name, handle) for name in handle.keys())  # noqa: SIM118
            loaded: dict[str, torch.Tensor] = {}

            def tensor(name: Any) -> torch.Tensor:
                if not isinstance(name, str) or name not in where:
                    raise CheckpointError(f"{path}: the state names a tensor {name!r} that its files do not hold")
                if name not in loaded:
                    loaded[name] = where[name].get_tensor(name).to(device)
                return loaded[name]

            return _decode(json.loads(metadata["state"]), tensor)
    except CheckpointError:
        raise
    except (SafetensorError, OSError, ValueError, TypeError, KeyError, RecursionError) as exc:
        raise CheckpointError(f"cannot read checkpoint file {path}: {type(exc).__name__}: {exc}") from exc


def _device(map_location: Any) -> torch.device:
    if map_location is None:
        return torch.device("cpu")
    if isinstance(map_location, (str, torch.device)):
        return torch.device(map_location)
    raise InputError(
        f"map_location must be a device (a str or torch.device) for a safetensors checkpoint, got {map_location!r}"
    )


class _Encoder:
    """One walk over a captured state: its JSON form, and each tensor's header entry and place in the file."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}  # by name, in the order met
        self._names: dict[int, str] = {}

    def encode(self, value: Any, path: tuple[str, ...]) -> Any:
        if isinstance(value, torch.Tensor):
            return {"$tensor": self._tensor(value, path)}
        if value is None or isinstance(value, (bool, int, str)):
            return value
        if isinstance(value, float):
            return value if math.isfinite(value) else {"$float": str(value)}
        if isinstance(value, torch.Size):
            return {"$size": list(value)}
        if isinstance(value, complex):
            return {"$complex": [self.encode(value.real, path), self.encode(value.imag, path)]}
        if isinstance(value, bytes):
            return {"$bytes": base64.b64encode(value).decode("ascii")}
        if isinstance(value, torch.dtype):
            return {"$dtype": str(value).removeprefix("torch.")}
        if isinstance(value, torch.device):
            return {"$device": str(value)}
        if isinstance(value, dict):
            items = [[self.encode(k, path), self.encode(v, (*path, str(k)))] for k, v in value.items()]
            if type(value) is dict:
                return {"$dict": items}
            metadata = getattr(value, "_metadata", None)
            return {"$odict": items, **({"$meta": self.encode(metadata, path)} if metadata is not None else {})}
        if isinstance(value, list):
            return [self.encode(v, (*path, str(i))) for i, v in enumerate(value)]
        if isinstance(value, tuple):
            return {"$tuple": [self.encode(v, (*path, str(i))) for i, v in enumerate(value)]}
        if isinstance(value, (set, frozenset)):
            return {"$set": [self.encode(v, path) for v in value]}
        raise InputError(
            f"checkpoint {'/'.join(path)}: a {type(value).__name__} cannot be stored in a safetensors checkpoint"
        )

    def _tensor(self, tensor: torch.Tensor, path: tuple[str, ...]) -> str:
        known = self._names.get(id(tensor))
        if known is not None:
            return known
        where = "/".join(path) or "state"
        if tensor.layout != torch.strided:
            raise InputError(
                f"checkpoint {where}: a {tensor.layout} tensor cannot be stored in a safetensors checkpoint; "
                "save with format='torch'"
            )
        if tensor.dtype not in _NAMES:
            raise InputError(
                f"checkpoint {where}: a {tensor.dtype} tensor cannot be stored in a safetensors checkpoint; "
                "save with format='torch'"
            )
        key = id(tensor)
        tensor = tensor if tensor.is_contiguous() else tensor.contiguous()
        name, n = where, 1
        while name in self.tensors or name == "__metadata__":
            n += 1
            name = f"{where}#{n}"
        self.tensors[name] = tensor
        self._names[key] = name
        return name


def _decode(value: Any, tensor: Callable[[Any], torch.Tensor]) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [_decode(v, tensor) for v in value]
    if not isinstance(value, dict) or not value:
        raise ValueError(f"unexpected {type(value).__name__} in the state's JSON")
    tag = next(iter(value))
    body = value[tag]
    extra = set(value) - {tag} - ({"$meta"} if tag == "$odict" else set())
    if extra:
        raise ValueError(f"unexpected keys {sorted(extra)} beside {tag} in the state's JSON")
    if tag == "$tensor":
        return tensor(body)
    if tag in ("$dict", "$odict"):
        out: dict = {} if tag == "$dict" else OrderedDict()
        for key, item in body:
            out[_decode(key, tensor)] = _decode(item, tensor)
        if "$meta" in value:
            out._metadata = _decode(value["$meta"], tensor)  # type: ignore[attr-defined]
        return out
    if tag == "$tuple":
        return tuple(_decode(v, tensor) for v in body)
    if tag == "$set":
        return {_decode(v, tensor) for v in body}
    if tag == "$float" and body in _NON_FINITE:
        return float(body)
    if tag == "$complex":
        real, imag = (_decode(v, tensor) for v in body)
        return complex(real, imag)
    if tag == "$bytes":
        return base64.b64decode(body, validate=True)
    if tag == "$dtype" and isinstance(getattr(torch, str(body), None), torch.dtype):
        return getattr(torch, body)
    if tag == "$device" and isinstance(body, str):
        try:
            return torch.device(body)
        except RuntimeError as exc:
            raise ValueError(f"bad device {body!r}") from exc
    if tag == "$size":
        return torch.Size(int(v) for v in body)
    raise ValueError(f"unknown {tag!r} ({body!r:.40}) in the state's JSON")
