"""The claim: due jobs move queued -> running and each gets a new attempt (its id the
fence) in `launching`, with one event each, in one transaction.

Due jobs are queued ones and `scheduled` ones whose run_at has come (`corral submit
--at/--delay`): a claim picks from both (store/picks.py, fairly across tenants) and moves
the scheduled ones it takes to queued first, each with its "its time came" event, so a job
waiting for its time needs no scheduler, only a dispatcher (or a worker) that could run
it. The scheduler moves due jobs too, for the executors no dispatcher claims now."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, select, update

from corral import model, policy, shares
from corral.store import dialects, picks, statements
from corral.store import shares as shares_store
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
    weights: shares.Weights | None = None,
    also: Sequence[Any] = (),
) -> list[model.Claimed]:
    """Claim up to `limit` due jobs, in fair shares across tenants by `weights` and within
    the caps of `pools` and `tenants` (store/picks.py), and create their attempts in
    `launching`. `also`: more conditions a job must meet (a worker's tasks and queues).

    One transaction: the jobs move queued -> running (compare-and-set), each gets a new
    attempt whose id is its fence, and one event per job records the claim. The scheduled
    jobs picked are queued first, each with its event. Claims that count running jobs take
    turns (PostgreSQL: one transaction-scoped lock), so two dispatchers cannot both fill
    the last slot.
    """
    model.check_transition("job", J.QUEUED, J.RUNNING)
    ask = picks.Ask(now, limit, executors, weights or shares.Weights(), also)
    caps = picks.caps_of(pools, tenants)
    if caps is not None:
        dialects.take_turns(conn, "corral.pools")
        caps.count(conn)
    picked = picks.fair_pick(conn, ask, caps)
    if not picked.claim:
        return []
    jobs_promote(conn, ids=picked.promote, now=now)
    return jobs_claim(conn, ids=picked.claim, now=now, limits=limits)


def jobs_claim(
    conn: Connection, *, ids: Sequence[int], now: datetime, limits: DefaultLimits | None
) -> list[model.Claimed]:
    """Move the jobs of `ids` still queued to running, each with a new attempt in
    `launching` and its claim's run-log line (the pick is the caller's: job_claim's, or
    the flow claim's); most urgent first."""
    if not ids:
        return []
    stmt = _claim_update(dialects.one_of(conn, jobs.c.id, ids), now)
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
    """The database's plan for the claim's pick of the first tenant waiting's queued jobs,
    one line a step (nothing is claimed)."""
    waiting = shares_store.tenants_waiting(conn) or [""]
    pick = picks.queued_pick(picks.Ask(now, limit, executors, shares.Weights()), waiting[0])
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
