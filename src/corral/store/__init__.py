"""The durable store: jobs, attempts and events in SQLite (embedded) or PostgreSQL (scale).

`Store` is the async face of the store: each method runs one function of the module for
what it stores (jobs, claims, attempts, completions, events, budgets, sinks) in one
transaction on a worker thread, so the event loop never blocks on the database; on
PostgreSQL the dispatcher's hot path runs on async connections of its own (hotpool.py).
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
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Iterable,
    Mapping,
    Sequence,
)
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy import exc as sa_exc

from corral import (
    access,
    errors,
    failpoints,
    launching,
    model,
    planning,
    python_tasks,
    retry,
    scheduling,
)
from corral.store import (
    alerts,
    attempts,
    budgets,
    claims,
    completions,
    dialects,
    events,
    hotpath,
    hotreads,
    jobs,
    loops,
    migrate,
    operations,
    overview,
    runlogs,
    schedules,
    secrets,
    sinks,
    tokens,
    users,
    workers,
)
from corral.store.attempts import Status
from corral.store.claims import DefaultLimits
from corral.store.completions import Finish, Outcome
from corral.timeouts import Timeouts

if TYPE_CHECKING:
    from corral.store import hotpool  # psycopg's async side: imported for PostgreSQL only

__all__ = ["DefaultLimits", "Finish", "Outcome", "Status", "Store"]

T = TypeVar("T")
A, J = model.AttemptState, model.JobState
log = logging.getLogger("corral.store")

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


class Store:
    """Jobs, attempts and events, behind compare-and-set transitions."""

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
        self.loops = loops.Loops(self)
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

    @classmethod
    def connect(cls, url: str, *, timeouts: Timeouts | None = None) -> Store:
        """A Store for `url` (no connection is made until the first call), with the time
        limits of `timeouts` (default: the default settings') on its PostgreSQL connections."""
        limits = dialects.ConnectionLimits.of(timeouts or Timeouts())
        try:
            return cls(dialects.engine_create(url, limits), limits=limits)
        except (sa_exc.ArgumentError, ImportError, ValueError) as exc:
            raise errors.ConfigError(f"database_url: {url!r} is not usable: {exc}") from exc

    @property
    def sqlite_path(self) -> Path | None:
        """The file of a SQLite store; None for PostgreSQL."""
        database = self.engine.url.database
        return Path(database) if self.dialect == "sqlite" and database else None

    @property
    def url(self) -> str:
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

    async def _tx(self, fn: Callable[..., T], /, **kwargs: Any) -> T:
        """Run `fn(conn, **kwargs)` in one transaction on the store's worker thread; on
        PostgreSQL, give it up after timeouts.database_transaction_timeout (the backstop)."""
        return await self._call(_name(fn), functools.partial(fn, **kwargs), self._backstop)

    async def _read(self, fn: Callable[..., T], /, **kwargs: Any) -> T:
        """`_tx` for a `fn` that only reads: on SQLite, on the reading thread, beside the
        writer (`fn` must write nothing)."""
        call = functools.partial(fn, **kwargs)
        return await self._call(_name(fn), call, self._backstop, read_only=True)

    async def _lookup(self, fn: Callable[..., T], /, **kwargs: Any) -> T:
        """`_read` for a `fn` whose statements each stand alone (none needs another's
        snapshot): on PostgreSQL outside a transaction (autocommit), a round trip each where
        BEGIN and COMMIT made two more (what each API request paid, a job's page five times
        over)."""
        if self.dialect != "postgresql":
            return await self._read(fn, **kwargs)
        call = functools.partial(fn, **kwargs)
        return await self._call(_name(fn), call, self._backstop, autocommit=True)

    async def _hot(
        self,
        on_sqlite: Callable[..., T],
        on_postgresql: Callable[..., Awaitable[T]],
        /,
        **kwargs: Any,
    ) -> T:
        """A hot-path function (hotpath.py): on SQLite `on_sqlite(conn, **kwargs)` as `_tx`
        runs it; on PostgreSQL `on_postgresql(conn, **kwargs)`, one statement that is its
        own transaction, on the hot path's own connections, under the same backstop."""
        if self.hot_pool is None:
            return await self._tx(on_sqlite, **kwargs)
        return await self._pooled(self.hot_pool, on_postgresql, **kwargs)

    async def _hot_read(
        self,
        on_sqlite: Callable[..., T],
        on_postgresql: Callable[..., Awaitable[T]],
        /,
        **kwargs: Any,
    ) -> T:
        """A read of hotreads.py: on SQLite `on_sqlite(conn, **kwargs)` as `_lookup` runs
        it; on PostgreSQL `on_postgresql(conn, **kwargs)` on the reads' own connections,
        each statement its own transaction, under the same backstop."""
        if self.read_pool is None:
            return await self._lookup(on_sqlite, **kwargs)
        return await self._pooled(self.read_pool, on_postgresql, **kwargs)

    async def _pooled(
        self, pool: hotpool.HotPool, fn: Callable[..., Awaitable[T]], /, **kwargs: Any
    ) -> T:
        """`fn(conn, **kwargs)` on a connection of `pool`, under the backstop, its errors
        translated as every other call's."""
        import psycopg

        from corral.store import hotpool

        name = _name(fn)
        call = functools.partial(fn, **kwargs)
        try:
            return await pool.run(call, within=self._backstop)
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
        current = await self._tx(migrate.current)
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
        return await self._read(migrate.installation)

    # --- operations: one transaction each (the modules say what each does) -----------------

    async def transition(
        self,
        *,
        entity: model.Entity,
        ids: Sequence[int],
        expected: str,
        to: str,
        now: datetime,
        reason: str,
        values: Mapping[str, Any] | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """events.transition in its own transaction; returns the ids that changed."""
        applied = await self._tx(
            events.transition,
            entity=entity,
            ids=ids,
            expected=expected,
            to=to,
            now=now,
            reason=reason,
            values=values,
            details=details,
        )
        return [a.id for a in applied]

    async def event_note(
        self,
        *,
        job_id: int,
        attempt_id: int | None,
        state: str,
        reason: str,
        now: datetime,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        await self._tx(
            events.event_note,
            job_id=job_id,
            attempt_id=attempt_id,
            state=state,
            reason=reason,
            now=now,
            details=details,
        )

    async def event_list(self, *, job_id: int) -> list[model.Event]:
        return await self._lookup(events.event_list, job_id=job_id)

    async def analyze(self) -> None:
        def analyze(conn: Connection) -> None:
            dialects.statements_unbounded(conn)  # statistics of a large table take a while
            jobs.analyze(conn)

        await self._call("analyze", analyze, None)

    async def job_submit(
        self,
        *,
        new: Sequence[model.NewJob],
        now: datetime,
        audit: Callable[[list[tuple[int, bool]]], Iterable[Mapping[str, Any]]] | None = None,
        since: datetime | None = None,
    ) -> list[tuple[int, bool]]:
        """Store jobs (jobs.job_submit); with `audit`, the audit rows it makes of what was
        stored are written in the same transaction. Python tasks' jobs that no worker live
        `since` then reads are parked at once (a job left queued by a crash in between is
        parked by the reconciler's pass)."""
        if audit is None:
            made = await self._tx(jobs.job_submit, new=new, now=now)
        else:
            made = await self._tx(tokens.job_submit_audited, new=new, now=now, audit=audit)
        tasks = [
            job_id
            for (job_id, created), job in zip(made, new, strict=True)
            if created and job.executor == python_tasks.PYTHON
        ]
        if tasks and since is not None:
            await self._tx(workers.jobs_park_unread, now=now, since=since, job_ids=tasks)
        return made

    async def job_claim(
        self,
        *,
        now: datetime,
        limit: int,
        executors: Sequence[str],
        limits: DefaultLimits | None = None,
        pools: Mapping[str, int] | None = None,
        tenants: Mapping[str, int] | None = None,
    ) -> list[model.Claimed]:
        if not pools and not tenants:  # the hot path (hotpath.py): one statement on PostgreSQL
            return await self._hot(
                hotpath.sqlite_claim,
                hotpath.pg_claim,
                now=now,
                limit=limit,
                executors=executors,
                deadline=None if limits is None else limits.attempt_deadline.total_seconds(),
                lease=None if limits is None else limits.lease_timeout.total_seconds(),
            )
        return await self._tx(
            claims.job_claim,
            now=now,
            limit=limit,
            executors=executors,
            limits=limits,
            pools=pools,
            tenants=tenants,
        )

    async def job_claim_plan(
        self, *, now: datetime, limit: int, executors: Sequence[str]
    ) -> list[str]:
        return await self._tx(claims.job_claim_plan, now=now, limit=limit, executors=executors)

    async def pool_running(
        self, *, pools: Sequence[str], tenant: str | None = None
    ) -> dict[str, int]:
        return await self._tx(claims.pool_running, pools=pools, tenant=tenant)

    async def job_cancel(self, *, job_id: int, now: datetime, reason: str) -> model.Attempt | None:
        return await self._tx(jobs.job_cancel, job_id=job_id, now=now, reason=reason)

    async def job_unquarantine(
        self, *, job_id: int, to: model.JobState, now: datetime, reason: str
    ) -> None:
        await self._tx(jobs.job_unquarantine, job_id=job_id, to=to, now=now, reason=reason)

    async def event_page(
        self,
        *,
        after: int,
        limit: int,
        job_id: int | None = None,
        tenant: str | None = None,
    ) -> tuple[list[int], list[model.Event]]:
        return await self._read(
            events.event_page, after=after, limit=limit, job_id=job_id, tenant=tenant
        )

    async def job_get_many(self, *, job_ids: Sequence[int]) -> list[model.Job]:
        return await self._read(jobs.job_get_many, job_ids=job_ids)

    async def job_get(self, *, job_id: int) -> model.Job:
        return await self._lookup(jobs.job_get, job_id=job_id)

    async def job_list(
        self,
        *,
        states: Iterable[str] = (),
        limit: int = 100,
        queue: str | None = None,
        tenant: str | None = None,
        pool: str | None = None,
        executor: str | None = None,
        labels: Mapping[str, str] | None = None,
        schedule: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        before: int | None = None,
    ) -> list[model.Job]:
        return await self._hot_read(
            jobs.job_list,
            hotreads.job_list,
            states=list(states),
            limit=limit,
            queue=queue,
            tenant=tenant,
            pool=pool,
            executor=executor,
            labels=labels,
            schedule=schedule,
            since=since,
            until=until,
            before=before,
        )

    async def job_count_by_state(self) -> dict[str, int]:
        return await self._tx(jobs.job_count_by_state)

    async def job_count_live(self) -> dict[tuple[str, str], int]:
        """Jobs in each live state (jobs.LIVE), by (state, queue): /metrics."""
        return await self._lookup(jobs.job_count_live)

    async def budget_list(self) -> dict[str, retry.Bucket]:
        """Every queue's retry budget as stored: /metrics."""
        return await self._lookup(budgets.budget_list)

    async def attempt_settle(
        self,
        *,
        launched: Sequence[int],
        finishes: Sequence[Finish],
        now: datetime,
        retry: retry.Retry | None = None,
    ) -> tuple[list[int], list[Outcome]]:
        """Apply `finishes`, then record `launched` attempts still launching as running.
        On PostgreSQL, when every finish is a success, one statement (hotpath.pg_settle)."""
        if all(f.state == A.SUCCEEDED for f in finishes):  # the hot path (hotpath.py)
            won = [(f.fence, f.exit_code, f.reason) for f in finishes]
            logs = {f.fence: f.output for f in finishes if f.output and f.output.kept}
            if won:
                failpoints.hit("mid_completion")  # one transaction: nothing half-written
            ran, done = await self._hot(
                hotpath.sqlite_settle,
                hotpath.pg_settle,
                launched=launched,
                won=won,
                logs=logs,
                now=now,
            )
            return ran, [Outcome(j, f, n, A.SUCCEEDED, J.SUCCEEDED) for j, f, n in done]
        return await self._tx(
            completions.attempt_settle, launched=launched, finishes=finishes, now=now, retry=retry
        )

    async def attempt_finish(
        self, *, finishes: Sequence[Finish], now: datetime, retry: retry.Retry | None = None
    ) -> list[Outcome]:
        if not finishes:
            return []
        if all(f.state == A.SUCCEEDED for f in finishes):
            _, outcomes = await self.attempt_settle(launched=(), finishes=finishes, now=now)
            return outcomes
        return await self._tx(completions.attempt_finish, finishes=finishes, now=now, retry=retry)

    async def attempt_record_running(
        self,
        *,
        fences: Sequence[int],
        now: datetime,
        reason: str = "launched",
        sent_by: str | None = None,
    ) -> list[int]:
        return await self._tx(
            attempts.attempt_record_running,
            fences=fences,
            now=now,
            reason=reason,
            sent_by=sent_by,
        )

    async def attempt_list_for_recovery(
        self,
        *,
        now: datetime,
        launch_grace: timedelta,
        lease_timeout: timedelta,
        attempt_deadline: timedelta,
        limit: int,
        after: int = 0,
    ) -> list[model.Claimed]:
        return await self._tx(
            attempts.attempt_list_for_recovery,
            now=now,
            launch_grace=launch_grace,
            lease_timeout=lease_timeout,
            attempt_deadline=attempt_deadline,
            limit=limit,
            after=after,
        )

    async def attempt_states(self, *, fences: Sequence[int]) -> dict[int, Status]:
        return await self._tx(attempts.attempt_states, fences=fences)

    async def attempt_seen(self, *, fences: Sequence[int], now: datetime) -> None:
        await self._tx(attempts.attempt_seen, fences=fences, now=now)

    async def attempt_note(self, *, notes: Mapping[int, str | None], now: datetime) -> list[int]:
        return await self._tx(attempts.attempt_note, notes=notes, now=now)

    async def attempt_heartbeat(self, *, job_id: int, fence: int, now: datetime) -> datetime | None:
        return await self._tx(attempts.attempt_heartbeat, job_id=job_id, fence=fence, now=now)

    async def attempt_wait(self, *, fences: Sequence[int], now: datetime, reason: str) -> list[int]:
        return await self._tx(attempts.attempt_wait, fences=fences, now=now, reason=reason)

    async def attempt_supersede(
        self, *, fences: Sequence[int], now: datetime, reason: str
    ) -> list[int]:
        return await self._tx(attempts.attempt_supersede, fences=fences, now=now, reason=reason)

    async def attempt_check(self, *, job_id: int, fence: int) -> None:
        await self._read(attempts.attempt_check, job_id=job_id, fence=fence)

    async def attempt_never_launched(
        self, *, fences: Sequence[int], now: datetime, why: str, recorded: bool = False
    ) -> list[int]:
        return await self._tx(
            attempts.attempt_never_launched, fences=fences, now=now, why=why, recorded=recorded
        )

    async def attempt_list_active(
        self, *, executor: str, limit: int, after: int = 0
    ) -> list[model.Attempt]:
        return await self._tx(
            attempts.attempt_list_active, executor=executor, limit=limit, after=after
        )

    # --- API tokens and the audit log (corral.api) -------------------------------------

    async def token_add(
        self,
        *,
        name: str,
        tenant: str | None,
        role: access.Role,
        secret_sha256: str,
        now: datetime,
        expires_at: datetime | None,
    ) -> access.Token:
        return await self._tx(
            tokens.token_add,
            name=name,
            tenant=tenant,
            role=role,
            secret_sha256=secret_sha256,
            now=now,
            expires_at=expires_at,
        )

    async def token_add_first_admin(
        self, *, name: str, secret_sha256: str, now: datetime
    ) -> access.Token | None:
        return await self._tx(
            tokens.token_add_first_admin, name=name, secret_sha256=secret_sha256, now=now
        )

    async def token_find(self, *, secret_sha256: str) -> access.Token | None:
        return await self._lookup(tokens.token_find, secret_sha256=secret_sha256)

    async def token_list(self) -> list[access.Token]:
        return await self._read(tokens.token_list)

    async def token_revoke(self, *, token_id: int, now: datetime) -> access.Token:
        return await self._tx(tokens.token_revoke, token_id=token_id, now=now)

    async def audit_add(
        self,
        *,
        at: datetime,
        token_id: int | None,
        tenant: str | None,
        action: str,
        target: str,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        await self._tx(
            tokens.audit_add,
            at=at,
            token_id=token_id,
            tenant=tenant,
            action=action,
            target=target,
            details=details,
        )

    async def audit_list(
        self, *, tenant: str | None = None, limit: int = 100
    ) -> list[access.AuditEntry]:
        return await self._read(tokens.audit_list, tenant=tenant, limit=limit)

    # --- dashboard users and sessions (corral.web) ------------------------------------

    async def user_add(
        self,
        *,
        name: str,
        password_hash: str,
        tenant: str | None,
        role: access.Role,
        now: datetime,
    ) -> access.User:
        return await self._tx(
            users.user_add,
            name=name,
            password_hash=password_hash,
            tenant=tenant,
            role=role,
            now=now,
        )

    async def user_password(self, *, name: str) -> tuple[access.User, str] | None:
        return await self._lookup(users.user_password, name=name)

    async def user_list(self) -> list[access.User]:
        return await self._read(users.user_list)

    async def user_remove(self, *, name: str, now: datetime) -> access.User:
        return await self._tx(users.user_remove, name=name, now=now)

    async def session_add(
        self,
        *,
        secret_sha256: str,
        user_id: int | None,
        token_id: int | None,
        csrf: str,
        now: datetime,
        expires_at: datetime,
    ) -> None:
        await self._tx(
            users.session_add,
            secret_sha256=secret_sha256,
            user_id=user_id,
            token_id=token_id,
            csrf=csrf,
            now=now,
            expires_at=expires_at,
        )

    async def session_find(self, *, secret_sha256: str, now: datetime) -> access.WebSession | None:
        return await self._lookup(users.session_find, secret_sha256=secret_sha256, now=now)

    async def session_remove(self, *, secret_sha256: str) -> None:
        await self._tx(users.session_remove, secret_sha256=secret_sha256)

    async def job_count_capped(self, *, tenant: str | None) -> dict[str, tuple[int, bool]]:
        return await self._lookup(overview.job_count_capped, tenant=tenant)

    async def job_ends_counted(
        self, *, tenant: str | None, since: datetime, width: timedelta, buckets: int
    ) -> list[tuple[int, int]]:
        return await self._lookup(
            overview.job_ends_counted, tenant=tenant, since=since, width=width, buckets=buckets
        )

    async def overview_read(
        self,
        *,
        tenant: str | None,
        spans: Sequence[overview.Span],
        quarantined: int,
        pools: Sequence[str] = (),
        budgets: bool = False,
    ) -> overview.Overview:
        """The dashboard's overview, its statements on one connection in one call."""
        return await self._lookup(
            overview.overview_read,
            tenant=tenant,
            spans=spans,
            quarantined=quarantined,
            pools=pools,
            budgets=budgets,
        )

    # --- alerts (corral.alerts) --------------------------------------------------------

    async def alert_cursor(self, *, name: str) -> int | None:
        return await self._tx(alerts.alert_cursor, name=name)

    async def event_newest(self) -> int:
        return await self._tx(alerts.event_newest)

    async def alert_read(
        self, *, name: str, limit: int, now: datetime, with_starts: bool = False
    ) -> alerts.AlertRead:
        return await self._read(
            alerts.alert_read, name=name, limit=limit, now=now, with_starts=with_starts
        )

    async def alert_successes(
        self, *, after: int, upto: int, subjects: Collection[str]
    ) -> list[tuple[model.Event, alerts.JobFacts | None]]:
        return await self._read(alerts.alert_successes, after=after, upto=upto, subjects=subjects)

    async def alert_events(
        self, *, after: int, limit: int, with_starts: bool = False
    ) -> alerts.EventsRead:
        return await self._tx(
            alerts.alert_events, after=after, limit=limit, with_starts=with_starts
        )

    async def alert_sent(
        self, *, pairs: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], alerts.Standing]:
        return await self._read(alerts.alert_sent, pairs=pairs)

    async def alert_open(self) -> set[str]:
        return await self._tx(alerts.alert_open)

    async def alert_write(
        self,
        *,
        name: str,
        read_from: int,
        read_to: int,
        messages: Sequence[Mapping[str, Any]],
        digested: Sequence[Mapping[str, Any]],
        now: datetime,
        standing: Mapping[tuple[str, str], alerts.Standing] | None = None,
    ) -> bool:
        return await self._tx(
            alerts.alert_write,
            name=name,
            read_from=read_from,
            read_to=read_to,
            messages=messages,
            digested=digested,
            now=now,
            standing=standing,
        )

    async def alerts_claim(
        self,
        *,
        now: datetime,
        limit: int,
        lease: timedelta,
        ids: Sequence[int] | None = None,
    ) -> list[alerts.Alert]:
        return await self._tx(alerts.alerts_claim, now=now, limit=limit, lease=lease, ids=ids)

    async def alerts_forget(self, *, before: datetime, limit: int = 500) -> int:
        return await self._tx(alerts.alerts_forget, before=before, limit=limit)

    async def alert_tried(
        self, *, alert_id: int, now: datetime, error: str | None, retry_at: datetime | None
    ) -> None:
        await self._tx(
            alerts.alert_tried, alert_id=alert_id, now=now, error=error, retry_at=retry_at
        )

    async def alert_add(self, *, message: Mapping[str, Any], now: datetime) -> int:
        return await self._tx(alerts.alert_add, message=message, now=now)

    async def alert_list(
        self,
        *,
        limit: int = 50,
        rule: str | None = None,
        before: int | None = None,
        tenant: str | None = None,
    ) -> list[alerts.Alert]:
        return await self._tx(
            alerts.alert_list, limit=limit, rule=rule, before=before, tenant=tenant
        )

    async def alert_try_list(self, *, alert_ids: Sequence[int]) -> dict[int, list[alerts.Try]]:
        return await self._tx(alerts.alert_try_list, alert_ids=alert_ids)

    async def sla_check(self, *, now: datetime, limit: int = 500) -> int:
        """Note in their run logs the jobs whose SLA passed before they succeeded."""
        return await self._tx(alerts.sla_check, now=now, limit=limit)

    async def alert_mute(self, *, rule: str, until: datetime, now: datetime) -> None:
        await self._tx(alerts.alert_mute, rule=rule, until=until, now=now)

    async def alert_unmute(self, *, rule: str) -> bool:
        return await self._tx(alerts.alert_unmute, rule=rule)

    async def alert_muted(self, *, now: datetime) -> dict[str, datetime]:
        return await self._tx(alerts.alert_muted, now=now)

    async def run_logs(self, *, job_id: int) -> dict[int, launching.RunLog]:
        """What each ended attempt of a job left to read, by fence."""
        return await self._lookup(runlogs.run_logs_of, job_id=job_id)

    async def job_record(
        self, *, job_id: int
    ) -> tuple[model.Job, list[model.Attempt], list[model.Event], dict[int, launching.RunLog]]:
        """A job, its attempts, its events and its run logs (what a job's page shows), read
        in one call on one connection; NotFound if there is no such job."""

        def job_record(
            conn: Connection, *, job_id: int
        ) -> tuple[model.Job, list[model.Attempt], list[model.Event], dict[int, launching.RunLog]]:
            return (
                jobs.job_get(conn, job_id=job_id),
                attempts.attempt_list(conn, job_id=job_id),
                events.event_list(conn, job_id=job_id),
                runlogs.run_logs_of(conn, job_id=job_id),
            )

        return await self._hot_read(job_record, hotreads.job_record, job_id=job_id)

    async def jobs_forget(self, *, before: datetime, limit: int = 500) -> int:
        """Remove up to `limit` jobs that finished before `before`, with their attempts,
        events and run logs; how many it removed."""
        return await self._tx(runlogs.jobs_forget, before=before, limit=limit)

    async def attempt_list(self, *, job_id: int) -> list[model.Attempt]:
        return await self._lookup(attempts.attempt_list, job_id=job_id)

    async def checkpoint_save(self, *, job_id: int, fence: int, state: Any, now: datetime) -> None:
        await self._tx(sinks.checkpoint_save, job_id=job_id, fence=fence, state=state, now=now)

    async def checkpoint_load(self, *, job_id: int) -> tuple[int, Any] | None:
        return await self._tx(sinks.checkpoint_load, job_id=job_id)

    async def pointer_swap(
        self,
        *,
        dataset: str,
        fence: int,
        location: str,
        code_version: str | None,
        now: datetime,
    ) -> launching.Pointer | int:
        return await self._tx(
            sinks.pointer_swap,
            dataset=dataset,
            fence=fence,
            location=location,
            code_version=code_version,
            now=now,
        )

    async def pointer_get(
        self, *, dataset: str, tenant: str | None = None, fence: int | None = None
    ) -> launching.Pointer | None:
        return await self._tx(sinks.pointer_get, dataset=dataset, tenant=tenant, fence=fence)

    # --- bulk operations (operations.py) ------------------------------------------------

    async def operation_preview(
        self, *, tenant: str | None, action: model.BulkAction, given: model.JobFilter
    ) -> model.Preview:
        return await self._read(
            operations.operation_preview, tenant=tenant, action=action, given=given
        )

    async def operation_create(
        self,
        *,
        tenant: str | None,
        action: model.BulkAction,
        given: model.JobFilter,
        expect: int | None,
        token_id: int | None,
        made_by: str,
        now: datetime,
    ) -> model.Operation:
        return await self._tx(
            operations.operation_create,
            tenant=tenant,
            action=action,
            given=given,
            expect=expect,
            token_id=token_id,
            made_by=made_by,
            now=now,
        )

    async def operation_running(self, *, limit: int = 10) -> list[int]:
        return await self._read(operations.operation_running, limit=limit)

    async def operation_step(
        self, *, operation_id: int, now: datetime, limit: int
    ) -> operations.Step:
        return await self._tx(
            operations.operation_step, operation_id=operation_id, now=now, limit=limit
        )

    async def operation_cancel(self, *, operation_id: int, now: datetime) -> model.Operation:
        return await self._tx(operations.operation_cancel, operation_id=operation_id, now=now)

    async def operation_get(self, *, operation_id: int) -> model.Operation:
        return await self._read(operations.operation_get, operation_id=operation_id)

    async def operation_list(
        self, *, tenant: str | None, limit: int = 100, before: int | None = None
    ) -> list[model.Operation]:
        return await self._read(
            operations.operation_list, tenant=tenant, limit=limit, before=before
        )

    async def operation_items(
        self,
        *,
        operation_id: int,
        outcome: model.ItemOutcome | None = None,
        limit: int = 100,
    ) -> list[model.OperationItem]:
        return await self._read(
            operations.operation_items_list,
            operation_id=operation_id,
            outcome=outcome,
            limit=limit,
        )

    # --- schedules and firings (schedules.py) ------------------------------------------

    async def schedule_create(
        self,
        *,
        new: scheduling.NewSchedule,
        anchor: datetime,
        next_due: datetime | None,
        now: datetime,
    ) -> scheduling.Schedule:
        return await self._tx(
            schedules.schedule_create, new=new, anchor=anchor, next_due=next_due, now=now
        )

    async def schedules_create(
        self,
        *,
        items: Sequence[tuple[scheduling.NewSchedule, datetime, datetime | None]],
        now: datetime,
        paused: bool = False,
    ) -> list[scheduling.Schedule]:
        return await self._tx(schedules.schedules_create, items=items, now=now, paused=paused)

    async def schedule_update(
        self,
        *,
        schedule_id: int,
        changes: Mapping[str, Any],
        next_due: datetime | None,
        now: datetime,
    ) -> scheduling.Schedule:
        return await self._tx(
            schedules.schedule_update,
            schedule_id=schedule_id,
            changes=changes,
            next_due=next_due,
            now=now,
        )

    async def secret_add(
        self, *, tenant: str, secret: str, now: datetime, overlap: timedelta, rotate: bool
    ) -> access.SigningSecret:
        return await self._tx(
            secrets.secret_add,
            tenant=tenant,
            secret=secret,
            now=now,
            overlap=overlap,
            rotate=rotate,
        )

    async def secrets_signing(self, *, tenants: list[str], now: datetime) -> dict[str, list[str]]:
        return await self._tx(secrets.secrets_signing, tenants=tenants, now=now)

    async def secrets_list(
        self, *, tenant: str | None, now: datetime
    ) -> list[access.SigningSecret]:
        return await self._tx(secrets.secrets_list, tenant=tenant, now=now)

    async def service_key(self, *, name: str, secret: str, now: datetime) -> str:
        return await self._tx(secrets.service_key, name=name, secret=secret, now=now)

    async def schedule_delete(self, *, schedule_id: int) -> None:
        await self._tx(schedules.schedule_delete, schedule_id=schedule_id)

    async def schedule_pause(self, *, schedule_id: int, now: datetime) -> scheduling.Schedule:
        return await self._tx(schedules.schedule_pause, schedule_id=schedule_id, now=now)

    async def schedule_resume(
        self,
        *,
        schedule_id: int,
        skipped: Sequence[datetime],
        skipped_count: int,
        next_due: datetime | None,
        now: datetime,
    ) -> scheduling.Schedule:
        return await self._tx(
            schedules.schedule_resume,
            schedule_id=schedule_id,
            skipped=skipped,
            skipped_count=skipped_count,
            next_due=next_due,
            now=now,
        )

    async def schedule_get(self, *, name: str, tenant: str = "default") -> scheduling.Schedule:
        return await self._tx(schedules.schedule_get, name=name, tenant=tenant)

    async def schedule_by_id(self, *, schedule_id: int) -> scheduling.Schedule:
        return await self._tx(schedules.schedule_by_id, schedule_id=schedule_id)

    async def schedule_list(
        self, *, tenant: str | None = None, limit: int = 1000
    ) -> list[scheduling.Schedule]:
        return await self._tx(schedules.schedule_list, tenant=tenant, limit=limit)

    async def firing_list(
        self, *, schedule_id: int, limit: int = 20, before: datetime | None = None
    ) -> list[scheduling.Firing]:
        return await self._tx(
            schedules.firing_list, schedule_id=schedule_id, limit=limit, before=before
        )

    async def firing_counts(self, *, schedule_id: int) -> dict[str, int]:
        return await self._tx(schedules.firing_counts, schedule_id=schedule_id)

    async def schedule_next_wake(self, *, ahead: timedelta = timedelta(0)) -> datetime | None:
        return await self._tx(schedules.schedule_next_wake, ahead=ahead)

    async def schedules_fire_due(
        self,
        *,
        now: datetime,
        limit: int,
        plan: Callable[[scheduling.Schedule, model.JobState | None], planning.Plan],
        ahead: timedelta = timedelta(0),
    ) -> planning.Fired:
        return await self._tx(
            schedules.schedules_fire_due, now=now, limit=limit, plan=plan, ahead=ahead
        )

    async def backfill(
        self, *, schedule: scheduling.Schedule, fires: Sequence[scheduling.Fire], now: datetime
    ) -> tuple[int, int]:
        return await self._tx(schedules.backfill, schedule=schedule, fires=fires, now=now)

    async def jobs_promote_due(self, *, now: datetime, limit: int) -> int:
        return await self._tx(claims.jobs_promote_due, now=now, limit=limit)

    # --- Python workers and parked jobs (corral.worker) ---------------------------------

    async def worker_register(
        self, *, worker: python_tasks.Worker, now: datetime, since: datetime
    ) -> int:
        return await self._tx(workers.worker_register, worker=worker, now=now, since=since)

    async def worker_beat(
        self, *, worker_id: str, leases: Mapping[int, float], now: datetime, since: datetime
    ) -> tuple[python_tasks.WorkerState | None, list[int]]:
        return await self._tx(
            workers.worker_beat, worker_id=worker_id, leases=leases, now=now, since=since
        )

    async def worker_drain(self, *, worker_id: str, now: datetime) -> None:
        await self._tx(workers.worker_drain, worker_id=worker_id, now=now)

    async def worker_stop(self, *, worker_id: str, now: datetime, since: datetime) -> int:
        return await self._tx(workers.worker_stop, worker_id=worker_id, now=now, since=since)

    async def worker_list(
        self, *, since: datetime, live: bool = True, limit: int = 500
    ) -> list[python_tasks.Worker]:
        return await self._read(workers.worker_list, since=since, live=live, limit=limit)

    async def workers_forget(self, *, before: datetime) -> int:
        return await self._tx(workers.workers_forget, before=before)

    async def worker_claim(
        self,
        *,
        worker_id: str,
        reads: Sequence[tuple[str, Sequence[int]]],
        queues: Sequence[str],
        now: datetime,
        limit: int,
        limits: DefaultLimits,
        pools: Mapping[str, int] | None = None,
        tenants: Mapping[str, int] | None = None,
    ) -> list[model.Claimed]:
        args = dict(
            worker_id=worker_id, reads=reads, queues=queues, now=now, limit=limit, limits=limits
        )
        if not pools and not tenants:  # the hot path (hotpath.py): one statement on PostgreSQL
            return await self._hot(workers.worker_claim, hotpath.pg_worker_claim, **args)
        return await self._tx(workers.worker_claim, pools=pools, tenants=tenants, **args)

    async def task_schemas(
        self, *, task: str, since: datetime
    ) -> tuple[dict[int, Mapping[str, Any]], int | None]:
        return await self._read(workers.task_schemas, task=task, since=since)

    async def known_schema(self, *, task: str, version: int) -> Mapping[str, Any] | None:
        return await self._read(workers.known_schema, task=task, version=version)

    async def task_readers(
        self, *, pairs: Sequence[tuple[str, int, str]], since: datetime
    ) -> set[tuple[str, int, str]]:
        return await self._read(workers.readers, pairs=pairs, since=since)

    async def jobs_unpark_read(self, *, now: datetime, since: datetime) -> int:
        return await self._tx(workers.jobs_unpark_read, now=now, since=since)

    async def lowest_app_versions(
        self, *, pairs: Sequence[tuple[str, int]]
    ) -> dict[tuple[str, int], str]:
        return await self._read(workers.lowest_app_versions, pairs=pairs)

    async def jobs_park_unread(
        self, *, now: datetime, since: datetime, job_ids: Sequence[int] | None = None
    ) -> int:
        return await self._tx(workers.jobs_park_unread, now=now, since=since, job_ids=job_ids)

    async def parked_release(
        self, *, job_ids: Sequence[int] = (), task: str | None = None, now: datetime
    ) -> list[int]:
        return await self._tx(workers.parked_release, job_ids=job_ids, task=task, now=now)

    async def parked_list(
        self, *, task: str | None = None, tenant: str | None = None, limit: int = 100
    ) -> list[python_tasks.ParkedJob]:
        return await self._read(workers.parked_list, task=task, tenant=tenant, limit=limit)

    async def payload_versions(
        self, *, tasks: Sequence[str]
    ) -> dict[tuple[str, int], dict[str, int]]:
        return await self._read(workers.payload_versions, tasks=tasks)

    async def attempt_hand_back(self, *, fences: Sequence[int], now: datetime) -> list[int]:
        return await self._tx(attempts.attempt_hand_back, fences=fences, now=now)

    async def attempt_park(
        self, *, fences: Sequence[int], task: str, version: int, now: datetime, why: str
    ) -> list[int]:
        return await self._tx(
            workers.attempt_park, fences=fences, task=task, version=version, now=now, why=why
        )

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
