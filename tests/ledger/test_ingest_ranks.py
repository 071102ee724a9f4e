"""Each rank's metrics file, in the spool or in a fallback directory, is ingested into that rank's own series."""

from __future__ import annotations

from trackway.ledger.ingest import ingest_attempt
from trackway.ledger.reader import Reader
from trackway.spool import (
    FALLBACK_DIR_NAME,
    append_lines,
    encode_metric_rows,
    fallback_dirs,
    fallback_dirs_present,
    metrics_file,
)

from spool_attempt import attempt_with_spool


def test_two_ranks_logging_the_same_steps_keep_their_own_values(ledger, tmp_path, monkeypatch):
    monkeypatch.setenv("TRACKWAY_SPOOL_FALLBACK", str(tmp_path / "fallback"))
    attempt = attempt_with_spool(ledger, tmp_path / "attempt", run_id="rtwo")
    spool = tmp_path / "attempt" / "spool"
    for rank in (0, 1):
        append_lines(metrics_file(spool, rank), encode_metric_rows(
            (step, 1.0 + step, {"loss": 10.0 * rank + step}) for step in range(3)))
    # Rank 1's last step went to the fallback directory (its spool refused it for a while).
    fallback = fallback_dirs(spool)[0]
    fallback.mkdir(parents=True)
    append_lines(metrics_file(fallback, 1), encode_metric_rows([(3, 4.0, {"loss": 13.0})]))

    assert ingest_attempt(ledger, attempt).points == 7
    assert ingest_attempt(ledger, attempt).points == 0  # again: nothing new, nothing stored twice
    with ledger.read() as conn:
        reader = Reader.over(conn)
        assert reader.metric_ranks("rtwo") == [0, 1]
        assert [p["value"] for p in reader.metric_points("rtwo", key="loss")] == [0.0, 1.0, 2.0]
        assert [p["value"] for p in reader.metric_points("rtwo", key="loss", rank=1)] == [10.0, 11.0, 12.0, 13.0]


def test_fallback_directories_listed_once_stand_for_a_look_in_each(ledger, tmp_path, monkeypatch):
    # A supervisor recording a burst of ends lists the fallback directories once, after the poll that saw
    # them end, instead of asking after each spool's: what it lists is read, and nothing it missed is lost.
    monkeypatch.setenv("TRACKWAY_SPOOL_FALLBACK", str(tmp_path / "fallback"))
    attempt = attempt_with_spool(ledger, tmp_path / "attempt", run_id="rlisted")
    spool = tmp_path / "attempt" / "spool"
    append_lines(metrics_file(spool, 0), encode_metric_rows([(0, 1.0, {"loss": 3.0})]))
    assert fallback_dirs_present() == frozenset()  # no root holds any yet
    listed_before = fallback_dirs_present()
    fallback = fallback_dirs(spool)[0]
    fallback.mkdir(parents=True)
    append_lines(metrics_file(fallback, 0), encode_metric_rows([(1, 2.0, {"loss": 2.0})]))

    assert str(fallback) in fallback_dirs_present()
    # A listing from before the writer fell back does not show its directory: only the spool is read ...
    assert ingest_attempt(ledger, attempt, fallbacks=listed_before).points == 1
    # ... and the next listing does, from the start of the fallback file.
    assert ingest_attempt(ledger, attempt, fallbacks=fallback_dirs_present()).points == 1
    assert ingest_attempt(ledger, attempt).points == 0  # looking in each finds nothing more
    with ledger.read() as conn:
        assert [p["value"] for p in Reader.over(conn).metric_points("rlisted", key="loss")] == [3.0, 2.0]


def test_a_fallback_root_that_cannot_be_listed_means_looking_in_each(tmp_path, monkeypatch):
    root = tmp_path / "fallback"
    monkeypatch.setenv("TRACKWAY_SPOOL_FALLBACK", str(root))
    (root / FALLBACK_DIR_NAME / "0123").mkdir(parents=True)
    assert fallback_dirs_present() == {str(root / FALLBACK_DIR_NAME / "0123")}
    # Listing fails for another reason than absence (here a link to itself; elsewhere another user's
    # directory): None, so that the ingester looks in each candidate rather than miss one.
    (root / FALLBACK_DIR_NAME / "0123").rmdir()
    (root / FALLBACK_DIR_NAME).rmdir()
    (root / FALLBACK_DIR_NAME).symlink_to(root / FALLBACK_DIR_NAME)
    assert fallback_dirs_present() is None
