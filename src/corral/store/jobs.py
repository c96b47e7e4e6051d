"""Jobs: submit (idempotent by key), cancel, a person's decision on a quarantined job, and
the reads (the job list's in job_lists.py)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, func, insert, select

from corral import launching, model, policy, python_tasks, quotas, retry, scheduling, shares
from corral.store import attempts as attempts_
from corral.store import (
    budgets,
    claims,
    dialects,
    flows,
    hotpath,
    hotreads,
    job_lists,
    parking,
    runlogs,
    tokens,
)
from corral.store import caps as claim_caps
from corral.store import quotas as holds
from corral.store.events import event_insert, event_list, event_row
from corral.store.job_decisions import job_cancel, job_unquarantine
from corral.store.rows import job_from_row, job_get
from corral.store.tables import job_slas, jobs

if TYPE_CHECKING:
    from corral.store import overview as overview_
    from corral.store.database import Database

A, J = model.AttemptState, model.JobState

# --- submit -------------------------------------------------------------------------------------


def job_submit(
    conn: Connection, *, new: Sequence[model.NewJob], now: datetime, hold: bool = True
) -> list[tuple[int, bool]]:
    """Insert jobs as `queued`, or, with `hold`, `scheduled` when their run_at is still to
    come (the scheduler queues them once it has; without `hold` a queued job still waits
    for its run_at, as a retry does); a (tenant, idempotency key) seen before returns the
    existing id.

    Returns (job id, created) in the order of `new`.
    """
    if any(j.flow is not None for j in new):
        flows.flows_named(conn, named={(j.tenant, j.flow) for j in new if j.flow is not None})
    out: list[tuple[int, bool] | None] = [None] * len(new)
    plain = [i for i, j in enumerate(new) if j.idempotency_key is None]
    keyed = [i for i, j in enumerate(new) if j.idempotency_key is not None]
    if plain:
        stmt = insert(jobs).returning(jobs.c.id, sort_by_parameter_order=True)
        rows = _job_rows([new[i] for i in plain], now, hold)
        ids = conn.execute(stmt, rows).scalars().all()
        for i, job_id in zip(plain, ids, strict=True):
            out[i] = (job_id, True)
    if keyed:
        for i, made in zip(
            keyed, _job_submit_keyed(conn, [new[i] for i in keyed], now, hold), strict=True
        ):
            out[i] = made
    result = [o for o in out if o is not None]
    if any(j.executor == python_tasks.PYTHON for j in new):
        dialects.notify(conn, dialects.TASKS)  # waiting workers claim at once
    _slas(conn, new, result, now)
    _submitted(conn, new, result, now, hold)
    return result


def _submitted(
    conn: Connection,
    new: Sequence[model.NewJob],
    made: Sequence[tuple[int, bool]],
    now: datetime,
    hold: bool,
) -> None:
    """The run log's first line of each job made (not of one an idempotency key found)."""
    event_insert(
        conn,
        [
            event_row(
                job_id=job_id,
                attempt_id=None,
                entity="job",
                frm=None,
                to=_first_state(job, now, hold),
                reason="submitted",
                now=now,
            )
            for job, (job_id, created) in zip(new, made, strict=True)
            if created
        ],
    )


def _slas(
    conn: Connection, new: Sequence[model.NewJob], made: Sequence[tuple[int, bool]], now: datetime
) -> None:
    """When each new job with an SLA must have succeeded by: its policy's `sla` from its
    run_at, or for a firing's job from its nominal time."""
    rows = []
    for job, (job_id, created) in zip(new, made, strict=True):
        sla = policy.JobPolicy.read(job.policy).sla if created and job.policy else None
        if sla is not None:
            rows.append({"job_id": job_id, "due_at": _counted_from(job, now) + sla})
    if rows:
        conn.execute(insert(job_slas), rows)


def _counted_from(job: model.NewJob, now: datetime) -> datetime:
    firing = job.payload.get(scheduling.FIRING) if isinstance(job.payload, dict) else None
    nominal = firing.get("nominal_time") if isinstance(firing, dict) else None
    if isinstance(nominal, str):
        try:
            return datetime.fromisoformat(nominal.replace("Z", "+00:00"))
        except ValueError:
            pass
    return job.run_at or now


def _first_state(job: model.NewJob, now: datetime, hold: bool = True) -> model.JobState:
    held = hold and job.run_at is not None and job.run_at > now
    return J.SCHEDULED if held else J.QUEUED


KEYED_CONFLICT = (
    "ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING"
)
"""A key stored before wins (uq_jobs_idempotency, a partial unique index)."""


