"""Quotas per tenant in the store: a tenant's waiting jobs and its schedules counted, and
its submit_rate bucket (tenant_buckets) held, taken from and kept, inside the transaction
of the write they limit, so a refused write leaves nothing behind, not even a token taken.

The first statement of such a write holds the tenant's bucket row (INSERT .. ON CONFLICT
DO UPDATE, which locks it on PostgreSQL), so two API replicas' writes for one tenant take
turns: the second counts the jobs the first made and takes from what it left. SQLite has
one writer at a time. What a count or a bucket allows is corral.quotas' decision, on the
caller's time. A write that no quota holds (the operator's) runs none of this.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar

from sqlalchemy import Connection, func, select, text, update

from corral import model, quotas, scheduling, tenancy
from corral.planning import Plan
from corral.store import dialects
from corral.store.tables import jobs, schedules, tenant_buckets

if TYPE_CHECKING:
    from corral.store.database import Database

T = TypeVar("T")
F = scheduling.FiringOutcome
Made = list[tuple[int, bool]]


CALLBACKS_WAITING = text("callback_of IS NOT NULL AND state IN ('queued', 'scheduled', 'parked')")
"""The predicate of ix_jobs_callbacks_waiting (indexes.py): callback jobs that wait, which
no quota counts (corral.callbacks). Said as written here, so SQLite uses the index."""


def jobs_waiting(conn: Connection, *, tenants: Sequence[str]) -> dict[str, int]:
    """How many jobs of each of `tenants` wait (queued, scheduled or parked), read from
    ix_jobs_tenant_state (tenant, state, id) alone, less its callback jobs that wait (read
    from ix_jobs_callbacks_waiting): a callback is counted by no quota."""
    if not tenants:
        return {}
    rows = conn.execute(
        select(jobs.c.tenant, func.count())
        .where(
            jobs.c.tenant.in_(list(tenants)), jobs.c.state.in_([s.value for s in quotas.WAITING])
        )
        .group_by(jobs.c.tenant)
    )
    counts = {tenant: count for tenant, count in rows}
    callbacks = conn.execute(
        select(jobs.c.tenant, func.count())
        .where(jobs.c.tenant.in_(list(counts)), CALLBACKS_WAITING)
        .group_by(jobs.c.tenant)
    )
    for tenant, count in callbacks:
        counts[tenant] -= count
    return {tenant: count for tenant, count in counts.items() if count}


def tenant_schedules(conn: Connection, *, tenant: str) -> int:
    """How many schedules `tenant` has."""
    return conn.execute(select(func.count()).where(schedules.c.tenant == tenant)).scalar_one()


def bucket_hold(conn: Connection, *, quota: quotas.Limits, now: datetime) -> quotas.Bucket:
    """The tenant's bucket at `now`, its row held until the transaction ends (made full
    where there is none): every other write for the tenant waits for this one."""
    stmt = dialects.upsert(conn, tenant_buckets).values(
        tenant=quota.tenant, tokens=float(quota.submit_rate), filled_at=now
    )
    stmt = stmt.on_conflict_do_update(
        index_elements=[tenant_buckets.c.tenant], set_={"tenant": stmt.excluded.tenant}
    ).returning(tenant_buckets.c.tokens, tenant_buckets.c.filled_at)
    tokens, at = conn.execute(stmt).one()
    return quotas.refilled(quota, quotas.Bucket(tokens, at), now)


def bucket_keep(conn: Connection, *, tenant: str, bucket: quotas.Bucket) -> None:
    """Write the tenant's bucket as it is after a write took from it."""
    conn.execute(
        update(tenant_buckets)
        .where(tenant_buckets.c.tenant == tenant)
        .values(tokens=bucket.tokens, filled_at=bucket.at)
    )


def held_to(
    conn: Connection,
    *,
    limits: Mapping[str, quotas.Limits],
    now: datetime,
    write: Callable[[Connection], T],
    created: Callable[[T], Counter[str]],
) -> T:
    """`write(conn)` as a tenant's write of jobs: each tenant of `limits` (its buckets held
    first, in name order) is held to its max_queued and its submit_rate by the jobs the
    write made (`created(result)`, by tenant). A quota broken raises QuotaExceeded (or
    RateLimited), and with it the transaction keeps nothing: all or nothing."""
    held = {t: bucket_hold(conn, quota=limits[t], now=now) for t in sorted(limits)}
    done = write(conn)
    made = created(done)
    waiting = jobs_waiting(conn, tenants=[t for t in held if made[t]])
    for tenant, bucket in held.items():
        if not made[tenant]:
            continue
        quota = limits[tenant]
        quotas.check_queued(quota, waiting=waiting.get(tenant, 0), created=made[tenant])
        bucket_keep(conn, tenant=tenant, bucket=quotas.taken(quota, bucket, made[tenant]))
    return done


