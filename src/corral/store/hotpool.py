"""The hot path's own PostgreSQL connections: psycopg's async connections, on the event loop.

The dispatcher's claim and settle (postgres/claim.py, postgres/settle.py) are one statement
each, in autocommit, and run here rather than on the store's worker threads: no thread hop,
no wait for the GIL while the loop launches, no SQLAlchemy execution context around a
statement that needs none. A tick's claim and the one made ahead of it each take a
connection; an idle one is kept for the next call.

A connection is not pinged when it is taken: one that broke while idle fails its first
statement, and the call is tried once more on a new connection. The idle ones are dropped
with it, as whatever broke one (a server restart, a failover) broke them all. A statement
in autocommit may have committed before its answer was lost, so only statements that may
run twice run here: a settle (compare-and-set), or a claim (what the lost answer claimed
stays `launching`, and recovery launches it after launch_grace; a worker's claim records
its attempts running, and what no worker heard of is recovered once their leases lapse).

A call that runs out of time, or is cancelled, closes its connection's socket at once:
its statement ends with the connection (the server rolls back whatever had not committed),
and nothing waits for the server to acknowledge a cancel request. A connection belongs to
the event loop that opened it; taken on another loop, the idle ones are dropped first.

The API's reads of jobs (hotreads.py) have a pool of their own, of the same connections:
more are kept idle there (a request each), and as many calls run at once as the store's
connection pool would hold, the others waiting their turn, however many requests come.
"""

from __future__ import annotations

import asyncio
import contextlib
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


class GivenUp(Exception):
    """The call ran out of its time; its connection was closed."""


class HotPool:
    """Async PostgreSQL connections in autocommit, opened with `params` (libpq's)."""

    def __init__(
        self, params: Mapping[str, Any], *, idle: int = IDLE, most: int | None = None
    ) -> None:
        """`idle`: the idle connections kept; `most`: the calls that run at once (None:
        no limit), the others waiting their turn."""
        self.params = dict(params)
        self._idle: list[psycopg.AsyncConnection[Any]] = []
        self._keep = idle
        self._most = most
        self._turns: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    async def run(
        self,
        fn: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]],
        *,
        within: float | None = None,
    ) -> T:
        """`fn` on a connection; once more on a new one if the connection was broken; all
        in `within` seconds (not an asyncio timeout: see `_within`). Raises GivenUp,
        Unreachable, or the driver's error."""
        loop = asyncio.get_running_loop()
        deadline = None if within is None else loop.time() + within
        if self._most is None:
            return await self._run(fn, deadline)
        turns = self._turns_of(loop)
        if not turns.locked():
            await turns.acquire()  # a turn is free: taken at once
        else:
            try:
                async with asyncio.timeout_at(deadline):  # a wait for a turn: no connection
                    await turns.acquire()
            except TimeoutError:
                raise GivenUp from None
        try:
            return await self._run(fn, deadline)
        finally:
            turns.release()

    async def _run(
        self,
        fn: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]],
        deadline: float | None,
    ) -> T:
        for last in (False, True):
            conn = self._take_idle()
            if conn is None:
                conn = await self._within(self._connect(), None, deadline)
            try:
                result = await self._within(fn(conn), conn, deadline)
            except psycopg.OperationalError as exc:
                if not conn.broken:
                    self._give_back(conn)
                    raise
                self._drop(conn)
                self._drop_idle()
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
                self._drop(conn)  # given up, cancelled, or worse: its state is unknown
                raise
            self._give_back(conn)
            return result
        raise AssertionError("unreachable")

    async def close(self) -> None:
        """Close the idle connections; a call after this raises RuntimeError."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            if self._loop is asyncio.get_running_loop():
                await conn.close()
            else:
                self._drop(conn)

    async def _within(
        self,
        step: Awaitable[T],
        conn: psycopg.AsyncConnection[Any] | None,
        deadline: float | None,
    ) -> T:
        """`step`, given up at `deadline`. A step on `conn` that is given up or cancelled
        closes its socket first: psycopg would otherwise, on cancellation, send the server
        a cancel request and wait for the statement to end, seconds past the deadline."""
        task = asyncio.ensure_future(step)
        loop = asyncio.get_running_loop()
        left = None if deadline is None else max(deadline - loop.time(), 0.0)
        try:
            done, _ = await asyncio.wait({task}, timeout=left)
        except asyncio.CancelledError:
            await self._abandon(task, conn)
            raise
        if not done:
            await self._abandon(task, conn)
            raise GivenUp
        return task.result()

    async def _abandon(
        self, task: asyncio.Future[Any], conn: psycopg.AsyncConnection[Any] | None
    ) -> None:
        if conn is not None:
            self._drop(conn)  # the socket goes: the statement's wait ends at once
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        if conn is None and task.done() and not task.cancelled() and task.exception() is None:
            self._give_back(task.result())  # a connection opened just as time ran out

    def _turns_of(self, loop: asyncio.AbstractEventLoop) -> asyncio.Semaphore:
        """The turns of `loop`'s calls: a semaphore belongs to one event loop too."""
        assert self._most is not None
        if self._turns is None or self._loop is not loop:
            self._turns = asyncio.Semaphore(self._most)
        return self._turns

    def _take_idle(self) -> psycopg.AsyncConnection[Any] | None:
        """An idle connection of this event loop's, if there is one (no task, no await)."""
        if self._closed:
            raise RuntimeError("the store is closed")
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._drop_idle()  # opened on another loop: not usable on this one
            self._loop = loop
        return self._idle.pop() if self._idle else None

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        try:
            return await psycopg.AsyncConnection.connect(**self.params, autocommit=True)
        except psycopg.Error as exc:
            raise Unreachable(exc) from exc

    def _give_back(self, conn: psycopg.AsyncConnection[Any]) -> None:
        if conn.closed or self._closed or len(self._idle) >= self._keep:
            self._drop(conn)
        else:
            self._idle.append(conn)

    def _drop_idle(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            self._drop(conn)

    @staticmethod
    def _drop(conn: psycopg.AsyncConnection[Any]) -> None:
        conn.pgconn.finish()  # synchronous: closes the socket, whatever its state