def _job_submit_keyed(
    conn: Connection, new: Sequence[model.NewJob], now: datetime, hold: bool
) -> list[tuple[int, bool]]:
    """Keyed jobs in one statement: a key stored before (or earlier in `new`) gives the
    job that has it, with created False."""
    first: dict[tuple[str, str], int] = {}  # the first job of `new` with each key
    for n, job in enumerate(new):
        assert job.idempotency_key is not None
        first.setdefault((job.tenant, job.idempotency_key), n)
    rows = _job_rows([new[n] for n in first.values()], now, hold)
    inserted = dialects.insert_many(
        conn,
        jobs,
        rows,
        returning=("id", "tenant", "idempotency_key"),
        on_conflict=KEYED_CONFLICT,
    )
    made = {(tenant, key): job_id for job_id, tenant, key in inserted}
    existing = _keyed_existing(conn, [key for key in first if key not in made])
    out: list[tuple[int, bool]] = []
    for n, job in enumerate(new):
        key = (job.tenant, job.idempotency_key or "")
        if key in made:
            out.append((made[key], first[key] == n))
        else:
            out.append((existing[key], False))
    return out


def _keyed_existing(
    conn: Connection, missing: Sequence[tuple[str, str]]
) -> dict[tuple[str, str], int]:
    """The jobs stored before with the (tenant, idempotency key) pairs of `missing`, read
    500 keys at a time."""
    wanted = set(missing)
    existing: dict[tuple[str, str], int] = {}
    for start in range(0, len(missing), 500):
        chunk = missing[start : start + 500]
        found = conn.execute(
            select(jobs.c.id, jobs.c.tenant, jobs.c.idempotency_key).where(
                jobs.c.idempotency_key.in_([key for _, key in chunk]),
                jobs.c.idempotency_key.is_not(None),
            )
        )
        existing.update(
            {
                (r.tenant, r.idempotency_key): r.id
                for r in found
                if (r.tenant, r.idempotency_key) in wanted
            }
        )
    return existing


def _job_rows(new: Sequence[model.NewJob], now: datetime, hold: bool) -> list[dict[str, Any]]:
    """The rows of `new`; `tenant_made` named only where one of them is a tenant's (a batch
    of the operator's leaves it to its default, as every corral before it did), and the
    callbacks and `flow` only where one of them has one."""
    rows = [_job_row(job, now, hold) for job in new]
    for name in _NAMED_WHEN_SET:
        if any(getattr(job, name) for job in new):
            for row, job in zip(rows, new, strict=True):
                row[name] = getattr(job, name)
    return rows


_NAMED_WHEN_SET = ("tenant_made", "callback", "failure_callback", "callback_of", "flow")
"""The columns a batch of jobs names only where one of its jobs has a value there."""


def _job_row(job: model.NewJob, now: datetime, hold: bool) -> dict[str, Any]:
    return {
        "tenant": job.tenant,
        "queue": job.queue,
        "pool": job.pool,
        "priority": job.priority,
        "executor": job.executor,
        "spec": dict(job.spec),
        "payload": job.payload,
        "state": _first_state(job, now, hold),
        "run_at": job.run_at or now,
        "idempotency_key": job.idempotency_key,
        "max_attempts": job.max_attempts,
        "attempt_count": 0,
        "labels": dict(job.labels),
        "created_at": now,
        "updated_at": now,
        "policy": dict(job.policy),
        "code_version": job.code_version,
    }


# --- reads --------------------------------------------------------------------------------------


def job_get_many(conn: Connection, *, job_ids: Sequence[int]) -> list[model.Job]:
    """The jobs of `job_ids` that exist, in id order."""
    if not job_ids:
        return []
    rows = conn.execute(
        select(jobs).where(dialects.one_of(conn, jobs.c.id, job_ids)).order_by(jobs.c.id)
    )
    return [job_from_row(r._mapping) for r in rows]


def job_count_by_state(conn: Connection) -> dict[str, int]:
    rows = conn.execute(select(jobs.c.state, func.count()).group_by(jobs.c.state)).all()
    return {state: count for state, count in rows}


LIVE = (J.QUEUED, J.SCHEDULED, J.RUNNING, J.PARKED, J.QUARANTINED)
"""The states a job waits or runs in: few beside the finished ones, which are never counted
here (a count of them would scan the table)."""


