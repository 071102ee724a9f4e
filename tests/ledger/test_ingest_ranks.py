"""Each rank's metrics file, in the spool or in a fallback directory, is ingested into that rank's own series."""

from __future__ import annotations

from trackway.ledger.ingest import ingest_attempt
from trackway.ledger.reader import Reader
from trackway.spool import append_lines, encode_metric_rows, fallback_dirs, metrics_file

from .conftest import attempt_with_spool


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
