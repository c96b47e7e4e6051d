"""The store's connections and transactions: `Database` runs a function of a store module
in one transaction on a worker thread, so the event loop never blocks on the database; on
PostgreSQL the dispatcher's hot path and the API's job reads run on async connections of
their own (hotpool.py). It also holds what is the database's as a whole: its schema
(migrate, check_schema, installation, analyze) and PostgreSQL's LISTEN (`woken`).

Every call takes a `Callable[[Connection], T]`, a function of a store module with its
arguments bound (`functools.partial(jobs.job_get, job_id=job_id)`), so that each argument
is type-checked where the call is written; its name is the one errors and logs give.
Database errors are translated once, here, into StoreError (cause kept): StoreUnavailable
when a PostgreSQL server cannot be reached, and a message naming the setting when one of
the connection's time limits (dialects.ConnectionLimits) ended a call.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy import exc as sa_exc

from corral import errors
from corral.store import dialects, jobs, migrate, workers

if TYPE_CHECKING:
    import psycopg

    from corral.store import hotpool  # psycopg's async side: imported for PostgreSQL only

T = TypeVar("T")
log = logging.getLogger("corral.store")

OnPostgres = Callable[["psycopg.AsyncConnection[Any]"], Awaitable[T]]
"""A statement of hotpath.py or hotreads.py, its arguments bound: run on an async connection."""


READS_AT_ONCE = 10
"""The job reads' connections (hotreads.py) in use at most, as many as the engine's pool
holds (dialects.engine_create), and kept idle: a steady load opens none again."""

_SERVER_LIMITS = {
    "55P03": ("waited too long for a lock", "lock"),  # lock_not_available
    "57014": ("was cancelled", "statement"),  # query_canceled: statement_timeout
    "25P03": ("stayed idle too long inside its transaction", "idle_in_transaction"),
}
"""SQLSTATEs of the server's own time limits: what happened, and which limit did it."""


class _GivenUp(Exception):
    """The caller stopped waiting for this transaction: roll it back, nobody reads it."""


class _Broken(Exception):
    """The connection broke before the transaction committed: try once more."""

    def __init__(self, error: sa_exc.DBAPIError) -> None:
        super().__init__(str(error))
        self.error = error


