"""Between ticks (supervisor/loop.py's pause): an end the local host says at once is recorded then, not at the next interval.

Real processes on the local executor's host shim, a real SQLite ledger, `Supervisor.run` as
`trackway supervise` runs it, with an interval far longer than the test may take.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from trackway.executors.local_host import ended_fifo, open_ended_signal, say_ended
from trackway.ledger import open_ledger
from trackway.ledger.records import latest_attempt
from trackway.settings import load_settings
from trackway.supervisor.launch import start_attempt
from trackway.supervisor.loop import Supervisor
from trackway.supervisor.submit import RunSpec, submit_run
from waiting import wait_for

LONG_INTERVAL_S = 600.0
PATIENCE_S = 60.0


def test_an_end_wakes_a_supervisor_between_its_ticks(tmp_path, sqlite_url):
    settings = load_settings(home=tmp_path / "home", db=sqlite_url, cwd=tmp_path)
    ledger = open_ledger(sqlite_url)
    supervisor = Supervisor(ledger, settings)
    go = tmp_path / "go"
    waits = f"import os, sys, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.02)\nsys.exit(3)"
    run_id = submit_run(ledger, settings, RunSpec(command=[sys.executable, "-c", waits], cwd=tmp_path))
    start_attempt(ledger, settings, run_id, supervisor.executor("local"))

    ticks: list[float] = []
    ended = threading.Event()
    give_up = time.monotonic() + PATIENCE_S

    def on_ends(ends) -> None:
        ticks.append(time.monotonic())
        if ends:
            ended.set()

    def should_stop() -> bool:
        return ended.is_set() or time.monotonic() > give_up

    looping = threading.Thread(target=supervisor.run, args=(should_stop, LONG_INTERVAL_S, on_ends), daemon=True)
    looping.start()
    try:
        # The first tick saw the attempt running; the next is due in ten minutes.
        wait_for(lambda: ticks or not looping.is_alive(), "the supervisor's first tick", PATIENCE_S, 0.02)
        assert looping.is_alive()
        go.touch()
        looping.join(PATIENCE_S + 5)
        assert ended.is_set(), "the end waited for the supervisor's interval"
        assert not looping.is_alive()  # and the loop stopped at once, not an interval later
        with ledger.read() as conn:
            attempt = latest_attempt(conn, run_id)
        assert attempt["state"] == "ended" and attempt["exit_code"] == 3
        assert len(ticks) == 2  # woken once, by the end: no tick in between
    finally:
        go.touch()
        ledger.dispose()


def test_a_word_of_an_end_reaches_a_reader_and_is_dropped_without_one(tmp_path):
    home = tmp_path / "home"
    say_ended(home)  # no fifo yet, nobody reading: nothing happens, nothing blocks
    fd = open_ended_signal(home)
    assert fd is not None and oct(os.stat(ended_fifo(home)).st_mode & 0o777) == "0o600"
    try:
        for _ in range(100_000):  # more than a pipe holds: the writer never waits for the reader
            say_ended(home)
        assert os.read(fd, 1) == b"e"
    finally:
        os.close(fd)
    say_ended(home)  # the reader gone again


def test_a_file_or_link_in_place_of_the_fifo_is_never_written(tmp_path):
    home = tmp_path / "home"
    ended_fifo(home).parent.mkdir(parents=True)
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me\n")
    ended_fifo(home).symlink_to(precious)
    say_ended(home)
    assert open_ended_signal(home) is None
    ended_fifo(home).unlink()
    ended_fifo(home).write_text("a plain file\n")
    say_ended(home)
    assert open_ended_signal(home) is None
    assert precious.read_text() == "keep me\n" and ended_fifo(home).read_text() == "a plain file\n"


def test_watching_many_running_attempts_gives_way_to_an_end_once_a_burst_had_its_gap(tmp_path):
    from trackway.supervisor.loop import MIN_TICK_GAP_S, _EndsHeard

    home = tmp_path / "home"
    fd = open_ended_signal(home)
    looks = _EndsHeard.LOOK_EVERY
    try:
        say_ended(home)
        just_started = _EndsHeard([fd], time.monotonic())
        assert not any(just_started.now() for _ in range(10 * looks))  # a burst's ends are still taken a batch a tick
        heard = _EndsHeard([fd], time.monotonic() - MIN_TICK_GAP_S)
        assert any(heard.now() for _ in range(looks))  # within LOOK_EVERY attempts watched
        assert not any(heard.now() for _ in range(10 * looks))  # heard once: the next tick watches on
        say_ended(home)
        assert not any(_EndsHeard([], 0.0).now() for _ in range(10 * looks))  # no word, no cut
    finally:
        os.close(fd)