def jobs_held(
    conn: Connection,
    *,
    write: Callable[[Connection], Made],
    new: Sequence[model.NewJob],
    limits: Mapping[str, quotas.Limits],
    now: datetime,
) -> Made:
    """`write` (a submit of `new`) held to the quotas of `limits`' tenants (`held_to`):
    the jobs it created count, not those an idempotency key found."""

    def created(made: Made) -> Counter[str]:
        return Counter(job.tenant for job, (_, fresh) in zip(new, made, strict=True) if fresh)

    return held_to(conn, limits=limits, now=now, write=write, created=created)


def schedule_held(
    conn: Connection, *, quota: quotas.Limits, now: datetime, write: Callable[[Connection], T]
) -> T:
    """`write` (a new schedule of the tenant's) unless the tenant has max_schedules already:
    QuotaExceeded. Its bucket is held (no token taken), so two makes take turns."""
    bucket_hold(conn, quota=quota, now=now)
    quotas.check_schedules(quota, count=tenant_schedules(conn, tenant=quota.tenant))
    return write(conn)


# --- firings ------------------------------------------------------------------------------------

Planned = list[tuple[scheduling.Schedule, Plan]]


def firings_admitted(
    conn: Connection,
    planned: Planned,
    *,
    tenants: Mapping[str, tenancy.TenantSettings],
    now: datetime,
) -> Planned:
    """`planned` with the firings of tenants' schedules that would break their tenant's
    max_queued or submit_rate refused instead, each noting the quota: a tenant's firings
    count and take tokens as its submits do, in the order planned. The operator's
    schedules are held to nothing."""
    want = Counter(s.tenant for s, p in planned if s.tenant_made for f in p.fires if f.job)
    if not want:
        return planned
    limits = {t: quotas.limits(tenants, t) for t in sorted(want)}
    held = {t: bucket_hold(conn, quota=q, now=now) for t, q in limits.items()}
    waiting = jobs_waiting(conn, tenants=list(limits))
    admitted = {}
    for tenant, quota in limits.items():
        admitted[tenant] = quotas.admitted(
            quota, waiting=waiting.get(tenant, 0), bucket=held[tenant], want=want[tenant]
        )
        if admitted[tenant].count:
            bucket_keep(conn, tenant=tenant, bucket=admitted[tenant].bucket)
    return _refused_past(planned, admitted)


def _refused_past(planned: Planned, admitted: Mapping[str, quotas.Admitted]) -> Planned:
    """`planned` with each tenant's firings past its admitted count refused (no job, the
    quota noted); a plan left with no job cancels no previous one (overlap replace)."""
    left = {tenant: a.count for tenant, a in admitted.items()}
    out: Planned = []
    for schedule, plan in planned:
        if not schedule.tenant_made or schedule.tenant not in admitted:
            out.append((schedule, plan))
            continue
        said = admitted[schedule.tenant]
        fires = []
        for f in plan.fires:
            if f.job is not None and left[schedule.tenant] <= 0:
                f = scheduling.Fire(f.nominal_at, F.REFUSED, note=said.why, quota=said.quota)
            elif f.job is not None:
                left[schedule.tenant] -= 1
            fires.append(f)
        cancel = plan.cancel_previous and any(f.job is not None for f in fires)
        out.append((schedule, replace(plan, fires=fires, cancel_previous=cancel)))
    return out


# --- the handle ----------------------------------------------------------------------------


class Quotas:
    """The store's handle on what tenants' quotas count (`store.quotas`): the reads the
    operator's warnings need. The writes a quota holds are the handles' of what they write
    (store.jobs.submit, store.schedules.create and .backfill, with their quotas given)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def waiting(self, *, tenants: Sequence[str]) -> dict[str, int]:
        return await self._db.lookup(functools.partial(jobs_waiting, tenants=tenants))

    async def schedules(self, *, tenant: str) -> int:
        return await self._db.lookup(functools.partial(tenant_schedules, tenant=tenant))
