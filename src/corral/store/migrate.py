"""Schema migrations with Alembic, driven from code (no alembic.ini to find).

Alembic is imported only to upgrade. Which revision a database is at, and which ones this
corral knows, are read without it (the version table; the `revision` lines of the
migration files), so that every command's schema check costs one small query.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, inspect, text

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).parent / "migrations"
VERSION_TABLE = "alembic_version"

_REVISION = re.compile(r'^revision(?:: *str)? *= *"([^"]+)"', re.MULTILINE)
_DOWN = re.compile(r'^down_revision(?:: *[^=]+)? *= *(?:"([^"]+)"|None)', re.MULTILINE)


def alembic_config(conn: Connection | None = None) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = conn
    return cfg


def upgrade(conn: Connection, revision: str = "head") -> None:
    """Bring the schema up to `revision`: inside the caller's transaction when `conn` is in
    one; else (PostgreSQL) each migration in a transaction of its own, and a migration may
    build indexes concurrently between them."""
    from alembic import command

    cfg = alembic_config(conn)
    cfg.attributes["concurrent_ddl"] = (
        conn.dialect.name == "postgresql" and not conn.in_transaction()
    )
    command.upgrade(cfg, revision)


def current(conn: Connection) -> str | None:
    """The revision the database is at; None for one never migrated."""
    if not inspect(conn).has_table(VERSION_TABLE):
        return None
    return conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()


def installation(conn: Connection) -> str:
    """The installation's id, made by the migration that made its table (0021)."""
    found = conn.execute(text("SELECT id FROM installation ORDER BY id LIMIT 1")).scalar()
    if found is None:
        raise LookupError("the installation table is empty: run `corral db upgrade`")
    return str(found)


@functools.cache
def _chain() -> dict[str, str | None]:
    """Each revision of the migration files, with the one it follows."""
    chain: dict[str, str | None] = {}
    for path in sorted((MIGRATIONS / "versions").glob("*.py")):
        source = path.read_text(encoding="utf-8")
        revision, down = _REVISION.search(source), _DOWN.search(source)
        if revision is None or down is None:
            raise RuntimeError(f"migration {path.name}: no revision or down_revision line")
        chain[revision.group(1)] = down.group(1)
    return chain


def head() -> str | None:
    """The newest revision: the one no other follows."""
    chain = _chain()
    heads = set(chain) - {down for down in chain.values() if down is not None}
    if len(heads) > 1:
        raise RuntimeError(f"migrations have more than one head: {sorted(heads)}")
    return next(iter(heads), None)


def known(revision: str) -> bool:
    """Whether `revision` is one of this corral's migrations."""
    return revision in _chain()
