"""The durable store: jobs, attempts and events in SQLite (embedded) or PostgreSQL (scale).

`Store` holds the database (database.py: its connections, transactions and schema) and a
typed handle per thing stored, each in the module of the functions it runs: `store.jobs`
(jobs.py), `store.attempts`, `store.events`, `store.schedules`, `store.alerts`,
`store.tokens` (API tokens, the audit log, signing secrets), `store.users` (the
dashboard's users and sessions), `store.workers` (Python workers and parked jobs),
`store.operations` (bulk actions), `store.runlogs`, `store.sinks` (checkpoints and publish
pointers) and `store.loops`. A handle's call runs one function of its module in one
transaction on a worker thread, or, on PostgreSQL, a statement of the hot path
(hotpath.py, hotreads.py) on async connections of its own.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import Engine
from sqlalchemy import exc as sa_exc

from corral import config, errors, failpoints, model, retry
from corral.store import (
    alerts,
    attempts,
    budgets,
    claims,
    completions,
    database,
    dialects,
    events,
    hotpath,
    jobs,
    loops,
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
from corral.store.database import READS_AT_ONCE

T = TypeVar("T")
A, J = model.AttemptState, model.JobState

__all__ = ["READS_AT_ONCE", "DefaultLimits", "Finish", "Outcome", "Status", "Store"]


class Store:
    """One database, and a handle on each thing stored in it."""

    def __init__(self, engine: Engine, *, limits: dialects.ConnectionLimits | None = None) -> None:
        self.database = database.Database(engine, limits=limits)
        self.jobs = jobs.Jobs(self.database)
        self.attempts = attempts.Attempts(self.database)
        self.events = events.Events(self.database)
        self.schedules = schedules.Schedules(self.database)
        self.alerts = alerts.Alerts(self.database)
        self.tokens = tokens.Tokens(self.database)
        self.users = users.Users(self.database)
        self.workers = workers.Workers(self.database)
        self.operations = operations.Operations(self.database)
        self.runlogs = runlogs.RunLogs(self.database)
        self.sinks = sinks.Sinks(self.database)
        self.loops = loops.Loops(self.database)

    @classmethod
    def connect(cls, url: str, *, timeouts: config.Timeouts | None = None) -> Store:
        """A Store for `url` (no connection is made until the first call), with the time
        limits of `timeouts` (default: the default settings') on its PostgreSQL connections."""
        limits = dialects.ConnectionLimits.of(timeouts or config.Timeouts())
        try:
            return cls(dialects.engine_create(url, limits), limits=limits)
        except (sa_exc.ArgumentError, ImportError, ValueError) as exc:
            raise errors.ConfigError(f"database_url: {url!r} is not usable: {exc}") from exc

    async def close(self) -> None:
        """Close the database's threads, pools and connections."""
        await self.database.close()

    # Until every caller calls the handles: the old names, forwarded.
    @property
    def url(self) -> str:
        return self.database.url

    @property
    def engine(self) -> Engine:
        return self.database.engine

    @property
    def dialect(self) -> str:
        return self.database.dialect

    @property
    def read_pool(self) -> Any:
        return self.database.read_pool

    @property
    def hot_pool(self) -> Any:
        return self.database.hot_pool

    async def migrate(self) -> tuple[str | None, str | None]:
        return await self.database.migrate()

    async def check_schema(self, *, revision: bool = True) -> None:
        await self.database.check_schema(revision=revision)

    async def installation(self) -> str:
        return await self.database.installation()

    async def analyze(self) -> None:
        await self.database.analyze()

    def woken(self, channel: str = workers.CHANNEL) -> Any:
        return self.database.woken(channel)

    async def _tx(self, fn: Callable[..., T], /, **kwargs: Any) -> T:
        return await self.database.tx(functools.partial(fn, **kwargs))

    async def _read(self, fn: Callable[..., T], /, **kwargs: Any) -> T:
        return await self.database.read(functools.partial(fn, **kwargs))

    async def _lookup(self, fn: Callable[..., T], /, **kwargs: Any) -> T:
        return await self.database.lookup(functools.partial(fn, **kwargs))

    async def _hot(
        self,
        on_sqlite: Callable[..., T],
        on_postgresql: Callable[..., Awaitable[T]],
        /,
        **kwargs: Any,
    ) -> T:
        return await self.database.hot(
            functools.partial(on_sqlite, **kwargs), functools.partial(on_postgresql, **kwargs)
        )

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
            if created and job.executor == model.PYTHON
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
        given = model.JobFilter(
            states=tuple(states),
            queue=queue,
            tenant=tenant,
            pool=pool,
            executor=executor,
            labels=labels or {},
            schedule=schedule,
            since=since,
            until=until,
        )
        return await self.jobs.list(given, limit=limit, before=before)

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
        role: model.Role,
        secret_sha256: str,
        now: datetime,
        expires_at: datetime | None,
    ) -> model.Token:
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
    ) -> model.Token | None:
        return await self._tx(
            tokens.token_add_first_admin, name=name, secret_sha256=secret_sha256, now=now
        )

    async def token_find(self, *, secret_sha256: str) -> model.Token | None:
        return await self._lookup(tokens.token_find, secret_sha256=secret_sha256)

    async def token_list(self) -> list[model.Token]:
        return await self._read(tokens.token_list)

    async def token_revoke(self, *, token_id: int, now: datetime) -> model.Token:
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
    ) -> list[model.AuditEntry]:
        return await self._read(tokens.audit_list, tenant=tenant, limit=limit)

    # --- dashboard users and sessions (corral.web) ------------------------------------

    async def user_add(
        self,
        *,
        name: str,
        password_hash: str,
        tenant: str | None,
        role: model.Role,
        now: datetime,
    ) -> model.User:
        return await self._tx(
            users.user_add,
            name=name,
            password_hash=password_hash,
            tenant=tenant,
            role=role,
            now=now,
        )

    async def user_password(self, *, name: str) -> tuple[model.User, str] | None:
        return await self._lookup(users.user_password, name=name)

    async def user_list(self) -> list[model.User]:
        return await self._read(users.user_list)

    async def user_remove(self, *, name: str, now: datetime) -> model.User:
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

    async def session_find(self, *, secret_sha256: str, now: datetime) -> model.WebSession | None:
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

    async def run_logs(self, *, job_id: int) -> dict[int, model.RunLog]:
        """What each ended attempt of a job left to read, by fence."""
        return await self._lookup(runlogs.run_logs_of, job_id=job_id)

    async def job_record(
        self, *, job_id: int
    ) -> tuple[model.Job, list[model.Attempt], list[model.Event], dict[int, model.RunLog]]:
        return await self.jobs.record(job_id=job_id)

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
    ) -> model.Pointer | int:
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
    ) -> model.Pointer | None:
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
        new: model.NewSchedule,
        anchor: datetime,
        next_due: datetime | None,
        now: datetime,
    ) -> model.Schedule:
        return await self._tx(
            schedules.schedule_create, new=new, anchor=anchor, next_due=next_due, now=now
        )

    async def schedules_create(
        self,
        *,
        items: Sequence[tuple[model.NewSchedule, datetime, datetime | None]],
        now: datetime,
        paused: bool = False,
    ) -> list[model.Schedule]:
        return await self._tx(schedules.schedules_create, items=items, now=now, paused=paused)

    async def schedule_update(
        self,
        *,
        schedule_id: int,
        changes: Mapping[str, Any],
        next_due: datetime | None,
        now: datetime,
    ) -> model.Schedule:
        return await self._tx(
            schedules.schedule_update,
            schedule_id=schedule_id,
            changes=changes,
            next_due=next_due,
            now=now,
        )

    async def secret_add(
        self, *, tenant: str, secret: str, now: datetime, overlap: timedelta, rotate: bool
    ) -> model.SigningSecret:
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

    async def secrets_list(self, *, tenant: str | None, now: datetime) -> list[model.SigningSecret]:
        return await self._tx(secrets.secrets_list, tenant=tenant, now=now)

    async def service_key(self, *, name: str, secret: str, now: datetime) -> str:
        return await self._tx(secrets.service_key, name=name, secret=secret, now=now)

    async def schedule_delete(self, *, schedule_id: int) -> None:
        await self._tx(schedules.schedule_delete, schedule_id=schedule_id)

    async def schedule_pause(self, *, schedule_id: int, now: datetime) -> model.Schedule:
        return await self._tx(schedules.schedule_pause, schedule_id=schedule_id, now=now)

    async def schedule_resume(
        self,
        *,
        schedule_id: int,
        skipped: Sequence[datetime],
        skipped_count: int,
        next_due: datetime | None,
        now: datetime,
    ) -> model.Schedule:
        return await self._tx(
            schedules.schedule_resume,
            schedule_id=schedule_id,
            skipped=skipped,
            skipped_count=skipped_count,
            next_due=next_due,
            now=now,
        )

    async def schedule_get(self, *, name: str, tenant: str = "default") -> model.Schedule:
        return await self._tx(schedules.schedule_get, name=name, tenant=tenant)

    async def schedule_by_id(self, *, schedule_id: int) -> model.Schedule:
        return await self._tx(schedules.schedule_by_id, schedule_id=schedule_id)

    async def schedule_list(
        self, *, tenant: str | None = None, limit: int = 1000
    ) -> list[model.Schedule]:
        return await self._tx(schedules.schedule_list, tenant=tenant, limit=limit)

    async def firing_list(
        self, *, schedule_id: int, limit: int = 20, before: datetime | None = None
    ) -> list[model.Firing]:
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
        plan: Callable[[model.Schedule, model.JobState | None], schedules.Plan],
        ahead: timedelta = timedelta(0),
    ) -> schedules.Fired:
        return await self._tx(
            schedules.schedules_fire_due, now=now, limit=limit, plan=plan, ahead=ahead
        )

    async def backfill(
        self, *, schedule: model.Schedule, fires: Sequence[model.Fire], now: datetime
    ) -> tuple[int, int]:
        return await self._tx(schedules.backfill, schedule=schedule, fires=fires, now=now)

    async def jobs_promote_due(self, *, now: datetime, limit: int) -> int:
        return await self._tx(claims.jobs_promote_due, now=now, limit=limit)

    # --- Python workers and parked jobs (corral.worker) ---------------------------------

    async def worker_register(self, *, worker: model.Worker, now: datetime, since: datetime) -> int:
        return await self._tx(workers.worker_register, worker=worker, now=now, since=since)

    async def worker_beat(
        self, *, worker_id: str, leases: Mapping[int, float], now: datetime, since: datetime
    ) -> tuple[model.WorkerState | None, list[int]]:
        return await self._tx(
            workers.worker_beat, worker_id=worker_id, leases=leases, now=now, since=since
        )

    async def worker_drain(self, *, worker_id: str, now: datetime) -> None:
        await self._tx(workers.worker_drain, worker_id=worker_id, now=now)

    async def worker_stop(self, *, worker_id: str, now: datetime, since: datetime) -> int:
        return await self._tx(workers.worker_stop, worker_id=worker_id, now=now, since=since)

    async def worker_list(
        self, *, since: datetime, live: bool = True, limit: int = 500
    ) -> list[model.Worker]:
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
    ) -> list[model.ParkedJob]:
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
