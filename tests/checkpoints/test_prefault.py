"""The restore's prefault thread (checkpoints/prefault.py): new pages faulted in ahead, no byte ever changed."""

from __future__ import annotations

import ctypes
import mmap
import resource
import sys

import pytest

from trackway.checkpoints import prefault
from trackway.checkpoints.prefault import PAGE, STEP, Prefaulter

linux_populate = pytest.mark.skipif(
    not sys.platform.startswith("linux") or prefault._populate() is None, reason="madvise(MADV_POPULATE_WRITE) is Linux's"
)


def _new_pages(nbytes: int) -> mmap.mmap:
    return mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def _address(buffer: mmap.mmap) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))


def _faults_writing(buffer: mmap.mmap) -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    view = memoryview(buffer)
    for at in range(0, len(buffer), PAGE):
        view[at] = 1
    view.release()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@linux_populate
def test_populated_pages_take_no_fault_when_the_reader_writes_them() -> None:
    fresh, populated = _new_pages(4 * STEP), _new_pages(4 * STEP)
    pages = len(fresh) // PAGE
    prefaulter = Prefaulter([memoryview(populated)])
    assert prefaulter.wait(timeout=30)
    prefaulter.stop()

    if _faults_writing(fresh) < pages // 2:
        pytest.skip("this kernel maps new anonymous pages without a fault each (huge pages?): nothing to compare")
    assert _faults_writing(populated) < pages // 16


@linux_populate
def test_populating_changes_no_byte_already_written_and_none_outside_its_view() -> None:
    buffer = _new_pages(3 * STEP + 3 * PAGE)
    pattern = bytes(range(256)) * (STEP // 256)
    buffer[PAGE : PAGE + STEP] = pattern  # written before populating: the reader got there first
    buffer[: PAGE] = b"\x5a" * PAGE  # a neighbour's bytes on the page before the view
    view = memoryview(buffer)[PAGE + 17 : len(buffer) - PAGE - 5]  # not page-aligned at either end

    prefaulter = Prefaulter([view])
    assert prefaulter.wait(timeout=30)
    prefaulter.stop()
    view.release()

    assert buffer[PAGE : PAGE + STEP] == pattern
    assert buffer[:PAGE] == b"\x5a" * PAGE
    assert buffer[PAGE + STEP :] == bytes(len(buffer) - PAGE - STEP)


def test_where_populating_fails_the_thread_gives_up_at_its_first_call(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int]] = []

    def refused(address: int, nbytes: int) -> bool:
        calls.append((address, nbytes))
        return False  # as madvise answers EINVAL on a kernel before 5.14

    monkeypatch.setattr(prefault, "_populate", lambda: refused)
    buffer = _new_pages(8 * STEP)
    prefaulter = Prefaulter([memoryview(buffer)])
    assert prefaulter.wait(timeout=30)
    prefaulter.stop()

    assert len(calls) == 1
    address, nbytes = calls[0]
    assert nbytes == STEP and address % PAGE == 0  # the last step of the view: it works back to front


def test_views_under_one_step_are_left_to_the_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(prefault, "_populate", lambda: lambda address, nbytes: calls.append((address, nbytes)) or True)
    small, large = _new_pages(STEP - PAGE), _new_pages(2 * STEP)

    prefaulter = Prefaulter([memoryview(small), memoryview(large)])
    assert prefaulter.wait(timeout=30)
    prefaulter.stop()

    assert sum(nbytes for _, nbytes in calls) == 2 * STEP
    assert all(len(large) > address - _address(large) >= 0 for address, _ in calls)
