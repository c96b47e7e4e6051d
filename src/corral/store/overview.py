"""What the dashboard's overview reads of the jobs: how many are in each state, with the
work bounded however large the table is (never a full count), how many ended well or
badly in each minute or hour of a recent window, and the rest of the page (the newest
quarantined jobs, failing schedules, pools in use, retry budgets), all in one call
(`overview_read`) on one connection.

Each state is counted over its newest COUNT_CAP + 1 rows of ix_jobs_state at most: below
that the count is exact; past it the count is a floor, and says so (`more`). Job ends are
counted from the events of the window only, read through ix_events_job_ends (the job ends,
in time order), so a chart's cost grows with the window's ends, not with the table.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import CompoundSelect, Connection, bindparam, case, func, literal, select, union_all

from corral import model, retry, scheduling
from corral.store import dialects
from corral.store.budgets import budget_list
from corral.store.caps import pool_running
from corral.store.job_lists import job_list
from corral.store.jobs import job_get_many
from corral.store.rows import schedule_from_row
from corral.store.tables import JOB_ENDS, events, jobs, schedules

J = model.JobState

COUNT_CAP = 1_000
"""The most jobs of one state an overview counts; past it, it shows "1,000+"."""


def job_count_capped(
    conn: Connection, *, tenant: str | None, cap: int = COUNT_CAP
) -> dict[str, tuple[int, bool]]:
    """For each job state: (jobs counted, whether there are more than that), of `tenant`'s
    jobs (None: every tenant's), up to `cap`, in one statement. Each count reads at most
    `cap` + 1 entries of an index (ix_jobs_state, ix_jobs_tenant_state) and no row."""
    stmt = _count_capped(tenant is not None, cap)
    return {
        state: (min(int(seen), cap), seen > cap)
        for state, seen in conn.execute(stmt, {} if tenant is None else {"tenant": tenant})
    }


@functools.cache
def _count_capped(of_tenant: bool, cap: int) -> CompoundSelect[str, int]:
    """The counting statement, built once (a union of eight is slow to build): the tenant
    is its parameter."""
    counts = []
    for state in model.JobState:
        newest = select(jobs.c.id).where(jobs.c.state == state.value)
        if of_tenant:
            newest = newest.where(jobs.c.tenant == bindparam("tenant"))
        capped = newest.order_by(jobs.c.id.desc()).limit(cap + 1).subquery()
        counts.append(select(literal(state.value), func.count()).select_from(capped))
    return union_all(*counts)


def job_ends_counted(
    conn: Connection, *, tenant: str | None, since: datetime, width: timedelta, buckets: int
) -> list[tuple[int, int]]:
    """For each of `buckets` spans `width` long from `since`: (jobs that succeeded, jobs
    that failed or were quarantined) then, of `tenant` (None: every tenant), counted from
    the events that moved them there (a job retried and ending again counts again)."""
    until = since + width * buckets
    ends = (
        select(
            dialects.bucket_of(conn, events.c.at, since, width).label("bucket"),
            events.c.to_state,
        )
        .where(JOB_ENDS, events.c.at >= since, events.c.at < until)
    )  # fmt: skip
    if tenant is not None:  # each end's job looked up by its id: a join would read every job
        owner = select(jobs.c.tenant).where(jobs.c.id == events.c.job_id).scalar_subquery()
        ends = ends.where(owner == tenant)
    window = ends.subquery()
    good = case((window.c.to_state == model.JobState.SUCCEEDED.value, 1), else_=0)
    counted = [(0, 0)] * buckets
    for bucket, ended, succeeded in conn.execute(
        select(window.c.bucket, func.count(), func.sum(good)).group_by(window.c.bucket)
    ):
        if 0 <= int(bucket) < buckets:
            counted[int(bucket)] = (int(succeeded), int(ended) - int(succeeded))
    return counted


@dataclass(frozen=True, slots=True)
class Span:
    """`buckets` spans `width` long from `since`: what a chart counts job ends over."""

    since: datetime
    width: timedelta
    buckets: int


@dataclass(frozen=True, slots=True)
class Overview:
    """What the overview shows of one tenant (or of every tenant), read at one moment."""

    counts: dict[str, tuple[int, bool]]  # by state: (counted, whether there are more)
    quarantined: list[model.Job]  # the newest first
    ends: list[list[tuple[int, int]]]  # for each span asked: (succeeded, failed) a bucket
    failing: list[tuple[scheduling.Schedule, model.Job]]  # the newest last job first
    running: dict[str, int]  # of each pool asked, its running jobs (of the tenant)
    budgets: dict[str, retry.Bucket]  # each queue's retry budget, when asked


def overview_read(
    conn: Connection,
    *,
    tenant: str | None,
    spans: Sequence[Span],
    quarantined: int,
    pools: Sequence[str],
    budgets: bool,
) -> Overview:
    """The overview of `tenant`'s jobs (None: every tenant's), on one connection: the
    capped counts, the newest `quarantined` quarantined jobs, the job ends of each of
    `spans`, the failing schedules, the running jobs of each of `pools`, and (when
    `budgets`) every queue's retry budget. Each statement stands alone; none reads the
    whole jobs table."""
    return Overview(
        counts=job_count_capped(conn, tenant=tenant),
        quarantined=job_list(
            conn, model.JobFilter(states=(J.QUARANTINED,), tenant=tenant), limit=quarantined
        ),
        ends=[
            job_ends_counted(conn, tenant=tenant, since=s.since, width=s.width, buckets=s.buckets)
            for s in spans
        ],
        failing=schedule_failing(conn, tenant=tenant),
        running=pool_running(conn, pools=pools, tenant=tenant) if pools else {},
        budgets=budget_list(conn) if budgets else {},
    )


def schedule_failing(
    conn: Connection, *, tenant: str | None
) -> list[tuple[scheduling.Schedule, model.Job]]:
    """The schedules (of `tenant`) whose last job failed or waits in quarantine, with that
    job, the newest job first: only those schedules are read, then only their jobs."""
    bad = (
        select(jobs.c.id)
        .where(
            jobs.c.id == schedules.c.last_job_id,
            jobs.c.state.in_([J.FAILED.value, J.QUARANTINED.value]),
        )
        .exists()
    )
    stmt = select(schedules).where(bad)
    if tenant is not None:
        stmt = stmt.where(schedules.c.tenant == tenant)
    found = {s.last_job_id: s for s in map(schedule_from_row, conn.execute(stmt))}
    last = job_get_many(conn, job_ids=sorted(i for i in found if i is not None))
    return [(found[j.id], j) for j in sorted(last, key=lambda j: -j.id)]
