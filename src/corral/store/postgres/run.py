"""How PostgreSQL's hot statements run: one statement on an async psycopg connection, its
rows read as the driver's tuples."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg


async def rows(
    conn: psycopg.AsyncConnection[Any], sql: str, params: dict[str, Any]
) -> list[tuple[Any, ...]]:
    """Run one statement (psycopg prepares it once it repeats) and read its rows as the
    driver's tuples, as they are: no per-row dictionaries, no result processing."""
    cursor = await conn.execute(sql, params)
    return await cursor.fetchall()
