"""The hot path's own PostgreSQL connections: psycopg's async connections, on the event loop.

The dispatcher's claim and settle (hotpath.py) are one statement each, in autocommit, and
run here rather than on the store's worker threads: no thread hop, no wait for the GIL
while the loop launches, no SQLAlchemy execution context around a statement that needs
none. A tick's claim and the one made ahead of it each take a connection; an idle one is
kept for the next call.

A connection is not pinged when it is taken: one that broke while idle fails its first
statement, is dropped, and the call is tried once more on a fresh connection. A call that
was cancelled (the store's backstop, a stopping loop) drops its connection too, as its
state is unknown. A connection belongs to the event loop that opened it; taken on another
loop, the idle ones are dropped first.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import psycopg

T = TypeVar("T")
log = logging.getLogger("corral.store")

IDLE = 4
"""Idle connections kept: a claim, the one made ahead, a settle and a completion write."""


class Unreachable(Exception):
    """A connection could not be opened, or broke on the second try too."""

    def __init__(self, error: psycopg.Error) -> None:
        super().__init__(str(error))
        self.error = error


class HotPool:
    """Async PostgreSQL connections in autocommit, opened with `params` (libpq's)."""

    def __init__(self, params: Mapping[str, Any]) -> None:
        self.params = dict(params)
        self._idle: list[psycopg.AsyncConnection[Any]] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    async def run(self, fn: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]]) -> T:
        """`fn` on a connection; once more on a fresh one if the connection was broken.
        Raises Unreachable, or the driver's error."""
        for last in (False, True):
            conn = await self._take()
            try:
                result = await fn(conn)
            except psycopg.OperationalError as exc:
                if not conn.broken:
                    self._give_back(conn)
                    raise
                self._drop(conn)
                if last:
                    raise Unreachable(exc) from exc
                log.info(
                    "the connection was broken (%s); once more on a new one",
                    str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                )
                continue
            except psycopg.Error:
                self._give_back(conn)  # a statement that failed: the connection is idle
                raise
            except BaseException:
                self._drop(conn)  # cancelled, or worse, in the middle of a statement
                raise
            self._give_back(conn)
            return result
        raise AssertionError("unreachable")

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            if self._loop is asyncio.get_running_loop():
                await conn.close()
            else:
                conn.pgconn.finish()

    async def _take(self) -> psycopg.AsyncConnection[Any]:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            for conn in self._idle:
                conn.pgconn.finish()  # opened on another loop: not usable on this one
            self._idle, self._loop = [], loop
        if self._idle:
            return self._idle.pop()
        try:
            return await psycopg.AsyncConnection.connect(**self.params, autocommit=True)
        except psycopg.Error as exc:
            raise Unreachable(exc) from exc

    def _give_back(self, conn: psycopg.AsyncConnection[Any]) -> None:
        if conn.closed or len(self._idle) >= IDLE:
            self._drop(conn)
        else:
            self._idle.append(conn)

    @staticmethod
    def _drop(conn: psycopg.AsyncConnection[Any]) -> None:
        conn.pgconn.finish()  # synchronous: closes the socket, whatever its state
