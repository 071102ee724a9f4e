"""A PyTorch checkpoint's content: what a capture copies to host memory, and how it is loaded back safely.

A capture holds the model, optimizer, scheduler and AMP scaler state dicts, the RNG states
(python, numpy, torch CPU and every initialized CUDA device), the data cursor and free-form
`extra`. Tensors are copied into `HostBuffers` allocated once and reused by later captures,
so the training step blocks only for the copy:

    CPU tensor   copied into its buffer with streaming stores (_stream_copy.c; memmove where it
                 was not built), shared with a helper thread piece by piece (torch's copy splits a
                 large copy across threads in fixed shares and waits for the slowest: on a busy
                 machine, one thread descheduled stalls the step several times over)
    CUDA tensor  queued on a copy stream of its own into pinned memory; the training's stream
                 waits for it before it runs anything else, the writer before it reads the buffers

Everything captured must load with `torch.load(weights_only=True)`; that is checked at capture
time, where the error can still name the offending key, and it is the only way a checkpoint is
ever loaded. A snapshot is written in one of two payload formats (`FORMATS`):

    "torch"        state.pt: torch.save's zip (without its CRC-32: the manifest's sha256 covers more)
    "safetensors"  state.safetensors (a large state also state-1.safetensors, ...: parts hashed on
                   several cores at once): the tensors by name, the rest as JSON; no pickle at all
                   (see safetensors_state)

Either way the host buffers are handed to the file as they lie (`write_held`): hashed where they
are while they are written, never copied again.
"""

from __future__ import annotations

import ctypes
import inspect
import pickle
import queue
import random
import re
import sys
import threading
from collections import OrderedDict
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trackway.checkpoints.digests import usable_cores
from trackway.checkpoints.formats import FORMATS, check_format, expected_state_files, find_state_file, state_file
from trackway.checkpoints.hashing import HashingWriter
from trackway.checkpoints.layout import CheckpointError, CheckpointInfo, CheckpointRefused, parse_step
from trackway.checkpoints.store import CheckpointStore
from trackway.checkpoints.write import PendingCheckpoint
from trackway.errors import InputError

try:
    # Built at install where a C compiler was found; it streams on x86-64 (see _stream_copy.c).
    from trackway.checkpoints._stream_copy import STREAMING
    from trackway.checkpoints._stream_copy import copy as copy_bytes
except ImportError:
    STREAMING, copy_bytes = 0, ctypes.memmove
COPY = "streaming stores" if STREAMING else "memmove"  # how a capture copies CPU tensors, as bench/ reports it

FORMAT = "trackway.torch_state/1"
STATE_FILE = "state.pt"
_HELD_MIN = 256 << 10  # smaller tensors are copied into the writer's stage with their neighbours

_PLAIN = (str, int, float, bool, complex, bytes, type(None), torch.dtype, torch.device)
_SCALARS = frozenset({str, int, float, bool, type(None)})


