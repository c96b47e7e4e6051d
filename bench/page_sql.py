"""A page's own SQL: the statements the store runs to answer one request, caught as the real
app answers it, and run again bare on psycopg connections (bench/dashboard.py's "bare" side).

The app is built in this process over the same database as the server's (`create_app` on
`runtime.connect`, as `corral api` builds it), and asked for the page through
httpx.ASGITransport, signed in as the server's clients are. While it answers, a `Recorder`
notes every statement the store sends: through SQLAlchemy (its engine's
`before_cursor_execute`: the text and parameters it hands psycopg, `%(name)s` placeholders
and a dict), and on the store's own psycopg connections (the hot path's and the job
reads', store/hotpool.py: the text and parameters given to `execute`). So what is replayed
is what psycopg was given, nothing rebuilt.

Each page is asked twice and the second answer's statements kept: a page as it is read
over and over, the session already checked (trusted for a few seconds, as on the server)
and what the process keeps already kept (the overview's drawing, its charts' old buckets).
Only reads are replayed (SELECT or WITH, writing nothing): the session's limits and resets
the store sends around them are not the page's work, and a page that writes says so in
`left_out`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import psycopg
from sqlalchemy import event

from corral import store

Statement = tuple[str, Any]
"""A statement's text and its parameters, as psycopg was given them."""

_WRITES = re.compile(r"\b(INSERT|UPDATE|DELETE|MERGE)\b", re.IGNORECASE)


def is_read(sql: str) -> bool:
    """Whether `sql` only reads (and so may be run again, any number of times)."""
    head = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else ""
    return head in ("SELECT", "WITH") and _WRITES.search(sql) is None


class _Noted:
    """A psycopg connection whose statements the recorder notes as they are sent."""

    def __init__(self, conn: Any, recorder: Recorder) -> None:
        self.conn = conn
        self.recorder = recorder

    async def execute(self, sql: str, params: Any = None, **kwargs: Any) -> Any:
        self.recorder.note(sql, params)
        return await self.conn.execute(sql, params, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


class Recorder:
    """Notes the statements `db` sends while it is on (`seen` a list), on every path."""

    def __init__(self, db: store.Store) -> None:
        self.seen: list[Statement] | None = None
        event.listen(db.database.engine, "before_cursor_execute", self._on_cursor)
        for pool in (db.database.read_pool, db.database.hot_pool):
            if pool is not None:
                self._wrap(pool)

    def note(self, sql: str, params: Any) -> None:
        if self.seen is not None:
            self.seen.append((sql, params))

    def _on_cursor(self, _conn: Any, _cursor: Any, sql: str, params: Any, *_: Any) -> None:
        self.note(sql, params)

    def _wrap(self, pool: Any) -> None:
        run = pool.run

        async def recorded(fn: Callable[[Any], Awaitable[Any]], **kwargs: Any) -> Any:
            return await run(lambda conn: fn(_Noted(conn, self)), **kwargs)

        pool.run = recorded


@dataclass
class Caught:
    """What one page's second answer was, and the statements it ran."""

    status: int
    statements: list[Statement] = field(default_factory=list)  # the reads, replayed
    left_out: dict[str, int] = field(default_factory=dict)  # the others, by first word
    answer_bytes: int = 0
    text: str = ""

    @property
    def texts(self) -> list[str]:
        return [sql for sql, _ in self.statements]


async def catch(recorder: Recorder, ask: Callable[[], Awaitable[httpx.Response]]) -> Caught:
    """Ask for a page twice (`ask`): the second answer and the statements it ran; a page
    not found (404) is asked once."""
    first = await ask()
    if first.status_code != 200:
        return Caught(first.status_code, answer_bytes=len(first.content), text=first.text)
    recorder.seen = []
    try:
        got = await ask()
    finally:
        seen, recorder.seen = recorder.seen, None
    kept = [(sql, params) for sql, params in seen if is_read(sql)]
    others = Counter(
        (sql.split(None, 1) or ["?"])[0].upper() for sql, _ in seen if not is_read(sql)
    )
    return Caught(got.status_code, kept, dict(others), len(got.content), got.text)


async def open_bare(dsn: str, count: int) -> list[psycopg.AsyncConnection[Any]]:
    """`count` plain psycopg connections in autocommit: each statement its own round trip
    and transaction, as the store's lookups run them."""
    return [await psycopg.AsyncConnection.connect(dsn, autocommit=True) for _ in range(count)]


async def run_bare(conn: psycopg.AsyncConnection[Any], statements: Sequence[Statement]) -> None:
    """Run a page's statements in order on `conn`, every row fetched."""
    for sql, params in statements:
        cur = await conn.execute(sql, params)
        if cur.description is not None:
            await cur.fetchall()


def shown(caught: Mapping[str, Caught]) -> dict[str, list[str]]:
    """Each page's statements' text, for the report's `sql` (--sql)."""
    return {name: c.texts for name, c in caught.items()}