class Database:
    """One database's connections, threads and pools, and the transactions run on them."""

    def __init__(self, engine: Engine, *, limits: dialects.ConnectionLimits | None = None) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        # PostgreSQL: the hot path's own connections; SQLite: its one writer thread's.
        self.hot_pool: hotpool.HotPool | None = None
        if self.dialect == "postgresql":
            from corral.store import hotpool

            self.hot_pool = hotpool.HotPool(dialects.hot_params(engine, limits))
        # PostgreSQL: the job list's and a job page's own connections (hotreads.py), as many
        # at once as the engine's pool holds.
        self.read_pool: hotpool.HotPool | None = None
        if self.dialect == "postgresql":
            self.read_pool = hotpool.HotPool(
                dialects.hot_params(engine, limits), idle=READS_AT_ONCE, most=READS_AT_ONCE
            )
        self.limits = limits
        # SQLite has one writer at a time: one thread keeps this process from queueing on
        # its own lock. PostgreSQL takes as many as the connection pool holds.
        workers = 1 if self.dialect == "sqlite" else 5
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="corral-store")
        # SQLite: reads that need no write lock (`_read`) have a thread of their own, so a
        # long one (the alerter's) never waits for the writer, nor holds it up.
        self._reader = self._pool
        if self.dialect == "sqlite":
            self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="corral-read")
        # The backstop around each call, on PostgreSQL only: a SQLite file has no network to
        # lose, its waits are bounded by its busy timeout, and with its one thread a call
        # given up would only make every call behind it fail too.
        self._backstop = (
            limits.transaction.total_seconds()
            if limits is not None and self.dialect == "postgresql"
            else None
        )

    @property
    def sqlite_path(self) -> Path | None:
        """The file of a SQLite store; None for PostgreSQL."""
        database = self.engine.url.database
        return Path(database) if self.dialect == "sqlite" and database else None

    @property
    def url(self) -> str:
        """The database's URL, its password hidden: what errors and messages show."""
        return self.engine.url.render_as_string(hide_password=True)

    async def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._reader.shutdown(wait=True)
        self.engine.dispose()
        if self.hot_pool is not None:
            await self.hot_pool.close()
        if self.read_pool is not None:
            await self.read_pool.close()

    def _run(
        self,
        name: str,
        fn: Callable[[Connection], T],
        given_up: threading.Event | None,
        autocommit: bool = False,
        read_only: bool = False,
    ) -> T:
        """Run `fn` in one transaction, or with `autocommit` outside one (`migrate`, whose
        migrations make their own), or `read_only` (on SQLite without the write lock). A
        connection found broken by `fn` (the pool does not ping) is replaced and `fn`
        tried once more: in a transaction nothing it did was committed, as the failure
        came before the commit."""
        for last in (False, True):
            try:
                conn = self.engine.connect()
            except sa_exc.DBAPIError as exc:
                raise self._translate(exc, name, connecting=True) from exc
            try:
                with conn:
                    if autocommit:
                        conn.execution_options(isolation_level="AUTOCOMMIT")
                        return self._body(conn, fn, given_up)
                    if read_only:  # an option of this Connection only, not of the pool's
                        conn.execution_options(**{dialects.READ_ONLY: True})
                    with conn.begin():
                        return self._body(conn, fn, given_up)
            except _Broken as broken:
                if last:
                    raise self._translate(broken.error, name, connecting=False) from broken.error
                log.info(
                    "%s: the connection was broken (%s); once more on a new one",
                    name,
                    _first_line(broken.error.orig or broken.error),
                )
            except sa_exc.DBAPIError as exc:
                raise self._translate(exc, name, connecting=False) from exc
        raise AssertionError("unreachable")

    @staticmethod
    def _body(
        conn: Connection, fn: Callable[[Connection], T], given_up: threading.Event | None
    ) -> T:
        if given_up is not None and given_up.is_set():
            raise _GivenUp  # connecting took so long that the caller left
        try:
            result = fn(conn)
        except sa_exc.DBAPIError as exc:
            if exc.connection_invalidated:
                raise _Broken(exc) from exc
            raise
        if given_up is not None and given_up.is_set():
            raise _GivenUp  # nobody reads the result: do not commit what it did
        return result

    def _translate(
        self, exc: sa_exc.DBAPIError, name: str, *, connecting: bool
    ) -> errors.StoreError:
        """One StoreError for a driver error: which, and how it reads, is decided here only."""
        return self._store_error(
            exc.orig or exc,
            name,
            unreachable=connecting or exc.connection_invalidated,
            operational=isinstance(exc, sa_exc.OperationalError),
        )

    def _store_error(
        self, error: BaseException, name: str, *, unreachable: bool, operational: bool
    ) -> errors.StoreError:
        said = _first_line(error)
        if self.dialect == "sqlite":  # a file: nothing to wait for, nothing to reach
            if operational:
                return errors.StoreError(f"database {self.url} failed: {said}")
            return errors.StoreError(f"database error: {said}")
        sqlstate = getattr(error, "sqlstate", None)
        if sqlstate in _SERVER_LIMITS and self.limits is not None:
            what, limit = _SERVER_LIMITS[sqlstate]
            return errors.StoreError(
                f"database {self.url}: {name} {what} ({self.limits.setting(limit)}): {said}"
            )
        if unreachable:
            return errors.StoreUnavailable(f"database {self.url} cannot be reached: {said}")
        if operational:
            return errors.StoreError(f"database {self.url} failed: {said}")
        return errors.StoreError(f"database error: {said}")

    async def tx(self, fn: Callable[[Connection], T]) -> T:
        """Run `fn(conn)` in one transaction on the store's worker thread; on PostgreSQL,
        give it up after timeouts.database_transaction_timeout (the backstop)."""
        return await self._call(_name(fn), fn, self._backstop)

    async def read(self, fn: Callable[[Connection], T]) -> T:
        """`tx` for a `fn` that only reads: on SQLite, on the reading thread, beside the
        writer (`fn` must write nothing)."""
        return await self._call(_name(fn), fn, self._backstop, read_only=True)

    async def lookup(self, fn: Callable[[Connection], T]) -> T:
        """`read` for a `fn` whose statements each stand alone (none needs another's
        snapshot): on PostgreSQL outside a transaction (autocommit), a round trip each where
        BEGIN and COMMIT made two more (what each API request paid, a job's page five times
        over)."""
        if self.dialect != "postgresql":
            return await self.read(fn)
        return await self._call(_name(fn), fn, self._backstop, autocommit=True)

    async def hot(self, on_sqlite: Callable[[Connection], T], on_postgresql: OnPostgres[T]) -> T:
        """A hot-path statement (hotpath.py): on SQLite `on_sqlite(conn)` as `tx` runs it; on
        PostgreSQL `on_postgresql(conn)`, one statement that is its own transaction, on the
        hot path's own connections, under the same backstop."""
        if self.hot_pool is None:
            return await self.tx(on_sqlite)
        return await self._pooled(self.hot_pool, on_postgresql)

    async def hot_read(
        self, on_sqlite: Callable[[Connection], T], on_postgresql: OnPostgres[T]
    ) -> T:
        """A read of hotreads.py: on SQLite `on_sqlite(conn)` as `lookup` runs it; on
        PostgreSQL `on_postgresql(conn)` on the reads' own connections, each statement its
        own transaction, under the same backstop."""
        if self.read_pool is None:
            return await self.lookup(on_sqlite)
        return await self._pooled(self.read_pool, on_postgresql)

    async def _pooled(self, pool: hotpool.HotPool, fn: OnPostgres[T]) -> T:
        """`fn(conn)` on a connection of `pool`, under the backstop, its errors translated
        as every other call's."""
        import psycopg

        from corral.store import hotpool

        name = _name(fn)
        try:
            return await pool.run(fn, within=self._backstop)
        except hotpool.GivenUp:
            raise self._given_up(name) from None  # its connection closed, its statement too
        except hotpool.Unreachable as lost:
            raise self._store_error(
                lost.error, name, unreachable=True, operational=True
            ) from lost.error
        except psycopg.Error as exc:
            operational = isinstance(exc, psycopg.OperationalError)
            raise self._store_error(exc, name, unreachable=False, operational=operational) from exc

    async def _call(
        self,
        name: str,
        call: Callable[[Connection], T],
        backstop: float | None,
        autocommit: bool = False,
        read_only: bool = False,
    ) -> T:
        loop = asyncio.get_running_loop()
        run = functools.partial(self._run, autocommit=autocommit, read_only=read_only)
        pool = self._reader if read_only else self._pool
        if backstop is None:
            return await loop.run_in_executor(pool, run, name, call, None)
        given_up = threading.Event()
        timer = asyncio.timeout(backstop)  # real time, as the network's and libpq's limits are
        try:
            async with timer:
                return await loop.run_in_executor(pool, run, name, call, given_up)
        except TimeoutError:
            if not timer.expired():
                raise
        # A call still queued for a thread is dropped. One already running cannot be stopped
        # from here: its thread stays blocked in libpq until the connection's own limits end
        # the wait (connect_timeout, tcp_user_timeout and keepalives, statement_timeout; all
        # shorter than this backstop by the chain), then finds `given_up` set and rolls back,
        # or finds its connection dead, which the pool then discards. Without those limits
        # a cut connection would hold its thread for good, and once all the store's threads
        # were held, every later call would time out here, queued.
        given_up.set()
        raise self._given_up(name)

    def _given_up(self, name: str) -> errors.StoreUnavailable:
        """The error of a call the backstop gave up, logged once."""
        assert self.limits is not None
        limit = self.limits.setting("transaction")
        log.warning("%s: no answer from the database in time (%s); given up", name, limit)
        return errors.StoreUnavailable(
            f"database {self.url}: {name} got no answer in time ({limit}); given up"
        )

    # --- schema --------------------------------------------------------------------------

    async def migrate(self) -> tuple[str | None, str | None]:
        """Upgrade the schema to the newest revision; returns (before, after). On PostgreSQL
        each migration is a transaction of its own, so that indexes on large tables can be
        built concurrently (migrate.upgrade); run it with corral's loops stopped."""

        def upgrade(conn: Connection) -> tuple[str | None, str | None]:
            before = migrate.current(conn)
            migrate.upgrade(conn)
            return before, migrate.current(conn)

        def upgrade_pg(conn: Connection) -> tuple[str | None, str | None]:
            # Handed over in autocommit: the session's limits are lifted for good (a
            # migration takes its time); then, outside any transaction, the migrations
            # make their own.
            dialects.statements_unbounded(conn, local=False)
            before = migrate.current(conn)
            conn.commit()
            conn.execution_options(isolation_level="READ COMMITTED")
            try:
                migrate.upgrade(conn)
                return before, migrate.current(conn)
            finally:
                conn.rollback()  # what a failed migration left open, or the last read
                dialects.statements_bounded(conn)
                conn.commit()

        if self.dialect == "postgresql":
            return await self._call("migrate", upgrade_pg, None, autocommit=True)
        if (path := self.sqlite_path) is not None and not path.exists():
            _create_private(path)
        return await self._call("migrate", upgrade, None)

    async def check_schema(self, *, revision: bool = True) -> None:
        """Raise SchemaOutOfDate unless the database is at this corral's newest revision
        (without `revision`: unless it exists). A SQLite file that does not exist is not
        created (only `migrate` creates one), so a command that only reads leaves no empty
        database behind."""
        if (path := self.sqlite_path) is not None and not path.exists():
            raise errors.SchemaOutOfDate(
                f"there is no database at {path} (database_url {self.url}): run"
                " `corral db upgrade` to create it, or point database_url at yours"
            )
        if not revision:
            return
        current = await self.tx(migrate.current)
        if current is not None and not migrate.known(current):
            raise errors.SchemaOutOfDate(
                f"database {self.url} is at schema revision {current}, which this corral does not"
                " know: a newer corral upgraded it; run that version"
            )
        if current != migrate.head():
            raise errors.SchemaOutOfDate(
                f"database {self.url} is at schema revision {current or 'none'}, this corral needs"
                f" {migrate.head()}: run `corral db upgrade`"
            )

    async def installation(self) -> str:
        """The id that sets this installation's objects on a cluster apart from another's
        (the label corral.dev/installation): made once, by the database's migration."""
        return await self.read(migrate.installation)

    async def analyze(self) -> None:
        """Refresh the planner's statistics of the jobs table."""

        def analyze(conn: Connection) -> None:
            dialects.statements_unbounded(conn)  # statistics of a large table take a while
            jobs.analyze(conn)

        await self._call("analyze", analyze, None)

    @contextlib.asynccontextmanager
    async def woken(self, channel: str = workers.CHANNEL) -> AsyncIterator[asyncio.Event]:
        """An Event set each time `channel` is notified (PostgreSQL's LISTEN, on a
        connection of its own for the block); the holder clears it when it has looked. On
        SQLite it is never set: its holder polls. A lost connection is made again; the
        Event is set then too, since a notification may have been missed meanwhile."""
        woke = asyncio.Event()
        if self.hot_pool is None:
            yield woke
            return
        task = asyncio.create_task(self._listen(channel, woke))
        try:
            yield woke
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _listen(self, channel: str, woke: asyncio.Event) -> None:
        import psycopg

        assert self.hot_pool is not None
        pause = 0.5
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    **self.hot_pool.params, autocommit=True
                )
                async with conn:
                    await conn.execute(f"LISTEN {channel}")
                    woke.set()
                    pause = 0.5
                    async for _ in conn.notifies():
                        woke.set()
            except (psycopg.Error, OSError) as exc:
                log.info("listening on %s: %s; again in %.1fs", channel, _first_line(exc), pause)
            except Exception:  # never silently: the holder would poll alone from here on
                log.exception("listening on %s failed; again in %.1fs", channel, pause)
            await asyncio.sleep(pause)  # a real pause before reconnecting, not a clock read
            pause = min(pause * 2, 10.0)


def _name(fn: Callable[..., Any]) -> str:
    """The name of the store function `fn` runs: what errors and logs call the call."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", type(fn).__name__)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _create_private(path: Path) -> None:
    """Make the SQLite file `path`, empty, readable by its owner alone (0600): it holds
    every tenant's payloads and secrets. SQLite gives its -wal and -shm files the same
    mode. One that exists already keeps its mode (`corral check` warns of a readable one)."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