class HostBuffers:
    """Host-memory tensors reused across captures, keyed by state path, shape, dtype and pinning.

    Not thread-safe: a capture overwrites the buffers the previous snapshot points at, so
    the owner must make sure nothing still reads that snapshot (AsyncSaver does).
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple, torch.Tensor] = {}
        self._used: set[tuple] = set()
        self._streams: dict[torch.device, Any] = {}

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

    def copy_stream(self, device: torch.device) -> Any:
        """The CUDA stream that copies from `device` into these buffers (one per device, kept)."""
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device=device)
        return stream

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
    format: str = "torch"
    tensors: list[torch.Tensor] = field(default_factory=list)  # its host buffers (strided tensors), each once
    ready: list[Any] = field(default_factory=list)  # CUDA events: its copies from the GPU are done
    layout: Any = None  # safetensors_state.Layout, for format "safetensors"

    @property
    def filename(self) -> str:
        return state_file(0, self.format)

    def wait_ready(self) -> None:
        """Block until every copy from a GPU into this snapshot has landed."""
        for event in self.ready:
            event.synchronize()
        self.ready = []

    def write(self, pending: PendingCheckpoint, filename: str | None = None) -> None:
        """Serialize into `filename` (default `state.pt` / `state.safetensors`) of the pending checkpoint.

        The protocol's file hashes and fsyncs it; the snapshot's tensors are handed to it as they lie.
        """
        self.wait_ready()
        if self.format == "safetensors":
            _write_layout(pending, filename or self.filename, self.layout)
            return
        # A restore reads this one file whole before it loads anything: the blake3 lets it check the
        # bytes as fast as they arrive (digests.py). Safetensors parts need none: they are hashed
        # side by side, one per core, at save and at restore alike.
        with pending.open(filename or self.filename, blake3=True) as f:
            if isinstance(f, HashingWriter):
                f.reserve(self.nbytes)  # the tensors' bytes: the file's bulk, its zip records aside
            _write_torch(f, self.state, self.tensors)


def _write_torch(f: Any, state: dict, tensors: list[torch.Tensor]) -> None:
    sink = _Sink(f, _held_storages(tensors) if isinstance(f, HashingWriter) else {})
    try:
        _torch_save(state, sink)
    except Exception:
        # torch's C++ writer reports a failed write as "unexpected pos N vs M"; the
        # write's own error (disk full, I/O error) is the one that says what to fix.
        error = sink.error
        if error is not None and error.__cause__ is not None:
            raise error  # from the OSError it names (a full disk): that cause must survive
        if error is not None:
            raise error from None
        raise


def _write_layout(pending: PendingCheckpoint, filename: str, layout: Any) -> None:
    """Write every part at once, tensors in the layout's interleaved order, so that all parts' hashers run together."""
    from trackway.checkpoints.safetensors_state import part_file

    with ExitStack() as stack:
        files = [stack.enter_context(pending.open(part_file(filename, k))) for k in range(len(layout.parts))]
        for f, part in zip(files, layout.parts):
            if isinstance(f, HashingWriter):
                f.reserve(part.nbytes)  # every part's room before any byte: a disk too small fails here
        for f, part in zip(files, layout.parts):
            f.write(part.header)
        for k, tensor in layout.order:
            nbytes = tensor.numel() * tensor.element_size()
            if nbytes == 0:
                continue
            view = _raw_bytes(tensor.data_ptr(), nbytes)
            if nbytes >= _HELD_MIN and isinstance(files[k], HashingWriter):
                files[k].write_held(view, tensor)
            else:
                files[k].write(view)


def _torch_save_parameters_known() -> bool:
    save = getattr(torch.serialization, "_save", None)
    if save is None or not hasattr(torch.serialization, "_get_storage_alignment"):
        return False
    names = list(inspect.signature(save).parameters)
    return names == ["obj", "zip_file", "pickle_module", "pickle_protocol", "_disable_byteorder_record"]


_NO_CRC = _torch_save_parameters_known()


def _torch_save(state: dict, sink: _Sink) -> None:
    """torch.save(state, sink), without the CRC-32 of every record where this torch allows it.

    The same zip that torch.save writes (torch.load reads it), minus a checksum pass over every
    byte that the manifest's sha256 makes redundant. torch.save's switch for it is process-wide
    (another thread's torch.save would lose its CRCs), so the writer is opened here as torch.save
    opens it. An unknown torch falls back to torch.save.
    """
    writer = None
    if _NO_CRC:
        try:
            writer = torch._C.PyTorchFileWriter(sink, False, torch.serialization._get_storage_alignment())
        except (AttributeError, TypeError):
            writer = None
    if writer is None:
        torch.save(state, sink)
        return
    try:
        torch.serialization._save(state, writer, pickle, torch.serialization.DEFAULT_PROTOCOL, False)
    finally:
        writer.write_end_of_file()  # as torch.save does, even after a failure: it marks the writer finished
    sink.flush()


def _held_storages(tensors: list[torch.Tensor]) -> dict[int, tuple[int, torch.Tensor]]:
    """{address: (bytes, tensor)} of each snapshot tensor's whole storage, which torch.save writes in one piece."""
    if _numpy() is None:
        return {}
    held = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        if storage.nbytes() >= _HELD_MIN and tensor.device.type == "cpu":
            held[storage.data_ptr()] = (storage.nbytes(), tensor)
    return held


def _raw_bytes(address: int, nbytes: int) -> memoryview:
    """The `nbytes` bytes of memory at `address`, as a memoryview (whoever owns them must outlive it)."""
    return memoryview((ctypes.c_ubyte * nbytes).from_address(address)).cast("B")


class _Sink:
    """The file torch.save writes to, remembering the first write error.

    A write of a whole snapshot storage (torch.save writes each from where it lies) goes to the
    file as held: hashed in place rather than copied.
    """

    def __init__(self, file: Any, held: dict[int, tuple[int, torch.Tensor]]) -> None:
        self.file = file
        self.held = held
        self.error: BaseException | None = None

    def write(self, data: Any) -> int:
        try:
            if self.held:
                view = memoryview(data)
                if view.nbytes >= _HELD_MIN:
                    found = self.held.get(_numpy().frombuffer(view, dtype="uint8").ctypes.data)
                    if found is not None and found[0] == view.nbytes:
                        owner = found[1]
                        storage = owner.untyped_storage()
                        return self.file.write_held(_raw_bytes(storage.data_ptr(), storage.nbytes()), owner)
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
    format: str = "torch",  # noqa: A002 - the user-facing word
) -> Snapshot:
    """Copy the training state to host memory; raise InputError naming any key that cannot be stored.

    `model`, `optimizer`, `scheduler` and `scaler` may be objects with `state_dict()` or
    state dicts already. With `buffers`, tensors land in buffers reused from earlier captures.
    `format` is the payload format the snapshot will be written in (`FORMATS`); what it cannot
    hold is refused here, naming the key.
    """
    check_format(format)
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
        ready = copier.finish()
    buffers._finish()
    snapshot = Snapshot(state=state, nbytes=copier.nbytes, format=format, tensors=copier.tensors, ready=ready)
    if format == "safetensors":
        from trackway.checkpoints import safetensors_state

        snapshot.layout = safetensors_state.layout(state, FORMAT)
    return snapshot


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
    filename: str | None = None,
    verify: bool = True,
) -> Restored:
    """Load a committed checkpoint into the objects given; nothing in it can run code (see `load_state`).

    The marker must verify against the manifest, and `filename` is one rank's shard (default:
    rank 0's, in whichever format it was saved). With `verify` (the default) a torch state file is
    hashed as it is read and CheckpointCorrupt raised, nothing loaded, when it does not match the
    manifest (`verify=False`: the caller has just verified it); safetensors files are verified by
    whoever chose the checkpoint (`latest_committed()` does), see formats.hashed_on_load.
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
    filename = filename or shard_file(info, 0)
    listed = (manifest.get("files") or {}) if verify else None
    state = load_state(directory / filename, map_location=map_location, listed=listed)
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


def shard_file(info: CheckpointInfo, rank: int) -> str:
    """The file holding `rank`'s state in a checkpoint, whichever format it was saved in; CheckpointError if none."""
    listed = (info.manifest or {}).get("files") or {}
    found = find_state_file(listed, rank)
    if found is None:
        states = sorted(name for name in listed if name.endswith(tuple(FORMATS.values())))
        raise CheckpointError(
            f"checkpoint {info.name} has no {expected_state_files(rank)} (it holds "
            f"{', '.join(states) or 'no state files'}); was it saved with a different number of ranks?"
        )
    return found


