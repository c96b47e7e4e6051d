"""Migrations are history: a landed migration never changes, and a database migrated by
an earlier text of one is brought up to the schema all the same."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text

from corral.store import migrate, tables
from tests.conftest import pg_database

VERSIONS = migrate.MIGRATIONS / "versions"
LANDED = Path(__file__).with_name("migrations.sha256")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database with nothing in it, on each backend (never the session's shared one)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    with pg_database("corral_m") as url:
        yield url


def test_a_database_from_the_first_text_of_0003_is_repaired(empty_url: str) -> None:
    engine = create_engine(empty_url)
    with engine.begin() as conn:
        migrate.upgrade(conn, "0003")
        # What the first text of 0003 made: the checkpoints table only.
        conn.execute(text("DROP TABLE publish_pointers"))
        conn.execute(text("ALTER TABLE jobs DROP COLUMN code_version"))
    with engine.begin() as conn:
        migrate.upgrade(conn)
    with engine.connect() as conn:
        assert migrate.current(conn) == migrate.head()
        assert "publish_pointers" in inspect(conn).get_table_names()
        diff = compare_metadata(
            MigrationContext.configure(conn, opts={"compare_type": True}), tables.metadata
        )
    engine.dispose()
    assert diff == []


def test_upgrading_a_database_that_is_up_to_date_changes_nothing(empty_url: str) -> None:
    engine = create_engine(empty_url)
    with engine.begin() as conn:
        migrate.upgrade(conn)
    with engine.begin() as conn:
        migrate.upgrade(conn)
        assert migrate.current(conn) == migrate.head()
    engine.dispose()


def digests() -> dict[str, str]:
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(VERSIONS.glob("*.py"))
    }


def test_landed_migrations_never_change() -> None:
    """A migration that has landed is history: a database migrated by its first text would
    pass the schema check and then fail on what a later text added. Change the schema in a
    new migration instead. A new migration adds its line to tests/contract/migrations.sha256
    in the commit that adds it (`sha256sum src/corral/store/migrations/versions/NNNN_*.py`)."""
    landed = dict(
        reversed(line.split()) for line in LANDED.read_text().splitlines() if line.strip()
    )
    found = digests()
    changed = sorted(
        name for name, digest in landed.items() if found.get(Path(name).name) != digest
    )
    assert not changed, f"landed migrations changed or removed: {changed}; add a new one instead"
    new = sorted(set(found) - {Path(name).name for name in landed})
    assert not new, f"migrations without a recorded digest: {new}; record them in {LANDED.name}"
