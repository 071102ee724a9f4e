# Two commands set up everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo services test trials docs bench bench-peers clean

# The C source too: its extension is built by the install (pip install -e rebuilds it).
$(STAMP): pyproject.toml src/trackway/checkpoints/_stream_copy.c
	$(PYTHON) -m venv $(VENV)
	# torch first and pinned: the CPU build of 2.13.0 lies on this machine's disk; an unpinned
	# torch would pull a multi-GB CUDA build.
	$(PY) -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
	$(PY) -m pip install --quiet --disable-pip-version-check "torch==2.13.0" -e ".[torch,postgres,frameworks,remote,kubernetes,server,notify,agents,dev,docs]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

# What the suite, the trials and the benchmarks run against: PostgreSQL and a single-node Slurm are started
# (installed, on a fresh machine) when they are not up, a no-op when they are; sshd is installed when missing
# (the SSH tests start their own hosts), and Chromium (the dashboard's browser tests).
services:
	bash scripts/ensure-postgres.sh
	bash scripts/ensure-slurm.sh
	bash scripts/ensure-sshd.sh
	bash scripts/ensure-chromium.sh

# Tests that need a background supervisor turn it on themselves; elsewhere none is started,
# so that no supervisor outlives the test that caused it. Four workers on two cores: much of a test's time
# is waiting (on a scheduler, a login, a poll, a time limit), which the other workers fill. With three the
# cores idled 10% of the run; with four they idle 3%, and the suite took 7:53 where three took 8:37
# (docs/guide/performance.md, "The test suite").
# The slow fault trials (`-m slow`) are `make trials`.
test: $(STAMP) services
	TRACKWAY_BACKGROUND_SUPERVISOR=0 $(PY) -m pytest -n 4 --dist loadfile -m "not slow"

# The slow fault trials the suite leaves out (tests marked `slow`: whole-minute Slurm limits, every framework's
# launchers, ...), run as the suite runs; `make bench` runs them too (bench/bench_trials.py).
trials: $(STAMP) services
	$(PY) bench/bench_trials.py

# The design pages (docs/) as a site under build/docs; --strict: a broken link or an unlisted page fails.
# First the reference pages are written again from the code (docs/reference/: the CLI from the Typer app,
# the REST API from its OpenAPI document); tests/docs/test_reference.py fails when the committed ones differ.
docs: $(STAMP)
	$(PY) scripts/gen_reference.py
	$(VENV)/bin/mkdocs build --strict

# One table: figure, value, baseline, ratio, target, met; exits non-zero naming each missed figure.
bench: $(STAMP) services
	$(PY) bench/run_all.py

# trackway's log call beside wandb, mlflow, aim and tensorboardX, in one table; not part of `make bench`.
# The peers are no dependency of trackway: the first run installs them into bench/.peers-venv.
bench-peers: $(STAMP)
	$(PY) bench/bench_peers.py

clean:
	rm -rf $(VENV) .trackway bench/.peers-venv