def load_state(path: Path, map_location: Any = "cpu", listed: dict | None = None) -> dict:
    """The raw state dict of one checkpoint file, refusing anything but tensors and plain values.

    `.safetensors` files are read by safetensors (no pickle at all), others by
    `torch.load(weights_only=True)`. A refusal raises CheckpointRefused (nothing in the file
    ran): the caller sets the checkpoint aside. With `listed` (the manifest's files table), a
    torch file is verified as it is read (verified_read.py): CheckpointCorrupt when it does not
    match, before anything in it is parsed; safetensors files are not (formats.hashed_on_load).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {path} does not exist")
    if path.suffix == FORMATS["safetensors"]:
        from trackway.checkpoints import safetensors_state

        return safetensors_state.read(path, FORMAT, map_location)  # hashed by the caller first (hashed_on_load)
    try:
        if listed is not None:
            state = _load_verified(path, listed, map_location)
        else:
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


def _load_verified(path: Path, listed: dict, map_location: Any) -> Any:
    """torch.load(weights_only=True) of a file read once and verified against its manifest entry.

    Each tensor's bytes are read straight into a storage of their own, which the loader hands
    out as it lies (as torch.load(mmap=True) hands out slices of a mapping): the file is copied
    once, as torch.load copies it. An unknown torch reads the verified bytes through torch.load.
    """
    from trackway.checkpoints.verified_read import read_verified

    entry = listed.get(path.name)
    if not isinstance(entry, dict):
        raise CheckpointError(f"checkpoint file {path} is not in its manifest; only listed files are read")
    verified = read_verified(path, path.name, entry, _zip_records(path), _storage)
    magic = bytearray(4)
    verified.take(0, memoryview(magic))
    if not _LOAD_FROM_STORAGE or magic != b"PK\x03\x04":  # not torch.save's zip: torch.load says what it is
        return torch.load(verified.file(), map_location=map_location, weights_only=True)
    reader = torch._C.PyTorchFileReader(verified.file())
    return torch.serialization._load(reader, map_location, torch.serialization._weights_only_unpickler,
                                     overall_storage=_Storages(verified), encoding="utf-8")


def _load_from_storage_known() -> bool:
    load = getattr(torch.serialization, "_load", None)
    if load is None or not hasattr(torch.serialization, "_weights_only_unpickler"):
        return False
    names = list(inspect.signature(load).parameters)
    return names[:5] == ["zip_file", "map_location", "pickle_module", "pickle_file", "overall_storage"]


_LOAD_FROM_STORAGE = _load_from_storage_known()


def _storage(nbytes: int) -> tuple[torch.UntypedStorage, memoryview]:
    storage = torch.empty(nbytes, dtype=torch.uint8).untyped_storage()
    return storage, _raw_bytes(storage.data_ptr(), nbytes)


def _zip_records(path: Path) -> list[tuple[int, int]]:
    """(offset, nbytes) of each tensor record worth a storage of its own in torch.save's zip; [] when unsure.

    Only a hint (read_verified serves any range, and a region that is not exactly a record is just
    copied), taken from the central directory alone: reading each record's local header instead
    costs a seek per record before the sequential read starts, 40-80 ms of a cold 252 MB restore
    on our disks. torch.save pads each local header's extra field (4 bytes of its own, then
    padding) so that the data starts on the storage alignment, 64 bytes unless changed.
    """
    import zipfile

    records = []
    try:
        with open(path, "rb") as f, zipfile.ZipFile(f) as archive:
            for entry in archive.infolist():
                if entry.compress_type != zipfile.ZIP_STORED or entry.file_size < _HELD_MIN \
                        or "/data/" not in f"/{entry.filename}":
                    continue
                header_end = entry.header_offset + 30 + len(entry.orig_filename.encode()) + 4
                records.append((-(-header_end // _ZIP_ALIGNMENT) * _ZIP_ALIGNMENT, entry.file_size))
    except (OSError, ValueError, zipfile.BadZipFile):
        return []
    return sorted(records)


_ZIP_ALIGNMENT = 64  # torch.serialization.config.save.storage_alignment's default


class _Storages:
    """What torch's loader slices storages from (its `overall_storage`): the verified file's regions, as they lie."""

    def __init__(self, verified: Any) -> None:
        self.verified = verified

    def __getitem__(self, index: slice) -> torch.UntypedStorage:
        start, stop = index.start, index.stop
        owner = self.verified.region(start, stop)
        if owner is not None:
            return owner
        storage = torch.UntypedStorage(stop - start)
        if stop > start:
            self.verified.take(start, _raw_bytes(storage.data_ptr(), stop - start))
        return storage


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
        self.tensors: list[torch.Tensor] = []
        self._seen: dict[tuple, torch.Tensor] = {}
        self._streams: dict[torch.device, Any] = {}
        self._moves = _Moves()

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
            if all(type(item) in _SCALARS for item in value):  # python's RNG state: 625 ints, walked in one go
                return list(value) if type(value) is list else value
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

    def finish(self) -> list[Any]:
        """Do the CPU copies; return an event per GPU copied from, recorded after its copies.

        The snapshot's reader waits for the events. The training's stream waits for them too, so
        nothing queued after the capture can change a tensor before its copy has read it; the
        training thread itself does not wait (its GPU copies run while it does the CPU ones).
        """
        self._moves.run()
        events = []
        for device, stream in self._streams.items():
            event = torch.cuda.Event(blocking=True)  # the writer waiting for it sleeps rather than spins
            event.record(stream)
            torch.cuda.current_stream(device).wait_event(event)
            events.append(event)
        return events

    def _copy_stream(self, device: torch.device) -> Any:
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = self.buffers.copy_stream(device)
            # The copies must see everything queued so far on the training's stream.
            stream.wait_stream(torch.cuda.current_stream(device))
        return stream

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
                stream = self._copy_stream(tensor.device)
                with torch.cuda.stream(stream):
                    buffer.copy_(tensor.detach(), non_blocking=True)
                # Freed by the training before the copy ran, its memory must not be handed out again.
                tensor.detach().record_stream(stream)
            elif tensor.device.type == "cpu" and _plain_memory(tensor):
                self._moves.add(buffer.data_ptr(), tensor.data_ptr(), buffer.numel() * buffer.element_size())
            else:
                buffer.copy_(tensor.detach())
            self._seen[alias] = buffer
            self.tensors.append(buffer)
        else:
            buffer = tensor.detach().to("cpu", copy=True)
        self.nbytes += buffer.numel() * buffer.element_size()
        return buffer


class _Moves:
    """A capture's CPU copies, in pieces of at most 16 MiB, done by the caller and a helper thread together.

    Each takes the next piece until none is left (`copy_bytes` lets go of the GIL), so a thread
    descheduled on a busy machine delays only the piece it holds: the caller waits for pieces the
    helper took, never for the helper to wake. Where the machine is idle two threads copy a little
    faster than one; where it is busy they get twice one thread's share of the CPU.
    """

    # Each piece costs both threads a turn of the GIL. A 252 MB state on 2 cores, streaming: 2 MiB
    # pieces 14.4 ms, 4 to 16 MiB 12.3 ms; with two busy processes beside it, 16 MiB pieces 18.7 ms
    # (p90 22 ms; memmove's 29 ms, p90 33; torch's own OpenMP copy's p90 150 ms).
    PIECE = 16 << 20
    SHARED_FROM = 16 << 20  # less is not worth waking the helper

    def __init__(self) -> None:
        self.pieces: list[tuple[int, int, int]] = []
        self.nbytes = 0
        self._next = self._taken = 0
        self._done = threading.Condition()

    def add(self, dst: int, src: int, nbytes: int) -> None:
        for offset in range(0, nbytes, self.PIECE):
            self.pieces.append((dst + offset, src + offset, min(self.PIECE, nbytes - offset)))
        self.nbytes += nbytes

    def run(self) -> None:
        if self.nbytes >= self.SHARED_FROM and usable_cores() > 1:
            _copy_helper().put(self)
        self.share()
        with self._done:  # the pieces the helper took
            self._done.wait_for(lambda: self._taken == 0)

    def share(self) -> None:
        """Copy pieces until none is left (called by both threads)."""
        while True:
            with self._done:
                if self._next >= len(self.pieces):
                    return
                dst, src, nbytes = self.pieces[self._next]
                self._next += 1
                self._taken += 1
            copy_bytes(dst, src, nbytes)
            with self._done:
                self._taken -= 1
                if self._taken == 0:
                    self._done.notify_all()


_helper_queue: queue.SimpleQueue[_Moves] | None = None
_helper_lock = threading.Lock()


def _copy_helper() -> queue.SimpleQueue[_Moves]:
    """The queue of the process's copy helper thread (started on first use; a daemon, idle between captures)."""
    global _helper_queue
    with _helper_lock:
        if _helper_queue is None:
            work: queue.SimpleQueue[_Moves] = queue.SimpleQueue()

            def help_out() -> None:
                while True:
                    work.get().share()

            threading.Thread(target=help_out, name="trackway-capture-copy", daemon=True).start()
            _helper_queue = work
    return _helper_queue


def _plain_memory(tensor: torch.Tensor) -> bool:
    """Whether the tensor's value is exactly its bytes, back to back (no conjugate or negative view, not quantized)."""
    return tensor.is_contiguous() and not tensor.is_conj() and not tensor.is_neg() and not tensor.is_quantized


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
