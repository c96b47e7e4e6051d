"""The driver's own cursor under a SQLAlchemy connection: SQLite's hot statements run on
it, executemany over plain tuples, without SQLAlchemy's execution context per statement."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection


def of(conn: Connection) -> Any:
    """A new sqlite3 cursor on `conn`'s connection, inside its transaction."""
    return conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
