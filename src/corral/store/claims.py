"""The claim: due jobs move queued -> running and each gets a new attempt (its id the
fence) in `launching`, with one event each, in one transaction.

Due jobs are queued ones and `scheduled` ones whose run_at has come (`corral submit
--at/--delay`): a claim first moves up to its limit of those to queued, oldest first, each
with its "its time came" event, then picks, so a job waiting for its time needs no
scheduler, only a dispatcher (or a worker) that could run it. The scheduler moves due jobs
too, for the executors no dispatcher claims now."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Select, func, or_, select, true, update

from corral import model, policy
from corral.store import dialects, statements
from corral.store.events import event_insert, event_row, transition
from corral.store.rows import job_from_row, state_is
from corral.store.tables import (
    attempts,
    jobs,
)

A, J = model.AttemptState, model.JobState
TIME_CAME = "its time came"
"""The run log's reason when a scheduled job's run_at comes and it is queued."""


@dataclass(frozen=True, slots=True)
class DefaultLimits:
    """The time limits an attempt gets at its claim when its job sets none of its own."""

    attempt_deadline: timedelta
    lease_timeout: timedelta


def job_claim(
    conn: Connection,
    *,
    now: datetime,
    limit: int,
    executors: Sequence[str],
    limits: DefaultLimits | None = None,
    pools: Mapping[str, int] | None = None,
    tenants: Mapping[str, int] | None = None,
    also: Sequence[Any] = (),
) -> list[model.Claimed]:
    """Claim up to `limit` due jobs (most urgent first) and create their attempts in `launching`.
    `also`: more conditions a job must meet (a worker's tasks and queues).

    One transaction: the jobs move queued -> running (compare-and-set), each gets a new
    attempt whose id is its fence, and one event per job records the claim. This is the one
    state change that does not go through `transition`: it picks and moves the rows in a
    single statement, so PostgreSQL runs the pick once under SKIP LOCKED. It checks the same
    transition table and writes its events in the same transaction.
    """
    model.check_transition("job", J.QUEUED, J.RUNNING)
    jobs_promote_due(conn, now=now, limit=limit, where=[jobs.c.executor.in_(executors), *also])
    if pools or tenants:
        ids = _claim_pick_capped(
            conn,
            now=now,
            limit=limit,
            executors=executors,
            caps=_Caps(pools or {}, tenants or {}),
            also=also,
        )
        stmt = _claim_update(dialects.one_of(conn, jobs.c.id, ids), now)
    else:
        stmt = _claim_statement(conn, now=now, limit=limit, executors=executors, also=also)
    claimed_jobs = sorted((job_from_row(r) for r in conn.execute(stmt)), key=urgency)
    if not claimed_jobs:
        return []
    return _attempts_make(conn, claimed_jobs, now, limits)


def _attempts_make(
    conn: Connection, claimed_jobs: Sequence[model.Job], now: datetime, limits: DefaultLimits | None
) -> list[model.Claimed]:
    """The claimed jobs' attempts in `launching`, each with its claim's run-log line."""
    rows = [_attempt_row(job, now, limits) for job in claimed_jobs]
    # Each claimed job gets one attempt, so the job id maps fences back to rows. (Asking for
    # rows in parameter order would make SQLite insert them one statement at a time.)
    fences = dict(dialects.insert_many(conn, attempts, rows, returning=["job_id", "id"]))
    claimed = [
        model.Claimed(job, _new_attempt(row, fences[job.id]))
        for job, row in zip(claimed_jobs, rows, strict=True)
    ]
    event_insert(
        conn,
        [
            event_row(
                job_id=c.job.id,
                attempt_id=c.attempt.id,
                entity="job",
                frm=J.QUEUED,
                to=J.RUNNING,
                reason=statements.claimed(c.attempt.attempt_no),
                now=now,
                details={"launch_name": c.attempt.launch_name},
            )
            for c in claimed
        ],
    )
    return claimed


def jobs_promote_due(
    conn: Connection, *, now: datetime, limit: int, where: Sequence[Any] = ()
) -> int:
    """Move up to `limit` jobs in `scheduled` whose time has come (and that meet `where`)
    to `queued`, the longest due first, skipping rows another transaction holds."""
    ids = conn.execute(
        dialects.skip_locked(
            conn,
            select(jobs.c.id)
            .where(jobs.c.state == state_is(J.SCHEDULED), jobs.c.run_at <= now, *where)
            .order_by(jobs.c.run_at, jobs.c.id)
            .limit(limit),
        )
    ).scalars()
    return len(jobs_promote(conn, ids=list(ids), now=now))


def jobs_promote(conn: Connection, *, ids: Sequence[int], now: datetime) -> list[int]:
    """Move the jobs of `ids` still in `scheduled` to `queued`, each with its event; the
    ids moved."""
    moved = transition(
        conn, entity="job", ids=ids, expected=J.SCHEDULED, to=J.QUEUED, now=now, reason=TIME_CAME
    )
    return [row.id for row in moved]


def _claim_pick(
    conn: Connection,
    *,
    now: datetime,
    limit: int,
    executors: Sequence[str],
    where: Sequence[Any] = (),
    columns: Sequence[Any] = (jobs.c.id,),
) -> Select[Any]:
    """The due jobs a claim takes: most urgent first, at most `limit`, skipping locked rows."""
    due = (
        select(*columns)
        .where(
            jobs.c.state == state_is(J.QUEUED),
            jobs.c.run_at <= now,
            jobs.c.executor.in_(executors),
            *where,
        )
        .order_by(jobs.c.priority.desc(), jobs.c.run_at, jobs.c.id)
        .limit(limit)
    )
    return dialects.skip_locked(conn, due)


class _Caps:
    """The room pools and tenants have left, taken one job at a time."""

    def __init__(self, pools: Mapping[str, int], tenants: Mapping[str, int]) -> None:
        self.pools, self.tenants = pools, tenants
        self.pool_room: dict[str | None, int] = {}
        self.tenant_room: dict[str, int] = {}

    def count(self, conn: Connection) -> None:
        """Read how many jobs of each capped pool and tenant run now."""
        in_pools = pool_running(conn, pools=list(self.pools))
        of_tenants = tenant_running(conn, tenants=list(self.tenants))
        self.pool_room = {p: n - in_pools.get(p, 0) for p, n in self.pools.items()}
        self.tenant_room = {t: n - of_tenants.get(t, 0) for t, n in self.tenants.items()}

    def groups(self, limit: int) -> list[tuple[Any, Any, int]]:
        """(pool condition, tenant condition, most jobs) for each pool with free slots (and
        the jobs of no capped pool) and each tenant capped (and the rest together)."""
        pools, tenants = list(self.pools), list(self.tenants)
        by_pool: list[tuple[Any, int]] = [
            (or_(jobs.c.pool.is_(None), jobs.c.pool.not_in(pools)) if pools else true(), limit)
        ]
        by_pool += [
            (jobs.c.pool == p, min(r, limit)) for p, r in sorted(self.pool_room.items()) if r > 0
        ]
        by_tenant: list[tuple[Any, int]] = [
            (jobs.c.tenant.not_in(tenants) if tenants else true(), limit)
        ]
        by_tenant += [
            (jobs.c.tenant == t, min(r, limit))
            for t, r in sorted(self.tenant_room.items())
            if r > 0
        ]
        return [(p, t, min(pn, tn)) for p, pn in by_pool for t, tn in by_tenant]

    def take(self, pool: str | None, tenant: str) -> bool:
        """Whether a job of `pool` and `tenant` fits, counting it in when it does."""
        if self.pool_room.get(pool, 1) <= 0 or self.tenant_room.get(tenant, 1) <= 0:
            return False
        if pool in self.pool_room:
            self.pool_room[pool] -= 1
        if tenant in self.tenant_room:
            self.tenant_room[tenant] -= 1
        return True


def _claim_pick_capped(
    conn: Connection,
    *,
    now: datetime,
    limit: int,
    executors: Sequence[str],
    caps: _Caps,
    also: Sequence[Any] = (),
) -> list[int]:
    """The claim's pick when pools or tenants cap concurrency: per tenant capped (and the
    rest together) and per pool with free slots (and the jobs of no capped pool), the most
    urgent jobs, at most the free slots of both; then, most urgent first, each taken while
    its pool and its tenant have room, up to `limit`. Claims that count running jobs take
    turns (PostgreSQL: one transaction-scoped lock), so two dispatchers cannot both fill
    the last slot."""
    dialects.take_turns(conn, "corral.pools")
    caps.count(conn)
    columns = (jobs.c.id, jobs.c.priority, jobs.c.run_at, jobs.c.pool, jobs.c.tenant)
    found: list[Any] = []
    for in_pool, in_tenant, most in caps.groups(limit):
        stmt = _claim_pick(
            conn,
            now=now,
            limit=most,
            executors=executors,
            where=[in_pool, in_tenant, *also],
            columns=columns,
        )
        found += conn.execute(stmt).all()
    found.sort(key=lambda r: (-r.priority, r.run_at, r.id))
    taken: list[int] = []
    for r in found:
        if len(taken) >= limit:
            break
        if caps.take(r.pool, r.tenant):
            taken.append(r.id)
    return taken


def pool_running(
    conn: Connection, *, pools: Sequence[str], tenant: str | None = None
) -> dict[str, int]:
    """How many jobs of each pool are running now (of `tenant` only, when given)."""
    if not pools:
        return {}
    stmt = (
        select(jobs.c.pool, func.count())
        .where(jobs.c.state == state_is(J.RUNNING), jobs.c.pool.in_(list(pools)))
        .group_by(jobs.c.pool)
    )
    if tenant is not None:
        stmt = stmt.where(jobs.c.tenant == tenant)
    return {pool: count for pool, count in conn.execute(stmt)}


def tenant_running(conn: Connection, *, tenants: Sequence[str]) -> dict[str, int]:
    """How many jobs of each tenant are running now."""
    if not tenants:
        return {}
    stmt = (
        select(jobs.c.tenant, func.count())
        .where(jobs.c.state == state_is(J.RUNNING), jobs.c.tenant.in_(list(tenants)))
        .group_by(jobs.c.tenant)
    )
    return {tenant: count for tenant, count in conn.execute(stmt)}


def _claim_statement(
    conn: Connection,
    *,
    now: datetime,
    limit: int,
    executors: Sequence[str],
    also: Sequence[Any] = (),
) -> Any:
    # A materialised CTE runs the pick exactly once. As a plain IN (subquery), PostgreSQL may
    # run it again per row, and with SKIP LOCKED each run can pick other rows: more than
    # `limit` jobs would be claimed.
    picked = (
        _claim_pick(conn, now=now, limit=limit, executors=executors, where=also)
        .cte("due")
        .prefix_with("MATERIALIZED")
    )
    return _claim_update(jobs.c.id.in_(select(picked.c.id)), now)


def _claim_update(picked: Any, now: datetime) -> Any:
    return (
        update(jobs)
        .where(picked, jobs.c.state == J.QUEUED)
        .values(state=J.RUNNING, attempt_count=jobs.c.attempt_count + 1, updated_at=now)
        .returning(*jobs.c)
    )


def job_claim_plan(
    conn: Connection, *, now: datetime, limit: int, executors: Sequence[str]
) -> list[str]:
    """The database's plan for the claim's pick, one line a step (nothing is claimed)."""
    pick = _claim_pick(conn, now=now, limit=limit, executors=executors)
    return [str(row[-1]) for row in conn.execute(dialects.Explain(pick))]


def _new_attempt(row: Mapping[str, Any], fence: int) -> model.Attempt:
    return model.Attempt(
        id=fence,
        started_at=None,
        finished_at=None,
        exit_code=None,
        reason=None,
        last_seen_at=None,
        **{**row, "state": A(row["state"])},
    )


def urgency(job: model.Job) -> tuple[int, datetime, int]:
    return (-job.priority, job.run_at, job.id)


def attempt_limits(
    policy_stored: Mapping[str, Any], now: datetime, limits: DefaultLimits | None
) -> tuple[datetime | None, datetime | None, float | None]:
    """A new attempt's deadline, lease end and lease length: its deadline is fixed now, from
    the job's own limit or the default; a job that sends heartbeats owes its first one within
    its lease. All None without `limits`."""
    if limits is None:
        return None, None, None
    own = policy.JobPolicy.read(policy_stored)
    deadline_at = now + (own.limits.attempt_deadline or limits.attempt_deadline)
    if not own.heartbeat:
        return deadline_at, None, None
    lease = own.limits.lease_timeout or limits.lease_timeout
    return deadline_at, now + lease, lease.total_seconds()


def _attempt_row(job: model.Job, now: datetime, limits: DefaultLimits | None) -> dict[str, Any]:
    """A new attempt, in `launching`, with its limits (attempt_limits)."""
    deadline_at, lease_until, lease_seconds = attempt_limits(job.policy, now, limits)
    return {
        "job_id": job.id,
        "attempt_no": job.attempt_count,
        "launch_name": model.launch_name(job.id, job.attempt_count),
        "executor": job.executor,
        "state": A.LAUNCHING,
        "created_at": now,
        "updated_at": now,
        "deadline_at": deadline_at,
        "lease_until": lease_until,
        "lease_seconds": lease_seconds,
    }
