"""The capture's byte copy (checkpoints/_stream_copy.c): exactly memmove's result, at every size and alignment."""

from __future__ import annotations

import ctypes
import platform
import random

import pytest
import torch

from trackway.checkpoints import torch_state
from trackway.checkpoints.torch_state import HostBuffers, capture

try:
    from trackway.checkpoints import _stream_copy as stream_copy
except ImportError:  # an install without a C compiler: captures copy with memmove
    stream_copy = None
built = pytest.mark.skipif(stream_copy is None, reason="checkpoints/_stream_copy.c was not built here")

STREAM_FROM = 256 * 1024  # _stream_copy.c's threshold: sizes around it take both paths
GUARD = 64


def _address(buffer: bytearray, offset: int = 0) -> int:
    return ctypes.addressof((ctypes.c_char * len(buffer)).from_buffer(buffer)) + offset


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="streaming stores are x86-64 only")
def test_the_install_built_the_streaming_copy_and_captures_use_it() -> None:
    assert stream_copy is not None, "pip install did not build checkpoints/_stream_copy.c: is a C compiler installed?"
    assert stream_copy.STREAMING == 1
    assert torch_state.COPY == "streaming stores"
    assert torch_state.copy_bytes is stream_copy.copy


@built
@pytest.mark.parametrize(
    "nbytes",
    [0, 1, 15, 16, 17, 63, 64, 65, 4095]
    + [STREAM_FROM - 1, STREAM_FROM, STREAM_FROM + 1, STREAM_FROM + 63, (3 << 20) + 37],
)
@pytest.mark.parametrize(("src_offset", "dst_offset"), [(0, 0), (0, 5), (3, 0), (7, 13), (1, 15)])
def test_copies_exactly_the_bytes_asked_and_nothing_around_them(nbytes: int, src_offset: int, dst_offset: int) -> None:
    rng = random.Random(nbytes * 31 + src_offset * 7 + dst_offset)
    source = bytearray(rng.randbytes(nbytes + src_offset + GUARD))
    target = bytearray(b"\xa5" * (nbytes + dst_offset + GUARD))
    before = bytes(source)

    stream_copy.copy(_address(target, dst_offset), _address(source, src_offset), nbytes)

    assert target[dst_offset : dst_offset + nbytes] == source[src_offset : src_offset + nbytes]
    assert target[:dst_offset] == b"\xa5" * dst_offset  # nothing written before the range
    assert target[dst_offset + nbytes :] == b"\xa5" * GUARD  # nor after it
    assert source == before


@built
@pytest.mark.parametrize("shift", [-4096, -1, 1, 4096])
def test_overlapping_ranges_copy_as_memmove_does(shift: int) -> None:
    nbytes = 2 * STREAM_FROM
    data = bytearray(random.Random(shift).randbytes(nbytes + 2 * 4096))
    expected = bytearray(data)
    src, dst = 4096, 4096 + shift
    ctypes.memmove(_address(expected, dst), _address(expected, src), nbytes)

    stream_copy.copy(_address(data, dst), _address(data, src), nbytes)

    assert data == expected


@built
@pytest.mark.parametrize(
    ("args", "message"),
    [((1, 1, -1), "nbytes must be >= 0"), ((0, 1, 8), "a null address"), ((1, 0, 8), "a null address")],
)
def test_impossible_arguments_are_refused_before_any_copy(args: tuple[int, int, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        stream_copy.copy(*args)


@pytest.mark.parametrize("copier", ["installed", "memmove"])
def test_a_capture_large_enough_for_the_helper_thread_copies_every_byte(
    copier: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if copier == "memmove":  # what an install without a C compiler copies with
        monkeypatch.setattr(torch_state, "copy_bytes", ctypes.memmove)
    elif stream_copy is None:
        pytest.skip("checkpoints/_stream_copy.c was not built here")
    torch.manual_seed(0)
    # Pieces shared by two threads, a tail that is no multiple of 16 bytes, and tensors below the threshold.
    state = {
        "large": torch.randn((40 << 20) // 4 + 3),
        "odd": torch.randint(0, 255, (STREAM_FROM + 7,), dtype=torch.uint8),
        "small": torch.randn(5, 3),
    }
    buffers = HostBuffers()
    capture(model=state, buffers=buffers)
    for tensor in state.values():
        tensor.add_(1)  # the second capture overwrites the first's buffers: every byte must change
    snapshot = capture(model=state, buffers=buffers)

    for name, tensor in state.items():
        assert torch.equal(snapshot.state["model"][name], tensor), name
