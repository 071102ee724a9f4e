"""A CUDA OOM message becomes numbers, in PyTorch's current and older wording."""

from __future__ import annotations

from trackway.resources.oom_evidence import parse_oom

GIB, MIB = 2**30, 2**20


def test_the_current_message():
    line = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
            "79.15 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.07 GiB memory in "
            "use. Of the allocated memory 75.12 GiB is allocated by PyTorch, and 2.31 GiB is reserved by PyTorch but "
            "unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")
    found = parse_oom(["Traceback (most recent call last):", line])
    assert found.asked == 2 * GIB and found.device == 0
    assert found.capacity == round(79.15 * GIB) and found.free == round(1.06 * GIB)
    assert found.allocated == round(75.12 * GIB) and found.reserved == round(75.12 * GIB) + round(2.31 * GIB)
    assert found.process == round(78.07 * GIB)
    assert found.text() == ("asked 2.00 GiB on GPU 0 (79.15 GiB): 75.12 GiB allocated, 77.43 GiB reserved, "
                            "78.07 GiB in use by the process, 1.06 GiB free")


def test_the_older_message_and_its_typo():
    old = ("RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 1; 15.78 GiB total capacity; "
           "14.56 GiB already allocated; 3.44 MiB free; 14.81 GiB reserved in total by PyTorch)")
    found = parse_oom([old])
    assert (found.asked, found.device) == (20 * MIB, 1)
    assert found.capacity == round(15.78 * GIB) and found.free == round(3.44 * MIB)
    assert found.allocated == round(14.56 * GIB) and found.reserved == round(14.81 * GIB)
    typo = ("OutOfMemoryError: CUDA out of memory. Tried to allocate 5.96 GiB. GPU 0 has a total capacty of 23.69 GiB "
            "of which 5.25 GiB is free. Of the allocated memory 17.88 GiB is allocated by PyTorch, and 0 bytes is "
            "reserved by PyTorch but unallocated.")
    found = parse_oom([typo])
    assert found.capacity == round(23.69 * GIB) and found.reserved == found.allocated == round(17.88 * GIB)


def test_the_last_of_several_messages_and_none_without_one():
    first = "CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 8.00 GiB of which 0 bytes is free."
    second = "CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity of 8.00 GiB of which 0 bytes is free."
    assert parse_oom([first, second]).asked == 512 * MIB
    assert parse_oom(["Killed", "MemoryError"]) is None
