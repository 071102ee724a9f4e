"""Shared fixtures: a real ledger on each backend (SQLite file, PostgreSQL database), an isolated home, the CLI,
and a real S3 (moto's server, from s3_server.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from trackway.cli.errors import run_app
from trackway.cli.main import app
from trackway.ledger import Ledger, open_ledger

# tests/ is not on sys.path (import mode importlib): s3_server.py is loaded by path, once, under one name,
# so that a test module reaching it the same way gets this very module (and its S3Server class).
_S3_SPEC = importlib.util.spec_from_file_location("trackway_tests_s3_server", Path(__file__).with_name("s3_server.py"))
s3_server_module = sys.modules.setdefault(_S3_SPEC.name, importlib.util.module_from_spec(_S3_SPEC))
if not hasattr(s3_server_module, "s3_server"):
    _S3_SPEC.loader.exec_module(s3_server_module)
s3_server = s3_server_module.s3_server

# Commands the tests run must leave no background supervisor behind (one that holds a queued run
# never idles out), whoever starts pytest: as under `make test`. Tests of that supervisor turn it on.
os.environ.setdefault("TRACKWAY_BACKGROUND_SUPERVISOR", "0")

# One intra-op thread for every PyTorch process the suite starts (and for the workers' own): four workers share
# two cores, and a script's OpenMP threads spin between operations while the other workers wait for a core. A
# nanoGPT-style example of 100 iterations took 4.3 s of CPU with torch's default two threads and 2.9 s with one,
# on an idle machine. torchrun sets the same for its ranks; nothing the tests check depends on the thread count.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# CI starts PostgreSQL before the suite (see .ci/run); a developer may point elsewhere.
PG_ADMIN_URL = os.environ.get("TRACKWAY_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def _pg_admin():
    return create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT", pool_pre_ping=True)


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    """A migrated PostgreSQL database that per-test databases are copied from (fast)."""
    name = f"trackway_tmpl_{uuid.uuid4().hex[:8]}"
    admin = _pg_admin()
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    ledger = open_ledger(url)
    ledger.dispose()
    yield name
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="session")
def pg_pool(pg_template: str) -> Iterator[DatabasePool]:
    """Copies of the template made ahead of the tests that need them (tests/pg_pool.py)."""
    pool = DatabasePool(PG_ADMIN_URL, pg_template)
    yield pool
    pool.close()


@pytest.fixture
def pg_url(pg_pool: DatabasePool) -> Iterator[str]:
    """A fresh, migrated PostgreSQL database for one test."""
    name = pg_pool.take()
    yield make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    pg_pool.give_back(name)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory) -> Path:
    """A migrated SQLite ledger that each test's is copied from: a copy costs a millisecond, migrating one 0.1-0.5 s."""
    path = tmp_path_factory.mktemp("sqlite-template") / "ledger.db"
    open_ledger(f"sqlite:///{path}").dispose()  # closed: its WAL checkpointed into the file, which alone is copied
    return path


@pytest.fixture
def sqlite_url(tmp_path: Path, sqlite_template: Path) -> str:
    """A fresh, migrated SQLite ledger for one test, as `open_ledger` makes one (the file private to its owner)."""
    path = tmp_path / "ledger.db"
    shutil.copy2(sqlite_template, path)  # copy2 keeps the template's mode, 0o600 as open_ledger made it
    return f"sqlite:///{path}"


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def module_ledger_url(request, tmp_path_factory, sqlite_template: Path) -> Iterator[str]:
    """A fresh, migrated ledger per backend that one module's tests share: for tests that only read what a
    fixture filled it with (a PostgreSQL database costs about 0.3 s to make, a read a millisecond)."""
    if request.param == "sqlite":
        path = tmp_path_factory.mktemp("module-ledger") / "ledger.db"
        shutil.copy2(sqlite_template, path)
        yield f"sqlite:///{path}"
        return
    yield request.getfixturevalue("module_pg_url")


@pytest.fixture(scope="module")
def module_ledger(module_ledger_url: str) -> Iterator[Ledger]:
    """The module's shared ledger (`module_ledger_url`), open for its tests and closed after the last."""
    ledger = open_ledger(module_ledger_url)
    yield ledger
    ledger.dispose()


@pytest.fixture(scope="module")
def module_pg_url(pg_pool: DatabasePool) -> Iterator[str]:
    """One fresh, migrated PostgreSQL database a module's tests share (`module_ledger_url`'s, and its
    PostgreSQL-only tests')."""
    name = pg_pool.take()
    try:
        yield make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        pg_pool.give_back(name)


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request) -> str:
    """The ledger contract suite runs once per backend."""
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


