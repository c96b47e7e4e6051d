"""Shared fixtures: a store on a real SQLite file and on the real PostgreSQL server.

PostgreSQL tests use a database created for this test session (dropped at the end) and
an emptied schema per test. They skip when the server is unreachable locally, and fail
when the CI variable is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from corral import store
from corral.store import tables
from corral.testing import FrozenClock


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test has a node id of its own: pytest-xdist hands tests to its workers by id,
    and of several that share one it runs only the first, silently."""
    seen: set[str] = set()
    twice = sorted({i.nodeid for i in items if i.nodeid in seen or seen.add(i.nodeid)})
    if twice:
        raise pytest.UsageError(
            "these node ids name more than one test (give each its own id): " + ", ".join(twice)
        )


PG_ENV = "CORRAL_TEST_POSTGRES_URL"
DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def _pg_admin_url() -> str | None:
    url = os.environ.get(PG_ENV) or DEFAULT_PG
    try:
        engine = create_engine(url, connect_args={"connect_timeout": 3})
        with engine.connect() as conn:
            conn.execute(text("select 1"))
        engine.dispose()
    except Exception as exc:
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL at {url} is unreachable on CI: {exc}")
        return None
    return url


@contextlib.contextmanager
def pg_database(prefix: str) -> Iterator[str]:
    """A PostgreSQL database of its own for as long as the block runs (dropped after).
    Skips when the server is unreachable locally, fails on CI."""
    admin = _pg_admin_url()
    if admin is None:
        pytest.skip(f"PostgreSQL unreachable (set {PG_ENV}); skipped locally, fails on CI")
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    engine = create_engine(admin, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(admin).set(database=name).render_as_string(hide_password=False)
    finally:
        with engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        engine.dispose()


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL database for this session, migrated to head."""
    with pg_database("corral_t") as url:
        db = store.Store.connect(url)
        asyncio.run(db.database.migrate())
        asyncio.run(db.close())
        yield url


def pg_empty(url: str) -> None:
    engine = create_engine(url)
    names = ", ".join(t.name for t in reversed(tables.metadata.sorted_tables))
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))
    engine.dispose()


@pytest.fixture(scope="session")
def pg_user_url() -> Iterator[str]:
    """A second PostgreSQL database for this session: "the user's own database", where
    the sink tests make their tables, apart from corral's."""
    with pg_database("corral_u") as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def user_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database of "the user's" on each backend (not corral's store)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'user.db'}"
    url: str = request.getfixturevalue("pg_user_url")
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    engine.dispose()
    return url


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated to head once a session: a test's own database is a copy of it
    (a copy takes a millisecond, a migration a fifth of a second)."""
    path = tmp_path_factory.mktemp("template") / "corral.db"
    db = store.Store.connect(f"sqlite:///{path}")
    asyncio.run(db.database.migrate())
    asyncio.run(db.close())
    assert not path.with_name("corral.db-wal").exists(), "the template must be whole in one file"
    return path


def sqlite_copy(template: Path, folder: Path, name: str = "corral.db") -> str:
    """The URL of a migrated, empty SQLite database of its own in `folder`."""
    shutil.copyfile(template, folder / name)
    return f"sqlite:///{folder / name}"


@pytest.fixture
def sqlite_url(sqlite_template: Path, tmp_path: Path) -> str:
    """A migrated, empty SQLite database of this test's own (corral.db in tmp_path)."""
    return sqlite_copy(sqlite_template, tmp_path)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated, empty database URL on each backend."""
    if request.param == "sqlite":
        return sqlite_copy(request.getfixturevalue("sqlite_template"), tmp_path)
    url: str = request.getfixturevalue("pg_url")
    pg_empty(url)
    return url


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[store.Store]:
    s = store.Store.connect(db_url)
    yield s
    await s.close()


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock()
