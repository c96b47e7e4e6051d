"""What the dashboard's overview reads of the jobs: how many are in each state, with the
work bounded however large the table is (never a full count), and how many ended well or
badly in each minute or hour of a recent window.

Each state is counted over its newest COUNT_CAP + 1 rows of ix_jobs_state at most: below
that the count is exact; past it the count is a floor, and says so (`more`). Job ends are
counted from the events of the window only, read through ix_events_job_ends (the job ends,
in time order), so a chart's cost grows with the window's ends, not with the table.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import Connection, case, func, literal, select, union_all

from corral import model
from corral.store import dialects
from corral.store.tables import JOB_ENDS, events, jobs

COUNT_CAP = 1_000
"""The most jobs of one state an overview counts; past it, it shows "1,000+"."""


def job_count_capped(
    conn: Connection, *, tenant: str | None, cap: int = COUNT_CAP
) -> dict[str, tuple[int, bool]]:
    """For each job state: (jobs counted, whether there are more than that), of `tenant`'s
    jobs (None: every tenant's), up to `cap`, in one statement. Each count reads at most
    `cap` + 1 entries of an index (ix_jobs_state, ix_jobs_tenant_state) and no row."""
    counts = []
    for state in model.JobState:
        newest = select(jobs.c.id).where(jobs.c.state == state.value)
        if tenant is not None:
            newest = newest.where(jobs.c.tenant == tenant)
        capped = newest.order_by(jobs.c.id.desc()).limit(cap + 1).subquery()
        counts.append(select(literal(state.value), func.count()).select_from(capped))
    return {
        state: (min(int(seen), cap), seen > cap) for state, seen in conn.execute(union_all(*counts))
    }


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