@pytest.fixture
def ledger(ledger_url: str) -> Iterator[Ledger]:
    led = open_ledger(ledger_url)
    yield led
    led.dispose()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An isolated TRACKWAY_HOME and working directory."""
    home = tmp_path / "home"
    monkeypatch.setenv("TRACKWAY_HOME", str(home))
    monkeypatch.delenv("TRACKWAY_DB", raising=False)
    # Tests drive `trackway supervise` themselves; a background one would race them for the same attempts.
    monkeypatch.setenv("TRACKWAY_BACKGROUND_SUPERVISOR", "0")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return home


# -- the real `trackway` CLI ----------------------------------------------------------------------


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self):
        return json.loads(self.out)


def _in_process(capsys):
    def invoke(*args: str) -> Result:
        capsys.readouterr()
        code = run_app(app, list(args))
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return invoke


@pytest.fixture
def cli(home: Path, capsys, ledger_url: str, monkeypatch):
    """`cli("runs", "--json")` runs trackway in this process against a fresh ledger on each backend."""
    monkeypatch.setenv("TRACKWAY_DB", ledger_url)
    return _in_process(capsys)


@pytest.fixture
def cli_sqlite(home: Path, capsys, sqlite_url: str, monkeypatch):
    """`cli` on SQLite only: for end-to-end tests whose PostgreSQL path another test already covers."""
    monkeypatch.setenv("TRACKWAY_DB", sqlite_url)
    return _in_process(capsys)


@pytest.fixture
def cli_process(home: Path):
    """`cli_process(...)` runs `python -m trackway ...` as a user would, in the test's working directory."""

    def invoke(*args: str, timeout: float = 120) -> Result:
        done = subprocess.run(
            [sys.executable, "-m", "trackway", *args],
            capture_output=True, text=True, timeout=timeout, env=dict(os.environ), cwd=os.getcwd(),
        )
        return Result(done.returncode, done.stdout, done.stderr)

    return invoke


ENSURE_SLURM = Path(__file__).resolve().parents[1] / "scripts" / "ensure-slurm.sh"


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    """A single-node Slurm up on this machine (scripts/ensure-slurm.sh), or the test fails saying why."""
    if os.environ.get("TRACKWAY_SKIP_SLURM") == "1":
        pytest.skip("TRACKWAY_SKIP_SLURM=1: the Slurm executor's tests were asked not to run")
    try:
        done = subprocess.run(["bash", str(ENSURE_SLURM)], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{ENSURE_SLURM} did not bring Slurm up within 300 s", pytrace=False)
    if done.returncode != 0:
        lines = (done.stderr.strip() or done.stdout.strip() or f"exit code {done.returncode}").splitlines()
        pytest.fail(f"Slurm is not up: {lines[-1]}", pytrace=False)


@pytest.fixture
def slurm_node(slurm_cluster, tmp_path_factory) -> Iterator[None]:
    """The single node to this test alone: tests in other workers that submit jobs wait their turn.

    The node has two GPUs and preemption is by partition: a job of one test would queue behind,
    or be preempted by, another test's job, and either would read as the other's failure.
    """
    import fcntl

    lock = Path(tempfile.gettempdir()) / "trackway-tests-slurm-node.lock"
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


# Real SSH hosts (sshd on loopback and in network namespaces), for every test that asks for one.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from pg_pool import DatabasePool  # noqa: E402
from ssh_hosts import loopback_host, netns_hosts, ssh_key  # noqa: E402,F401


@pytest.fixture(autouse=True)
def _ssh_sessions_end_with_their_test() -> Iterator[None]:
    """An SSH executor's long-lived agent sessions (executors/ssh_session.py) end with the test that opened them."""
    yield
    sessions = sys.modules.get("trackway.executors.ssh_session")
    if sessions is not None:
        sessions.close_all()


# Nothing the suite started outlives it (tests/leftovers.py).
from leftovers import pytest_sessionfinish, pytest_testnodedown  # noqa: E402,F401

# The slowest test files first, so that no long file is handed to a worker last, and their seconds measured
# when asked (tests/slowest_first.py).
from slowest_first import pytest_collection_modifyitems, pytest_runtest_logreport  # noqa: E402,F401

# Bytecode for the workers, written before they start (tests/worker_bytecode.py).
from worker_bytecode import compile_for_workers  # noqa: E402


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        compile_for_workers(config)
    # The PostgreSQL variants of some end-to-end files are trials (tests/backend_trials.py).
    from backend_trials import BackendTrials

    config.pluginmanager.register(BackendTrials(config.rootpath), "trackway-backend-trials")
