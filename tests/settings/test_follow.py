"""Settings that follow trackway.toml: what a long-lived supervisor takes from an edit, and what it refuses."""

from pathlib import Path

from trackway.settings import load_settings
from trackway.settings.follow import SettingsFollower


def _follower(home: Path) -> SettingsFollower:
    return SettingsFollower(load_settings(), lambda: load_settings())


def _edit(text: str) -> None:
    path = Path("trackway.toml")
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text)
    if path.stat().st_mtime_ns == before:  # a coarse clock: make the edit visible as an edit
        import os
        os.utime(path, ns=(before + 1_000_000, before + 1_000_000))


def test_an_unchanged_file_says_nothing(home):
    _edit('[supervisor]\nstop_on = ["plateau"]\n')
    follower = _follower(home)
    assert follower.check() == (None, [])
    assert follower.check() == (None, [])


def test_an_edit_made_between_loading_and_following_is_not_missed(home):
    _edit('[supervisor]\nstop_on = ["plateau"]\n')
    settings = load_settings()
    _edit('[supervisor]\nstop_on = []\n')
    loaded, _ = SettingsFollower(settings, lambda: load_settings()).check()
    assert loaded is not None and loaded.stop_on == ()


def test_an_edit_takes_effect_and_says_what_changed(home):
    _edit('[supervisor]\nstop_on = ["plateau"]\n')
    follower = _follower(home)
    _edit('[supervisor]\nstop_on = ["plateau", "loss_rising"]\nstall_seconds = 120\n')
    loaded, lines = follower.check()
    assert loaded.stop_on == ("plateau", "loss_rising") and loaded.stall_seconds == 120
    (line,) = lines
    assert "stall_seconds: 600.0 → 120.0" in line and "stop_on: ['plateau'] → ['plateau', 'loss_rising']" in line


def test_a_bad_edit_keeps_the_running_settings_once(home):
    _edit('[supervisor]\nstop_on = ["plateau"]\n')
    follower = _follower(home)
    _edit('[supervisor]\nstall_seconds = -3\n')
    loaded, lines = follower.check()
    assert loaded is None and "not applied" in lines[0] and "stall_seconds" in lines[0]
    assert follower.check() == (None, [])  # said once per edit
    _edit('[supervisor]\nstall_seconds = 30\n')
    loaded, _ = follower.check()
    assert loaded.stall_seconds == 30 and loaded.stop_on == ()


def test_the_ledger_it_is_bound_to_is_not_switched_and_urls_are_not_shown(home):
    _edit('[notify]\nurls = ["json://hooks.example.com/a?token=s3cret"]\n')
    follower = _follower(home)
    _edit('[notify]\nurls = ["json://hooks.example.com/b?token=an0ther", "json://x.example/c"]\n')
    loaded, lines = follower.check()
    assert loaded is not None and "notify_urls: 1 → 2 (not shown" in lines[0] and "s3cret" not in lines[0]
    _edit('[ledger]\nurl = "sqlite:////tmp/elsewhere.db"\n')
    loaded, lines = follower.check()
    assert loaded is None and "db_url" in lines[0] and "running settings stay" in lines[0]
