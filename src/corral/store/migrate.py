"""Schema migrations with Alembic, driven from code (no alembic.ini to find)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection

MIGRATIONS = Path(__file__).parent / "migrations"


def alembic_config(conn: Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = conn
    return cfg


def upgrade(conn: Connection, revision: str = "head") -> None:
    """Bring the schema up to `revision`: inside the caller's transaction when `conn` is in
    one; else (PostgreSQL) each migration in a transaction of its own, and a migration may
    build indexes concurrently between them."""
    cfg = alembic_config(conn)
    cfg.attributes["concurrent_ddl"] = (
        conn.dialect.name == "postgresql" and not conn.in_transaction()
    )
    command.upgrade(cfg, revision)


def current(conn: Connection) -> str | None:
    return MigrationContext.configure(conn).get_current_revision()


def head() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def known(revision: str) -> bool:
    """Whether `revision` is one of this corral's migrations."""
    script = ScriptDirectory.from_config(alembic_config())
    return any(r.revision == revision for r in script.walk_revisions())
