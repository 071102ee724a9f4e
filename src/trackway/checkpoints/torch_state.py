"""A PyTorch checkpoint's content: what a capture copies to host memory, and how it is loaded back safely.

A capture holds the model, optimizer, scheduler and AMP scaler state dicts, the RNG states
(python, numpy, torch CPU and every initialized CUDA device), the data cursor and free-form
`extra`. Tensors are copied into `HostBuffers` allocated once and reused by later captures,
so the training step blocks only for the copy. Everything captured must load with
`torch.load(weights_only=True)`; that is checked at capture time, where the error can still
name the offending key, and it is the only way a checkpoint is ever loaded.
"""

from __future__ import annotations

import pickle
import random
import re
import sys
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trackway.checkpoints.protocol import (
    CheckpointError,
    CheckpointInfo,
    CheckpointRefused,
    CheckpointStore,
    PendingCheckpoint,
    parse_step,
)
from trackway.errors import InputError

FORMAT = "trackway.torch_state/1"
STATE_FILE = "state.pt"

_PLAIN = (str, int, float, bool, complex, bytes, type(None), torch.dtype, torch.device)


class HostBuffers:
    """Host-memory tensors reused across captures, keyed by state path, shape, dtype and pinning.

    Not thread-safe: a capture overwrites the buffers the previous snapshot points at, so
    the owner must make sure nothing still reads that snapshot (AsyncSaver does).
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple, torch.Tensor] = {}
        self._used: set[tuple] = set()

    def __len__(self) -> int:
        return len(self._buffers)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._buffers.values())

    def clear(self) -> None:
        self._buffers.clear()
        self._used.clear()

    def take(self, path: str, like: torch.Tensor) -> torch.Tensor:
        """The buffer for `path` shaped like `like`; allocated on first use, reused afterwards."""
        pin = like.device.type == "cuda"
        key = (path, tuple(like.shape), like.dtype, pin)
        self._used.add(key)
        buffer = self._buffers.get(key)
        if buffer is None:
            # An allocation under inference_mode would make an inference tensor that later
            # captures, outside inference_mode, are not allowed to copy into.
            with torch.inference_mode(False):
                buffer = torch.empty(tuple(like.shape), dtype=like.dtype, device="cpu", pin_memory=pin)
            self._buffers[key] = buffer
        return buffer

    def _start(self) -> None:
        self._used = set()

    def _finish(self) -> None:
        # Shapes change (a resized embedding, optimizer state appearing after the first step):
        # buffers the latest capture did not use would only pin memory.
        for key in list(self._buffers):
            if key not in self._used:
                del self._buffers[key]


@dataclass
class Snapshot:
    """One captured state in host memory, ready to serialize; valid until its buffers are reused."""

    state: dict
    nbytes: int

    def write(self, pending: PendingCheckpoint, filename: str = STATE_FILE) -> None:
        """Serialize into `filename` of the pending checkpoint (hashed and fsynced by the protocol)."""
        with pending.open(filename) as f:
            sink = _Sink(f)
            try:
                torch.save(self.state, sink)
            except Exception:
                # torch's C++ writer reports a failed write as "unexpected pos N vs M"; the
                # write's own error (disk full, I/O error) is the one that says what to fix.
                error = sink.error
                if error is not None and error.__cause__ is not None:
                    raise error  # from the OSError it names (a full disk): that cause must survive
                if error is not None:
                    raise error from None
                raise


class _Sink:
    """The file torch.save writes to, remembering the first write error."""

    def __init__(self, file: Any) -> None:
        self.file = file
        self.error: BaseException | None = None

    def write(self, data: Any) -> int:
        try:
            return self.file.write(data)
        except BaseException as exc:
            self.error = self.error or exc
            raise

    def flush(self) -> None:
        self.file.flush()


@dataclass(frozen=True)
class Restored:
    """What a restore gives back besides the state it loaded into the objects passed in."""

    step: int
    data_state: Any
    extra: Any
    metrics: dict
    path: Path
    info: CheckpointInfo


def capture(
    model: torch.nn.Module | dict | None = None,
    optimizer: Any = None,
    scheduler: Any = None,
    scaler: Any = None,
    data_state: Any = None,
    extra: Any = None,
    buffers: HostBuffers | None = None,
) -> Snapshot:
    """Copy the training state to host memory; raise InputError naming any key that cannot be stored.

    `model`, `optimizer`, `scheduler` and `scaler` may be objects with `state_dict()` or
    state dicts already. With `buffers`, tensors land in buffers reused from earlier captures.
    """
    buffers = buffers if buffers is not None else HostBuffers()
    raw = {
        "format": FORMAT,
        "model": _state_dict(model, "model"),
        "optimizer": _state_dict(optimizer, "optimizer"),
        "scheduler": _state_dict(scheduler, "scheduler"),
        "scaler": _state_dict(scaler, "scaler"),
        "rng": rng_state(),
        "data_state": data_state,
        "extra": extra,
    }
    copier = _Copier(buffers)
    buffers._start()
    with torch.inference_mode(False), torch.no_grad():
        state = {key: copier.copy(value, key, ()) for key, value in raw.items()}
        copier.synchronize()
    buffers._finish()
    return Snapshot(state=state, nbytes=copier.nbytes)


def rng_state() -> dict:
    """Every global RNG a training loop draws from, in a form weights_only can load."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    numpy = _numpy()
    if numpy is not None:
        kind, keys, pos, has_gauss, cached = numpy.random.get_state()
        state["numpy"] = {
            "kind": str(kind),
            "keys": torch.from_numpy(keys.astype(numpy.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        }
    # A process that never initialized CUDA has drawn no CUDA random numbers, and asking for
    # the state would create a context on every device of a CPU-only script.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Put back what `rng_state()` captured."""
    python = state.get("python")
    if python is not None:
        version, internal, gauss = python
        random.setstate((version, tuple(internal), gauss))
    if "torch" in state:
        torch.set_rng_state(state["torch"].to("cpu", torch.uint8))
    numpy = _numpy()
    saved = state.get("numpy")
    if numpy is not None and saved is not None:
        keys = saved["keys"]
        keys = keys.numpy() if isinstance(keys, torch.Tensor) else numpy.asarray(keys)
        numpy.random.set_state(
            (saved["kind"], keys.astype(numpy.uint32), saved["pos"], saved["has_gauss"], saved["cached_gaussian"])
        )
    cuda = state.get("cuda")
    if cuda and torch.cuda.is_available():
        # A resumed attempt may see fewer devices than the one that saved; it restores those it has.
        for index, device_state in enumerate(cuda[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(device_state.to("cpu", torch.uint8), index)


def restore(
    source: CheckpointInfo | str | Path,
    model: torch.nn.Module | None = None,
    optimizer: Any = None,
    scheduler: Any = None,
    scaler: Any = None,
    restore_rng: bool = True,
    map_location: Any = "cpu",
    filename: str = STATE_FILE,
) -> Restored:
    """Load a committed checkpoint into the objects given; only `torch.load(weights_only=True)` is used.

    The files' hashes are checked by whoever chose the checkpoint (`latest_committed()` does);
    here the marker must verify against the manifest, and `filename` is one rank's shard.
    """
    info = source if isinstance(source, CheckpointInfo) else _inspect(Path(source))
    if not info.state.readable:
        problems = f" ({'; '.join(info.problems)})" if info.problems else ""
        raise CheckpointError(
            f"checkpoint {info.path} is {info.state.value}, not committed{problems}; "
            "only committed checkpoints are read"
        )
    directory = Path(info.path)
    manifest = info.manifest or {}
    state = load_state(directory / filename, map_location=map_location)
    where = f"{directory.name}/{filename}"
    for key, target in (("model", model), ("optimizer", optimizer), ("scheduler", scheduler), ("scaler", scaler)):
        if target is None:
            continue
        saved = state.get(key)
        if saved is None:
            raise CheckpointError(f"checkpoint {where} holds no {key} state; it was saved without {key}=")
        try:
            target.load_state_dict(saved)
        except (RuntimeError, KeyError, ValueError, TypeError) as exc:
            raise CheckpointError(f"checkpoint {where}: the {key} state does not fit the {key} given: {exc}") from exc
    if restore_rng and state.get("rng"):
        set_rng_state(state["rng"])
    return Restored(
        step=info.step,
        data_state=state.get("data_state"),
        extra=state.get("extra"),
        metrics=dict(manifest.get("metrics") or {}),
        path=directory,
        info=info,
    )


def load_state(path: Path, map_location: Any = "cpu") -> dict:
    """The raw state dict of one checkpoint file, refusing anything but tensors and plain values.

    A refusal raises CheckpointRefused (nothing in the file ran): the caller sets the checkpoint aside.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {path} does not exist")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointRefused(
            f"refused to load {path}: {_refusal_reason(exc)}; checkpoints are loaded with "
            "weights_only=True and never run code, so this file was not written by trackway or was tampered with"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read checkpoint file {path}: {exc}") from exc
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a trackway PyTorch checkpoint (expected format {FORMAT!r})")
    return state


def _inspect(directory: Path) -> CheckpointInfo:
    step = parse_step(directory.name)
    info = CheckpointStore(directory.parent).get(step) if step is not None else None
    if info is None or info.path.resolve() != directory.resolve():
        raise CheckpointError(f"{directory} is not a checkpoint directory (expected step-N under a checkpoint root)")
    return info


def _refusal_reason(exc: Exception) -> str:
    text = str(exc)
    match = re.search(r"(Unsupported global: GLOBAL [^\s]+|unsupported GLOBAL [^\s]+[^.\n]*)", text)
    if match:
        return f"it asks to unpickle a non-tensor object ({match.group(1)})"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return f"it is not a plain tensor file ({lines[-1] if lines else type(exc).__name__})"


def _state_dict(obj: Any, what: str) -> Any:
    if obj is None or isinstance(obj, dict):
        return obj
    method = getattr(obj, "state_dict", None)
    if not callable(method):
        raise InputError(f"checkpoint {what}: {_kind(obj)} has no state_dict(); pass the object or its state dict")
    return method()


def _numpy():
    try:
        import numpy
    except ImportError:
        return None
    return numpy


class _Copier:
    """One capture's walk: validates every value and copies every tensor into host buffers."""

    def __init__(self, buffers: HostBuffers) -> None:
        self.buffers = buffers
        self.nbytes = 0
        self._seen: dict[tuple, torch.Tensor] = {}
        self._cuda_devices: set[torch.device] = set()

    def copy(self, value: Any, path: str, parents: tuple[int, ...]) -> Any:
        if isinstance(value, torch.Tensor):
            return self._tensor(value, path)
        if isinstance(value, torch.Size):
            return value
        if isinstance(value, _PLAIN):
            return value
        if _is_numpy_scalar(value):
            # np.int64 and friends are what data loaders hand out; as Python numbers they load anywhere.
            return self.copy(value.item(), path, parents)
        if isinstance(value, (dict, list, tuple, set)):
            if id(value) in parents:
                raise InputError(f"checkpoint {path}: a container that contains itself cannot be stored")
            parents = (*parents, id(value))
        if type(value) is dict or type(value) is OrderedDict:
            out = type(value)()
            for key, item in value.items():
                self._key(key, path)
                out[key] = self.copy(item, f"{path}[{key!r}]", parents)
            metadata = getattr(value, "_metadata", None)
            if metadata is not None:
                # load_state_dict reads module versions from here to upgrade old layouts.
                out._metadata = self.copy(metadata, f"{path}._metadata", parents)
            return out
        if type(value) is list or type(value) is tuple:
            items = [self.copy(item, f"{path}[{i}]", parents) for i, item in enumerate(value)]
            return items if type(value) is list else tuple(items)
        if type(value) is set:
            for item in value:
                self._key(item, path)
            return set(value)
        hint = "; convert it with torch.from_numpy()" if type(value).__name__ == "ndarray" else ""
        raise InputError(
            f"checkpoint {path}: {_kind(value)} cannot be stored; checkpoints hold tensors and plain values only{hint}"
        )

    def synchronize(self) -> None:
        # Copies from CUDA were queued non-blocking on each device's current stream; the
        # snapshot is only complete once those streams have run them.
        for device in self._cuda_devices:
            torch.cuda.current_stream(device).synchronize()

    def _key(self, key: Any, path: str) -> None:
        if not isinstance(key, (str, int, float, bool, type(None))):
            raise InputError(
                f"checkpoint {path}: a key of type {type(key).__name__} cannot be stored; use str or int keys"
            )

    def _tensor(self, tensor: torch.Tensor, path: str) -> torch.Tensor:
        if type(tensor) not in (torch.Tensor, torch.nn.Parameter):
            raise InputError(
                f"checkpoint {path}: a tensor subclass ({type(tensor).__name__}) cannot be stored; "
                "convert it to a plain tensor (e.g. .full_tensor() or .to_local())"
            )
        if tensor.device.type == "meta":
            raise InputError(f"checkpoint {path}: a meta tensor has no data to store; materialize it first")
        # Tied weights appear under several names; one buffer keeps them tied after loading.
        if tensor.layout == torch.strided:
            alias = (
                tensor.untyped_storage().data_ptr(),
                tensor.storage_offset(),
                tuple(tensor.shape),
                tensor.stride(),
                tensor.dtype,
                tensor.device,
            )
            if alias in self._seen:
                return self._seen[alias]
            buffer = self.buffers.take(path, tensor)
            if tensor.device.type == "cuda":
                buffer.copy_(tensor.detach(), non_blocking=True)
                self._cuda_devices.add(tensor.device)
            else:
                buffer.copy_(tensor.detach())
            self._seen[alias] = buffer
        else:
            buffer = tensor.detach().to("cpu", copy=True)
        self.nbytes += buffer.numel() * buffer.element_size()
        return buffer


def _is_numpy_scalar(value: Any) -> bool:
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.generic) and not isinstance(value, numpy.object_)


def _kind(value: Any) -> str:
    if callable(value) and hasattr(value, "__code__") or type(value).__name__ in ("builtin_function_or_method",):
        return "a function"
    if isinstance(value, type):
        return f"a class ({value.__qualname__})"
    kind = type(value)
    module = kind.__module__
    name = kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"
    return f"a {name} object"
