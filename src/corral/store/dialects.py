"""The few places SQLite and PostgreSQL differ: engine set-up, row locks, insert-or-ignore."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Engine, Select, Table, create_engine, event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.elements import ClauseElement

SQLITE_BUSY_TIMEOUT_MS = 30_000


def engine_create(url: str) -> Engine:
    """An Engine for `url`; SQLite gets WAL, a busy timeout and write-locking transactions."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(parsed)
    return create_engine(parsed, pool_size=5, max_overflow=5, pool_pre_ping=True)


def _sqlite_engine(url: Any) -> Engine:
    engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy, not the driver, decide when transactions begin (see "begin").
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=FULL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # Take the write lock up front: a read lock upgraded later can fail with SQLITE_BUSY
        # when two processes write at once, whatever the busy timeout.
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def skip_locked(conn: Connection, stmt: Select[Any]) -> Select[Any]:
    """PostgreSQL: lock the picked rows and skip rows other claimers hold. SQLite has one
    writer at a time (BEGIN IMMEDIATE), so the same query needs no lock clause."""
    if conn.dialect.name == "postgresql":
        return stmt.with_for_update(skip_locked=True)
    return stmt


def insert_ignore_conflict(conn: Connection, table: Table, columns: Sequence[str]) -> Any:
    """INSERT ... ON CONFLICT (columns) DO NOTHING on either database."""
    dialect_insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
    return dialect_insert(table).on_conflict_do_nothing(index_elements=list(columns))


class Explain(Executable, ClauseElement):
    """EXPLAIN (PostgreSQL) or EXPLAIN QUERY PLAN (SQLite) of a statement, without running it."""

    inherit_cache = False

    def __init__(self, statement: Any) -> None:
        self.statement = statement


@compiles(Explain)
def _compile_explain(element: Explain, compiler: Any, **kw: Any) -> str:
    prefix = "EXPLAIN QUERY PLAN " if compiler.dialect.name == "sqlite" else "EXPLAIN "
    return prefix + str(compiler.process(element.statement, **kw))