def job_count_live(conn: Connection) -> dict[tuple[str, str], int]:
    """How many jobs are in each LIVE state, by (state, queue); through ix_jobs_state, so
    the finished jobs, however many, are never read."""
    rows = conn.execute(
        select(jobs.c.state, jobs.c.queue, func.count())
        .where(jobs.c.state.in_([s.value for s in LIVE]))
        .group_by(jobs.c.state, jobs.c.queue)
    ).all()
    return {(state, queue): count for state, queue, count in rows}


def analyze(conn: Connection) -> None:
    """Refresh the planner's statistics (after a bulk load)."""
    conn.exec_driver_sql("ANALYZE")


def job_record(
    conn: Connection, *, job_id: int
) -> tuple[model.Job, list[model.Attempt], list[model.Event], dict[int, launching.RunLog]]:
    """A job, its attempts, its events and its run logs (what a job's page shows), on one
    connection; NotFound if there is no such job."""
    return (
        job_get(conn, job_id=job_id),
        attempts_.attempt_list(conn, job_id=job_id),
        event_list(conn, job_id=job_id),
        runlogs.run_logs_of(conn, job_id=job_id),
    )


# --- the handle ----------------------------------------------------------------------------


class Jobs:
    """The store's handle on jobs (`store.jobs`): submit, claim, cancel and the reads,
    each call one transaction (the claim, on PostgreSQL, one statement of the hot path).

    Each method runs the store function its name shortens (`get`: job_get),
    named in its body; that function's docstring says what the call does.
    """

    def __init__(self, db: Database) -> None:
        self._db = db

    async def submit(
        self,
        *,
        new: Sequence[model.NewJob],
        now: datetime,
        audit: Callable[[list[tuple[int, bool]]], Iterable[Mapping[str, Any]]] | None = None,
        since: datetime | None = None,
        limits: Mapping[str, quotas.Limits] | None = None,
    ) -> list[tuple[int, bool]]:
        """Store jobs (job_submit); with `audit`, the audit rows it makes of what was stored
        are written in the same transaction; with `limits` (a tenant's submit), held to
        those tenants' quotas, all or nothing (store.quotas.jobs_held). Python tasks' jobs
        that no worker live `since` then reads are parked at once (a job left queued by a
        crash in between is parked by the reconciler's pass)."""
        write: Callable[[Connection], list[tuple[int, bool]]] = functools.partial(
            job_submit, new=new, now=now
        )
        if audit is not None:
            write = functools.partial(tokens.job_submit_audited, new=new, now=now, audit=audit)
        if limits:
            write = functools.partial(holds.jobs_held, write=write, new=new, limits=limits, now=now)
        made = await self._db.tx(write)
        tasks = [
            job_id
            for (job_id, created), job in zip(made, new, strict=True)
            if created and job.executor == python_tasks.PYTHON
        ]
        if tasks and since is not None:
            park = functools.partial(parking.jobs_park_unread, now=now, since=since, job_ids=tasks)
            await self._db.tx(park)
        return made

    async def claim(
        self,
        *,
        now: datetime,
        limit: int,
        executors: Sequence[str],
        limits: claims.DefaultLimits | None = None,
        pools: Mapping[str, int] | None = None,
        tenants: Mapping[str, int] | None = None,
        weights: shares.Weights | None = None,
    ) -> list[model.Claimed]:
        """Claim due jobs, shared across tenants by `weights` (claims.job_claim); without
        pools or tenants' running jobs to count, the hot path (hotpath.py): one statement
        on PostgreSQL."""
        weights = weights or shares.Weights()
        if not pools and not tenants:
            return await self._claim_hot(
                now=now, limit=limit, executors=executors, limits=limits, weights=weights
            )
        claim = functools.partial(
            claims.job_claim,
            now=now,
            limit=limit,
            executors=executors,
            limits=limits,
            pools=pools,
            tenants=tenants,
            weights=weights,
        )
        return await self._db.tx(claim)

    async def record(
        self, *, job_id: int
    ) -> tuple[model.Job, list[model.Attempt], list[model.Event], dict[int, launching.RunLog]]:
        """A job, its attempts, its events and its run logs (what a job's page shows), read
        in one call on one connection; NotFound if there is no such job."""
        return await self._db.hot_read(
            functools.partial(job_record, job_id=job_id),
            functools.partial(hotreads.job_record, job_id=job_id),
        )

    async def _claim_hot(
        self,
        *,
        now: datetime,
        limit: int,
        executors: Sequence[str],
        limits: claims.DefaultLimits | None,
        weights: shares.Weights,
    ) -> list[model.Claimed]:
        deadline = None if limits is None else limits.attempt_deadline.total_seconds()
        lease = None if limits is None else limits.lease_timeout.total_seconds()
        return await self._db.hot(
            functools.partial(
                hotpath.SQLITE.claim,
                now=now,
                limit=limit,
                executors=executors,
                deadline=deadline,
                lease=lease,
                weights=weights,
            ),
            functools.partial(
                hotpath.POSTGRESQL.claim,
                now=now,
                limit=limit,
                executors=executors,
                deadline=deadline,
                lease=lease,
                weights=weights,
            ),
        )

    async def count_capped(self, *, tenant: str | None) -> dict[str, tuple[int, bool]]:
        from corral.store import overview as overview_  # it imports this module's reads

        return await self._db.lookup(functools.partial(overview_.job_count_capped, tenant=tenant))

    async def ends_counted(
        self, *, tenant: str | None, since: datetime, width: timedelta, buckets: int
    ) -> list[tuple[int, int]]:
        from corral.store import overview as overview_

        ends = functools.partial(
            overview_.job_ends_counted, tenant=tenant, since=since, width=width, buckets=buckets
        )
        return await self._db.lookup(ends)

    async def overview(
        self,
        *,
        tenant: str | None,
        spans: Sequence[overview_.Span],
        quarantined: int,
        pools: Sequence[str] = (),
        budgets: bool = False,
    ) -> overview_.Overview:
        """The dashboard's overview, its statements on one connection in one call."""
        from corral.store import overview as overview_

        read = functools.partial(
            overview_.overview_read,
            tenant=tenant,
            spans=spans,
            quarantined=quarantined,
            pools=pools,
            budgets=budgets,
        )
        return await self._db.lookup(read)

    async def claim_plan(self, *, now: datetime, limit: int, executors: Sequence[str]) -> list[str]:
        return await self._db.tx(
            functools.partial(claims.job_claim_plan, now=now, limit=limit, executors=executors)
        )

    async def pool_running(
        self, *, pools: Sequence[str], tenant: str | None = None
    ) -> dict[str, int]:
        return await self._db.tx(
            functools.partial(claim_caps.pool_running, pools=pools, tenant=tenant)
        )

    async def cancel(self, *, job_id: int, now: datetime, reason: str) -> model.Attempt | None:
        return await self._db.tx(
            functools.partial(job_cancel, job_id=job_id, now=now, reason=reason)
        )

    async def unquarantine(
        self, *, job_id: int, to: model.JobState, now: datetime, reason: str
    ) -> None:
        await self._db.tx(
            functools.partial(job_unquarantine, job_id=job_id, to=to, now=now, reason=reason)
        )

    async def get_many(self, *, job_ids: Sequence[int]) -> list[model.Job]:
        return await self._db.read(functools.partial(job_get_many, job_ids=job_ids))

    async def get(self, *, job_id: int) -> model.Job:
        return await self._db.lookup(functools.partial(job_get, job_id=job_id))

    async def count_by_state(self) -> dict[str, int]:
        return await self._db.tx(job_count_by_state)

    async def count_live(self) -> dict[tuple[str, str], int]:
        """Jobs in each live state (LIVE), by (state, queue): /metrics."""
        return await self._db.lookup(job_count_live)

    async def budgets(self) -> dict[str, retry.Bucket]:
        """Every queue's retry budget as stored: /metrics."""
        return await self._db.lookup(budgets.budget_list)

    async def promote_due(self, *, now: datetime, limit: int) -> int:
        return await self._db.tx(functools.partial(claims.jobs_promote_due, now=now, limit=limit))

    async def list(
        self, given: model.JobFilter | None = None, *, limit: int = 100, before: int | None = None
    ) -> list[model.Job]:
        """The newest jobs `given` matches (all jobs without it), ids below `before`
        (job_lists.job_list)."""
        given = given or model.JobFilter()
        return await self._db.hot_read(
            functools.partial(job_lists.job_list, given=given, limit=limit, before=before),
            functools.partial(hotreads.job_list, given=given, limit=limit, before=before),
        )

    async def page(
        self, given: model.JobFilter, *, limit: int = 100, before: int | None = None
    ) -> job_lists.Page:
        """A page of the job list with the last run of each of its jobs, and where to read
        on (job_lists.job_page): on PostgreSQL two statements (more for a URL search that
        left jobs out) on one connection."""
        return await self._db.hot_read(
            functools.partial(job_lists.job_page, given=given, limit=limit, before=before),
            functools.partial(hotreads.job_page, given=given, limit=limit, before=before),
        )
