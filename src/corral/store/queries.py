"""Every store operation, as a function of an open connection inside a transaction.

The Store (store/__init__.py) runs these in a worker thread, one transaction each. Time is
always an argument (`now`), never read here. Dialect differences live in dialects.py.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row, Select, and_, func, insert, select, tuple_, update

from corral import errors, model
from corral.store import dialects
from corral.store.tables import attempts, events, jobs

A, J = model.AttemptState, model.JobState


# --- the one transition function ------------------------------------------------------------


def transition(
    conn: Connection,
    *,
    entity: model.Entity,
    ids: Sequence[int],
    expected: str,
    to: str,
    now: datetime,
    reason: str,
    values: Mapping[str, Any] | None = None,
    details: Mapping[str, Any] | None = None,
    attempt_nos: Sequence[int] | None = None,
    attempt_ids: Sequence[int | None] | None = None,
) -> list[int]:
    """Move every row of `ids` from `expected` to `to`, if it is still in `expected`.

    The compare-and-set is in the WHERE clause, so a row that another writer moved first
    is left alone: a lost race returns fewer ids, never an error or a second effect. For
    attempts the id is the fence; for jobs `attempt_nos` (when given) fences the write to
    the job's current attempt. One event is appended per applied row, in the same
    transaction. Returns the ids that changed.
    """
    model.check_transition(entity, expected, to)
    if not ids:
        return []
    table = jobs if entity == "job" else attempts
    where = [table.c.state == expected]
    if attempt_nos is not None:
        where.append(tuple_(jobs.c.id, jobs.c.attempt_count).in_(list(zip(ids, attempt_nos, strict=True))))
    else:
        where.append(table.c.id.in_(ids))
    job_col = jobs.c.id if entity == "job" else attempts.c.job_id
    stmt = (
        update(table)
        .where(and_(*where))
        .values(state=to, updated_at=now, **(values or {}))
        .returning(table.c.id, job_col)
    )
    applied = conn.execute(stmt).all()
    by_id = dict(zip(ids, attempt_ids, strict=True)) if attempt_ids is not None else {}
    rows = [
        {
            "job_id": job_id,
            "attempt_id": row_id if entity == "attempt" else by_id.get(row_id),
            "entity": entity,
            "from_state": expected,
            "to_state": to,
            "reason": reason,
            "at": now,
            "details": dict(details or {}),
        }
        for row_id, job_id in applied
    ]
    event_insert(conn, rows)
    return [row_id for row_id, _ in applied]


def event_insert(conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
    """Append events (one multi-row INSERT)."""
    if rows:
        conn.execute(insert(events), list(rows))


def event_note(
    conn: Connection, *, job_id: int, attempt_id: int | None, state: str, reason: str, now: datetime,
    details: Mapping[str, Any] | None = None, entity: model.Entity = "attempt",
) -> None:
    """Append an event that records news without a state change (e.g. a launch error)."""
    event_insert(
        conn,
        [
            {
                "job_id": job_id, "attempt_id": attempt_id, "entity": entity, "from_state": state,
                "to_state": state, "reason": reason, "at": now, "details": dict(details or {}),
            }
        ],
    )


# --- submit -------------------------------------------------------------------------------------


def job_submit(conn: Connection, *, new: Sequence[model.NewJob], now: datetime) -> list[tuple[int, bool]]:
    """Insert jobs as `queued`; a (tenant, idempotency key) seen before returns the existing id.

    Returns (job id, created) in the order of `new`.
    """
    out: list[tuple[int, bool] | None] = [None] * len(new)
    plain = [i for i, j in enumerate(new) if j.idempotency_key is None]
    keyed = [i for i, j in enumerate(new) if j.idempotency_key is not None]
    if plain:
        stmt = insert(jobs).returning(jobs.c.id, sort_by_parameter_order=True)
        ids = conn.execute(stmt, [_job_row(new[i], now) for i in plain]).scalars().all()
        for i, job_id in zip(plain, ids, strict=True):
            out[i] = (job_id, True)
    for i in keyed:  # one at a time: two equal keys in one batch must yield one job
        out[i] = _job_submit_keyed(conn, new[i], now)
    result = [o for o in out if o is not None]
    event_insert(
        conn,
        [
            {
                "job_id": job_id, "attempt_id": None, "entity": "job", "from_state": None,
                "to_state": J.QUEUED, "reason": "submitted", "at": now, "details": {},
            }
            for job_id, made in result
            if made
        ],
    )
    return result


def _job_submit_keyed(conn: Connection, job: model.NewJob, now: datetime) -> tuple[int, bool]:
    stmt = dialects.insert_ignore_conflict(conn, jobs, ["tenant", "idempotency_key"])
    job_id = conn.execute(stmt.values(_job_row(job, now)).returning(jobs.c.id)).scalar()
    if job_id is not None:
        return job_id, True
    existing = conn.execute(
        select(jobs.c.id).where(jobs.c.tenant == job.tenant, jobs.c.idempotency_key == job.idempotency_key)
    ).scalar_one()
    return existing, False


def _job_row(job: model.NewJob, now: datetime) -> dict[str, Any]:
    return {
        "tenant": job.tenant,
        "queue": job.queue,
        "pool": job.pool,
        "priority": job.priority,
        "executor": job.executor,
        "spec": dict(job.spec),
        "payload": job.payload,
        "state": J.QUEUED,
        "run_at": job.run_at or now,
        "idempotency_key": job.idempotency_key,
        "max_attempts": job.max_attempts,
        "attempt_count": 0,
        "labels": dict(job.labels),
        "created_at": now,
        "updated_at": now,
    }


# --- claim --------------------------------------------------------------------------------------


def job_claim(
    conn: Connection, *, now: datetime, limit: int, executors: Sequence[str]
) -> list[model.Claimed]:
    """Claim up to `limit` due jobs (most urgent first) and create their attempts in `launching`.

    One transaction: the jobs move queued -> running (compare-and-set), each gets a new
    attempt whose id is its fence, and one event per job records the claim.
    """
    model.check_transition("job", J.QUEUED, J.RUNNING)
    stmt = _claim_statement(conn, now=now, limit=limit, executors=executors)
    claimed_jobs = sorted((job_from_row(r) for r in conn.execute(stmt)), key=_urgency)
    if not claimed_jobs:
        return []
    rows = [_attempt_row(job, now) for job in claimed_jobs]
    fences = conn.execute(insert(attempts).returning(attempts.c.id, sort_by_parameter_order=True), rows)
    claimed = [
        model.Claimed(job, attempt_from_row({**row, "id": fence}))
        for job, row, fence in zip(claimed_jobs, rows, fences.scalars().all(), strict=True)
    ]
    event_insert(
        conn,
        [
            {
                "job_id": c.job.id, "attempt_id": c.attempt.id, "entity": "job", "from_state": J.QUEUED,
                "to_state": J.RUNNING, "reason": f"claimed: attempt {c.attempt.attempt_no} launching",
                "at": now, "details": {"launch_name": c.attempt.launch_name},
            }
            for c in claimed
        ],
    )
    return claimed


def _claim_pick(conn: Connection, *, now: datetime, limit: int, executors: Sequence[str]) -> Select[Any]:
    """The due jobs a claim takes: most urgent first, at most `limit`, skipping locked rows."""
    due = (
        select(jobs.c.id)
        .where(jobs.c.state == J.QUEUED, jobs.c.run_at <= now, jobs.c.executor.in_(executors))
        .order_by(jobs.c.state, jobs.c.priority.desc(), jobs.c.run_at, jobs.c.id)
        .limit(limit)
    )
    return dialects.skip_locked(conn, due)


def _claim_statement(conn: Connection, *, now: datetime, limit: int, executors: Sequence[str]) -> Any:
    # A materialised CTE runs the pick exactly once. As a plain IN (subquery), PostgreSQL may
    # run it again per row, and with SKIP LOCKED each run can pick other rows: more than
    # `limit` jobs would be claimed.
    picked = _claim_pick(conn, now=now, limit=limit, executors=executors).cte("due").prefix_with("MATERIALIZED")
    return (
        update(jobs)
        .where(jobs.c.id.in_(select(picked.c.id)), jobs.c.state == J.QUEUED)
        .values(state=J.RUNNING, attempt_count=jobs.c.attempt_count + 1, updated_at=now)
        .returning(*jobs.c)
    )


def job_claim_plan(conn: Connection, *, now: datetime, limit: int, executors: Sequence[str]) -> list[str]:
    """The database's plan for the claim's pick, one line a step (nothing is claimed)."""
    pick = _claim_pick(conn, now=now, limit=limit, executors=executors)
    return [str(row[-1]) for row in conn.execute(dialects.Explain(pick))]


def _urgency(job: model.Job) -> tuple[int, datetime, int]:
    return (-job.priority, job.run_at, job.id)


def _attempt_row(job: model.Job, now: datetime) -> dict[str, Any]:
    return {
        "job_id": job.id,
        "attempt_no": job.attempt_count,
        "launch_name": model.launch_name(job.id, job.attempt_count),
        "executor": job.executor,
        "state": A.LAUNCHING,
        "created_at": now,
        "updated_at": now,
        "started_at": None,
        "finished_at": None,
        "exit_code": None,
        "reason": None,
        "last_seen_at": None,
    }


# --- attempts after launch ---------------------------------------------------------------------


def attempt_record_running(conn: Connection, *, fences: Sequence[int], now: datetime) -> list[int]:
    """launching -> running for each fence still launching (the outbox's third step)."""
    return transition(
        conn, entity="attempt", ids=fences, expected=A.LAUNCHING, to=A.RUNNING, now=now,
        reason="launched", values={"started_at": now, "last_seen_at": now},
    )


@dataclass(frozen=True, slots=True)
class Finish:
    """A finished attempt as an executor observed it."""

    fence: int
    succeeded: bool
    exit_code: int | None
    reason: str | None


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one applied completion did to its job."""

    job_id: int
    fence: int
    attempt_state: model.AttemptState
    job_state: model.JobState


def attempt_finish(conn: Connection, *, finishes: Sequence[Finish], now: datetime) -> list[Outcome]:
    """Apply completions: each attempt ends once (repeats are no-ops), then its job follows.

    A success ends the job `succeeded`; a failure sends it back to `queued` while attempts
    remain, else ends it `failed`.
    """
    groups: dict[tuple[bool, int | None, str | None], list[int]] = defaultdict(list)
    for f in finishes:
        groups[(f.succeeded, f.exit_code, f.reason)].append(f.fence)
    done: dict[int, model.AttemptState] = {}
    for (ok, code, reason), fences in groups.items():
        to = A.SUCCEEDED if ok else A.FAILED
        values = {"exit_code": code, "reason": reason, "finished_at": now, "last_seen_at": now}
        why = reason or (f"exit {code}" if code is not None else "finished")
        for expected in (A.RUNNING, A.LAUNCHING):
            todo = [f for f in fences if f not in done]
            for fence in transition(
                conn, entity="attempt", ids=todo, expected=expected, to=to, now=now, reason=why, values=values
            ):
                done[fence] = to
    return _jobs_follow(conn, done, now)


def _jobs_follow(conn: Connection, done: Mapping[int, model.AttemptState], now: datetime) -> list[Outcome]:
    if not done:
        return []
    rows = conn.execute(
        select(attempts.c.id, attempts.c.job_id, attempts.c.attempt_no, jobs.c.max_attempts)
        .join(jobs, jobs.c.id == attempts.c.job_id)
        .where(attempts.c.id.in_(list(done)))
    ).all()
    plan: dict[tuple[model.JobState, str], list[Row[Any]]] = defaultdict(list)
    for row in rows:
        plan[_job_next(done[row.id], row.attempt_no, row.max_attempts)].append(row)
    outcomes = []
    for (to, why), group in plan.items():
        values = {"run_at": now} if to == J.QUEUED else {}
        applied = set(
            transition(
                conn, entity="job", ids=[r.job_id for r in group], expected=J.RUNNING, to=to, now=now,
                reason=why, values=values, attempt_nos=[r.attempt_no for r in group],
                attempt_ids=[r.id for r in group],
            )
        )
        outcomes += [Outcome(r.job_id, r.id, done[r.id], to) for r in group if r.job_id in applied]
    return outcomes


def _job_next(attempt: model.AttemptState, attempt_no: int, max_attempts: int) -> tuple[model.JobState, str]:
    if attempt == A.SUCCEEDED:
        return J.SUCCEEDED, f"attempt {attempt_no} succeeded"
    if attempt_no < max_attempts:
        return J.QUEUED, f"retry: attempt {attempt_no} of {max_attempts} {attempt}"
    return J.FAILED, f"attempt {attempt_no} of {max_attempts} {attempt}: no attempts left"


def attempt_list_active(conn: Connection, *, executor: str, limit: int, after: int = 0) -> list[model.Attempt]:
    """Attempts launching or running on `executor`, oldest fence first, after fence `after`."""
    stmt = (
        select(attempts)
        .where(
            attempts.c.state.in_([A.LAUNCHING, A.RUNNING]),
            attempts.c.executor == executor,
            attempts.c.id > after,
        )
        .order_by(attempts.c.id)
        .limit(limit)
    )
    return [attempt_from_row(r._mapping) for r in conn.execute(stmt)]


def attempt_seen(conn: Connection, *, fences: Sequence[int], now: datetime) -> None:
    """Record news of still-running attempts (a heartbeat or an observation)."""
    if fences:
        conn.execute(
            update(attempts)
            .where(attempts.c.id.in_(fences), attempts.c.state.in_([A.LAUNCHING, A.RUNNING]))
            .values(last_seen_at=now)
        )


# --- cancel ------------------------------------------------------------------------------------


def job_cancel(conn: Connection, *, job_id: int, now: datetime, reason: str) -> model.Attempt | None:
    """Cancel a job that has not ended; returns its active attempt (now cancelled), if any.

    Raises NotFound, or InvalidInput when the job has already ended.
    """
    job = job_get(conn, job_id=job_id)
    if job.state in model.FINAL_JOB_STATES:
        raise errors.InvalidInput(f"job {job_id} has already ended ({job.state}); nothing to cancel")
    if not transition(
        conn, entity="job", ids=[job_id], expected=job.state, to=J.CANCELLED, now=now, reason=reason
    ):
        raise errors.InvalidInput(f"job {job_id} changed state while cancelling; look again")
    active = conn.execute(
        select(attempts).where(attempts.c.job_id == job_id, attempts.c.state.in_([A.LAUNCHING, A.RUNNING]))
    ).first()
    if active is None:
        return None
    attempt = attempt_from_row(active._mapping)
    transition(
        conn, entity="attempt", ids=[attempt.id], expected=attempt.state, to=A.CANCELLED, now=now,
        reason=reason, values={"finished_at": now},
    )
    return attempt


# --- reads --------------------------------------------------------------------------------------


def job_get(conn: Connection, *, job_id: int) -> model.Job:
    row = conn.execute(select(jobs).where(jobs.c.id == job_id)).first()
    if row is None:
        raise errors.NotFound(f"no job with id {job_id}")
    return job_from_row(row._mapping)


def job_list(
    conn: Connection, *, states: Iterable[str] = (), limit: int = 100, queue: str | None = None
) -> list[model.Job]:
    """Newest jobs first, optionally filtered by state and queue."""
    stmt = select(jobs).order_by(jobs.c.id.desc()).limit(limit)
    if states := list(states):
        stmt = stmt.where(jobs.c.state.in_(states))
    if queue is not None:
        stmt = stmt.where(jobs.c.queue == queue)
    return [job_from_row(r._mapping) for r in conn.execute(stmt)]


def job_count_by_state(conn: Connection) -> dict[str, int]:
    rows = conn.execute(select(jobs.c.state, func.count()).group_by(jobs.c.state)).all()
    return {state: count for state, count in rows}


def attempt_list(conn: Connection, *, job_id: int) -> list[model.Attempt]:
    stmt = select(attempts).where(attempts.c.job_id == job_id).order_by(attempts.c.id)
    return [attempt_from_row(r._mapping) for r in conn.execute(stmt)]


def event_list(conn: Connection, *, job_id: int) -> list[model.Event]:
    stmt = select(events).where(events.c.job_id == job_id).order_by(events.c.id)
    return [model.Event(**{**r._mapping}) for r in conn.execute(stmt)]


def analyze(conn: Connection) -> None:
    """Refresh the planner's statistics (after a bulk load)."""
    conn.exec_driver_sql("ANALYZE")


def job_from_row(row: Any) -> model.Job:
    m = row._mapping if hasattr(row, "_mapping") else row
    return model.Job(**{**m, "state": J(m["state"])})


def attempt_from_row(row: Mapping[str, Any]) -> model.Attempt:
    return model.Attempt(**{**row, "state": A(row["state"])})
