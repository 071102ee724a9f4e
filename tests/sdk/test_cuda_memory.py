"""The GPU peak the SDK records for calibration: nothing without CUDA, an event when a peak is new, one at the end."""

from __future__ import annotations

import json

import torch

from trackway.sdk.cuda_memory import PeakRecorder, cuda_peaks
from trackway.sdk.writer import SpoolWriter

RECORDED = [{"device": 0, "name": "NVIDIA H100 80GB HBM3", "total_bytes": 85_520_809_984,
             "max_allocated_bytes": 60 * 2**30, "max_reserved_bytes": 64 * 2**30}]


def test_without_cuda_in_use_nothing_is_read():
    torch.zeros(4).sum()  # torch imported and used, on the CPU
    assert cuda_peaks() is None


def test_an_event_only_when_a_peak_is_new():
    said = []
    readings = iter([None, RECORDED, RECORDED, [{**RECORDED[0], "max_reserved_bytes": 70 * 2**30}]])
    recorder = PeakRecorder(lambda kind, fsync, **payload: said.append((kind, payload)), read=lambda: next(readings))
    for _ in range(4):
        recorder()
    assert [payload["devices"][0]["max_reserved_bytes"] for _, payload in said] == [64 * 2**30, 70 * 2**30]


def test_the_writer_records_the_peak_on_its_last_heartbeat(tmp_path):
    writer = SpoolWriter(tmp_path, heartbeat_interval_s=3600)
    writer.on_heartbeat = PeakRecorder(writer.event, read=lambda: RECORDED)
    writer.close()
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    (peak,) = [e for e in events if e["kind"] == "cuda_memory"]
    assert peak["devices"] == RECORDED
