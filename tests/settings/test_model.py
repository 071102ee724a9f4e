"""Every table of trackway.toml is checked when settings are read: unknown keys and bad values refused in one line.

The line names the file, the line, the table, the field and what was expected, in the words of
the field's own description (settings/model.py), which `trackway schema` also gives editors.
"""

from __future__ import annotations

import textwrap
from dataclasses import replace

import pytest

from trackway.checkpoints.retention import RetentionPolicy
from trackway.errors import InputError
from trackway.settings import DEFAULT_TRACKWAY_TOML, load_settings


def settings_with(tmp_path, text: str):
    (tmp_path / "trackway.toml").write_text(textwrap.dedent(text))
    return load_settings(home=tmp_path / "home", cwd=tmp_path)


@pytest.mark.parametrize("text, message", [
    ("[ledger]\n\n[resourses.gpu]\nexecutor = 'local'\n",
     "trackway.toml:3: [resourses]: unknown table; expected ledger, resources, selection, checkpoints, logs, retry, "
     "supervisor, evals, watchers, notify, preflight"),
    ("supervisor = 3\n", "trackway.toml:1: [supervisor]: expected a table"),
    ("[supervisor]\nstall_seconds = nan\n",
     "trackway.toml:2: [supervisor] stall_seconds: expected a number of seconds from 1 to 604800, got nan"),
    ("[supervisor]\nstop_on = [\"loss\"]\n",
     "trackway.toml:2: [supervisor] stop_on: expected a list of loss_rising, plateau, throughput_falling, "
     "memory_growing, gpu_underused, rank_stalled, got 'loss'"),
    ("[evals]\nmax_running = 0\n", "trackway.toml:2: [evals] max_running: expected a whole number ≥ 1, got 0"),
    ("[watchers.loss_rising]\nwindow = \"3 parsecs\"\n",
     "trackway.toml:2: [watchers.loss_rising] window: expected a number of steps or a duration, such as \"500 steps\", "
     "\"90s\", \"10m\" or \"3h\", got '3 parsecs'"),
    ("[watchers.gpu_underused]\nduration = \"500 steps\"\n",
     "trackway.toml:2: [watchers.gpu_underused] duration: expected a duration such as \"90s\", \"10m\" or \"2h\", "
     "got '500 steps'"),
    ("[watchers.plateau]\nmin_improvement = -0.5\n",
     "trackway.toml:2: [watchers.plateau] min_improvement: expected a fraction above 0 and at most 1, such as 0.01, "
     "got -0.5"),
    ("[evals]\nmax_running = true\n", "trackway.toml:2: [evals] max_running: expected a whole number ≥ 1, got true"),
    ("[notify]\nurls = [\"slack\"]\n",
     "trackway.toml:2: [notify] urls: 'slack': expected a URL such as json://host/path, "
     "slack://TOKEN_A/TOKEN_B/TOKEN_C or mailto://user:pass@host"),
    ("[notify]\nlink = \"ftp://box\"\n",
     "trackway.toml:2: [notify] link: expected the dashboard's http(s):// address, got 'ftp://box'"),
    ("[notify]\n\nevent = [\"attempts\"]\n",
     "trackway.toml:3: [notify] event: unknown key; expected urls, link, events"),
    ("[preflight]\nmode = \"loud\"\n",
     "trackway.toml:2: [preflight] mode: expected one of warn, strict, off, got 'loud'"),
    ("[preflight]\nkeys = { batch = \"train.batch\" }\n",
     "trackway.toml:2: [preflight.keys] batch: unknown key; expected some of model_config, params, layers"),
    ("[selection]\nfulll = [\"local\"]\n",
     "trackway.toml:2: [selection] fulll: expected a run kind among test, full, eval"),
    ("[checkpoints]\nkeep_last = 1\n",
     "trackway.toml:2: [checkpoints] keep_last: expected a whole number ≥ 2 (the newest checkpoint may turn out "
     "corrupt), got 1"),
    ("[logs]\nmetrics = [\"\"]\n",
     "trackway.toml:2: [logs] metrics: expected a string or a list of regular expressions, got ['']"),
    ("[ledger]\nurl = 5432\n",
     "trackway.toml:2: [ledger] url: expected a database URL such as postgresql+psycopg://user@host/db, got 5432"),
    ("[resources.a]\nexecutor = \"slurm\"\n\n[[resources.a.qos]]\nmax_hours = 1\n",
     "trackway.toml:4: [[resources.a.qos]] #1: expected name = \"...\" in each [[resources.NAME.qos]]"),
    ("[resources.a]\nexecutor = \"ssh\"\nhosts = [\"h\"]\nforward_env = [\"AWS KEY\"]\n",
     "trackway.toml:4: [resources.a] forward_env: expected variable names or globs such as AWS_*, got 'AWS KEY'"),
])
def test_a_bad_table_is_refused_naming_the_file_line_table_and_field(tmp_path, text, message):
    with pytest.raises(InputError) as caught:
        settings_with(tmp_path, text)
    said = str(caught.value)
    assert said.startswith(str(tmp_path / message.split(":", 1)[0])), said
    assert said.endswith(message.split("trackway.toml", 1)[1]) or message.split("trackway.toml", 1)[1] in said, said
    assert "\n" not in said


