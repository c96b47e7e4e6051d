"""What the dashboard's overview reads of the jobs: how many are in each state, with the
work bounded however large the table is (never a full count).

Each state is counted over its newest COUNT_CAP + 1 rows of ix_jobs_state at most: below
that the count is exact; past it the count is a floor, and says so (`more`).
"""

from __future__ import annotations

from sqlalchemy import Connection, case, func, literal, select

from corral import model
from corral.store.tables import jobs

COUNT_CAP = 10_000
"""The most jobs of one state an overview counts; past it, it shows "10,000+"."""


def job_count_capped(
    conn: Connection, *, tenant: str | None, cap: int = COUNT_CAP
) -> dict[str, tuple[int, bool]]:
    """For each job state: (jobs counted, whether there are more than that), of `tenant`'s
    jobs (None: every tenant's) among the state's newest `cap` + 1."""
    counted: dict[str, tuple[int, bool]] = {}
    for state in model.JobState:
        newest = (  # every tenant's: the index alone answers (no row is read)
            select(jobs.c.id if tenant is None else jobs.c.tenant)
            .where(jobs.c.state == state.value)
            .order_by(jobs.c.id.desc())
            .limit(cap + 1)
            .subquery()
        )
        mine = literal(1) if tenant is None else case((newest.c[0] == tenant, 1), else_=0)
        seen, found = conn.execute(
            select(func.count(), func.coalesce(func.sum(mine), 0)).select_from(newest)
        ).one()
        more = seen > cap
        counted[state.value] = (min(int(found), cap) if tenant is None else int(found), more)
    return counted
