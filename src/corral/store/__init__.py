"""The durable store: jobs, attempts and events in SQLite (embedded) or PostgreSQL (scale).

`Store` is the async face of the store: each method runs one query function from
queries.py in one transaction on a worker thread, so the event loop never blocks on the
database. Database errors are translated once, here, into StoreError (cause kept).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy import exc as sa_exc

from corral import errors, model, retry
from corral.store import dialects, migrate, queries
from corral.store.queries import DefaultLimits, Finish, Outcome, Status

__all__ = ["DefaultLimits", "Finish", "Outcome", "Status", "Store"]

T = TypeVar("T")


class Store:
    """Jobs, attempts and events, behind compare-and-set transitions."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        # SQLite has one writer at a time: one thread keeps this process from queueing on
        # its own lock. PostgreSQL takes as many as the connection pool holds.
        workers = 1 if self.dialect == "sqlite" else 5
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="corral-store")

    @classmethod
    def connect(cls, url: str) -> Store:
        """A Store for `url` (no connection is made until the first call)."""
        try:
            return cls(dialects.engine_create(url))
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
        self.engine.dispose()

    def _run(self, fn: Callable[[Connection], T]) -> T:
        try:
            with self.engine.begin() as conn:
                return fn(conn)
        except sa_exc.OperationalError as exc:
            raise errors.StoreError(
                f"database {self.url} failed: {_first_line(exc.orig or exc)}"
            ) from exc
        except sa_exc.DBAPIError as exc:
            raise errors.StoreError(f"database error: {_first_line(exc.orig or exc)}") from exc

    async def _tx(self, fn: Callable[..., T], /, **kwargs: Any) -> T:
        """Run `fn(conn, **kwargs)` in one transaction on the store's worker thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._run, functools.partial(fn, **kwargs))

    # --- schema --------------------------------------------------------------------------

    async def migrate(self) -> tuple[str | None, str | None]:
        """Upgrade the schema to the newest revision; returns (before, after)."""

        def upgrade(conn: Connection) -> tuple[str | None, str | None]:
            before = migrate.current(conn)
            migrate.upgrade(conn)
            return before, migrate.current(conn)

        return await self._tx(upgrade)

    async def check_schema(self) -> None:
        """Raise SchemaOutOfDate unless the database is at this corral's newest revision.
        A SQLite file that does not exist is not created (only `migrate` creates one), so
        a command that only reads leaves no empty database behind."""
        if (path := self.sqlite_path) is not None and not path.exists():
            raise errors.SchemaOutOfDate(
                f"there is no database at {path} (database_url {self.url}): run"
                " `corral db upgrade` to create it, or point database_url at yours"
            )
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

    # --- operations (see queries.py for what each does) --------------------------------------

    async def transition(self, **kwargs: Any) -> list[int]:
        """queries.transition in its own transaction; returns the ids that changed."""
        return [a.id for a in await self._tx(queries.transition, **kwargs)]

    async def analyze(self) -> None:
        await self._tx(queries.analyze)

    async def job_claim_plan(
        self, *, now: datetime, limit: int, executors: Sequence[str]
    ) -> list[str]:
        return await self._tx(queries.job_claim_plan, now=now, limit=limit, executors=executors)

    async def job_submit(
        self, *, new: Sequence[model.NewJob], now: datetime
    ) -> list[tuple[int, bool]]:
        return await self._tx(queries.job_submit, new=new, now=now)

    async def job_claim(
        self,
        *,
        now: datetime,
        limit: int,
        executors: Sequence[str],
        limits: queries.DefaultLimits | None = None,
        pools: Mapping[str, int] | None = None,
    ) -> list[model.Claimed]:
        return await self._tx(
            queries.job_claim,
            now=now,
            limit=limit,
            executors=executors,
            limits=limits,
            pools=pools,
        )

    async def pool_running(self, *, pools: Sequence[str]) -> dict[str, int]:
        return await self._tx(queries.pool_running, pools=pools)

    async def attempt_record_running(
        self, *, fences: Sequence[int], now: datetime, reason: str = "launched"
    ) -> list[int]:
        return await self._tx(queries.attempt_record_running, fences=fences, now=now, reason=reason)

    async def attempt_list_for_recovery(self, **kwargs: Any) -> list[model.Claimed]:
        return await self._tx(queries.attempt_list_for_recovery, **kwargs)

    async def attempt_states(self, *, fences: Sequence[int]) -> dict[int, queries.Status]:
        return await self._tx(queries.attempt_states, fences=fences)

    async def attempt_settle(
        self,
        *,
        launched: Sequence[int],
        finishes: Sequence[Finish],
        now: datetime,
        retry: retry.Retry | None = None,
    ) -> tuple[list[int], list[Outcome]]:
        return await self._tx(
            queries.attempt_settle, launched=launched, finishes=finishes, now=now, retry=retry
        )

    async def attempt_finish(
        self, *, finishes: Sequence[Finish], now: datetime, retry: retry.Retry | None = None
    ) -> list[Outcome]:
        return await self._tx(queries.attempt_finish, finishes=finishes, now=now, retry=retry)

    async def attempt_seen(self, *, fences: Sequence[int], now: datetime) -> None:
        await self._tx(queries.attempt_seen, fences=fences, now=now)

    async def attempt_heartbeat(self, *, job_id: int, fence: int, now: datetime) -> datetime | None:
        return await self._tx(queries.attempt_heartbeat, job_id=job_id, fence=fence, now=now)

    async def attempt_wait(self, *, fences: Sequence[int], now: datetime, reason: str) -> list[int]:
        return await self._tx(queries.attempt_wait, fences=fences, now=now, reason=reason)

    async def attempt_supersede(
        self, *, fences: Sequence[int], now: datetime, reason: str
    ) -> list[int]:
        return await self._tx(queries.attempt_supersede, fences=fences, now=now, reason=reason)

    async def attempt_never_launched(
        self, *, fences: Sequence[int], now: datetime, why: str
    ) -> list[int]:
        return await self._tx(queries.attempt_never_launched, fences=fences, now=now, why=why)

    async def job_unquarantine(
        self, *, job_id: int, to: model.JobState, now: datetime, reason: str
    ) -> None:
        await self._tx(queries.job_unquarantine, job_id=job_id, to=to, now=now, reason=reason)

    async def attempt_list_active(
        self, *, executor: str, limit: int, after: int = 0
    ) -> list[model.Attempt]:
        return await self._tx(
            queries.attempt_list_active, executor=executor, limit=limit, after=after
        )

    async def event_note(self, **kwargs: Any) -> None:
        await self._tx(queries.event_note, **kwargs)

    async def job_cancel(self, *, job_id: int, now: datetime, reason: str) -> model.Attempt | None:
        return await self._tx(queries.job_cancel, job_id=job_id, now=now, reason=reason)

    async def checkpoint_save(self, *, job_id: int, fence: int, state: Any, now: datetime) -> None:
        await self._tx(queries.checkpoint_save, job_id=job_id, fence=fence, state=state, now=now)

    async def checkpoint_load(self, *, job_id: int) -> tuple[int, Any] | None:
        return await self._tx(queries.checkpoint_load, job_id=job_id)

    async def pointer_swap(
        self,
        *,
        dataset: str,
        fence: int,
        location: str,
        code_version: str | None,
        now: datetime,
    ) -> model.Pointer | int:
        return await self._tx(
            queries.pointer_swap,
            dataset=dataset,
            fence=fence,
            location=location,
            code_version=code_version,
            now=now,
        )

    async def pointer_get(self, *, dataset: str) -> model.Pointer | None:
        return await self._tx(queries.pointer_get, dataset=dataset)

    async def job_get(self, *, job_id: int) -> model.Job:
        return await self._tx(queries.job_get, job_id=job_id)

    async def job_list(
        self,
        *,
        states: Iterable[str] = (),
        limit: int = 100,
        queue: str | None = None,
        tenant: str | None = None,
        pool: str | None = None,
    ) -> list[model.Job]:
        return await self._tx(
            queries.job_list,
            states=list(states),
            limit=limit,
            queue=queue,
            tenant=tenant,
            pool=pool,
        )

    async def job_count_by_state(self) -> dict[str, int]:
        return await self._tx(queries.job_count_by_state)

    async def attempt_list(self, *, job_id: int) -> list[model.Attempt]:
        return await self._tx(queries.attempt_list, job_id=job_id)

    async def event_list(self, *, job_id: int) -> list[model.Event]:
        return await self._tx(queries.event_list, job_id=job_id)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
