"""Shared fixtures: a real ledger on each backend (SQLite file, PostgreSQL database), an isolated home."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from trackway.ledger import Ledger, open_ledger

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


@pytest.fixture
def pg_url(pg_template: str) -> Iterator[str]:
    """A fresh, migrated PostgreSQL database for one test."""
    name = f"trackway_t_{uuid.uuid4().hex[:10]}"
    admin = _pg_admin()
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"'))
    yield make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"


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
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return home