def test_the_embedded_defaults_read_as_the_defaults(tmp_path):
    written = settings_with(tmp_path, DEFAULT_TRACKWAY_TOML)
    (tmp_path / "trackway.toml").unlink()
    absent = load_settings(home=tmp_path / "home", cwd=tmp_path)

    # The file declares `local` and spells out gc's defaults; everything else is exactly what no file gives.
    assert replace(written, resources={}, retention={}) == replace(absent, resources={}, retention={})
    assert written.resources["local"] == replace(absent.resource("local"), declared=True)
    assert RetentionPolicy(**{k: v for k, v in written.retention.items() if k != "keep_evaluated"}) == RetentionPolicy()


def test_every_table_is_read_into_the_settings(tmp_path):
    settings = settings_with(tmp_path, """\
        [ledger]
        url = "sqlite:////tmp/elsewhere.db"
        [checkpoints]
        keep_last = 3
        keep_evaluated = "all"
        path = "out/ckpt-*"
        [logs]
        metrics = "step (?P<step>\\\\d+) loss (?P<loss>[0-9.]+)"
        [supervisor]
        stall_seconds = 120
        stop_on = ["plateau"]
        [evals]
        max_running = 4
        [notify]
        urls = "json://hooks.example.com/x"
        link = "http://gpu-box:8080/"
        events = ["attempts"]
        [preflight]
        mode = "strict"
        keys = { batch_size = "train.batch_size", model_config = "model.config" }
        [retry]
        gpu_hours_budget = 100
        """)

    assert settings.db_url == "sqlite:////tmp/elsewhere.db"
    assert settings.retention == {"keep_last": 3, "keep_evaluated": "all"}
    assert settings.checkpoint_paths == ("out/ckpt-*",)
    assert settings.log_metric_patterns == ("step (?P<step>\\d+) loss (?P<loss>[0-9.]+)",)
    assert (settings.stall_seconds, settings.stop_on, settings.eval_max_running) == (120.0, ("plateau",), 4)
    assert settings.notify_urls == ("json://hooks.example.com/x",)
    assert (settings.notify_link, settings.notify_events) == ("http://gpu-box:8080", ("attempts",))
    assert settings.preflight_mode == "strict"
    assert settings.preflight_keys == {"batch_size": "train.batch_size", "model_config": "model.config"}
    assert settings.retry == {"gpu_hours_budget": 100}


def test_a_checked_file_is_read_back_and_an_edited_one_checked_again(tmp_path):
    (tmp_path / "home").mkdir()
    first = settings_with(tmp_path, "[supervisor]\nstall_seconds = 120\n")
    remembered = list((tmp_path / "home" / "cache" / "settings").glob("*.json"))

    again = settings_with(tmp_path, "[supervisor]\nstall_seconds = 120\n")

    assert len(remembered) == 1 and again == first
    with pytest.raises(InputError, match=r"\[supervisor\] stall_seconds: expected a number of seconds"):
        settings_with(tmp_path, "[supervisor]\nstall_seconds = 0\n")
    assert settings_with(tmp_path, "[supervisor]\nstall_seconds = 90\n").stall_seconds == 90.0


def test_nothing_is_remembered_where_the_home_does_not_exist_yet(tmp_path):
    settings_with(tmp_path, "[evals]\nmax_running = 3\n")

    assert not (tmp_path / "home").exists()


def test_what_the_retry_policy_checks_later_is_remembered_as_the_file_says_it(tmp_path):
    (tmp_path / "home").mkdir()
    text = "[retry.reasons.infra_transient]\nbackoff_seconds = inf\n"
    first = settings_with(tmp_path, text)
    again = settings_with(tmp_path, text)  # read back from what was remembered

    assert first.retry == again.retry == {"reasons": {"infra_transient": {"backoff_seconds": float("inf")}}}
