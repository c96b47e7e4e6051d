"""Every store operation, as a function of an open connection inside a transaction.

The Store (store/__init__.py) runs these in a worker thread, one transaction each. Time is
always an argument (`now`), never read here. Dialect differences live in dialects.py.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Select, and_, case, func, insert, literal, or_, select, update

from corral import errors, failpoints, model
from corral.store import dialects
from corral.store.tables import UTCDateTime, attempts, events, jobs

A, J = model.AttemptState, model.JobState


# --- the one transition function ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Applied:
    """A row a transition changed: its id, its job, and its attempt number (for a job, the
    number of its current attempt)."""

    id: int
    job_id: int
    attempt_no: int


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
    where: Sequence[Any] = (),
) -> list[Applied]:
    """Move every row of `ids` from `expected` to `to`, if it is still in `expected`.

    The compare-and-set is in the WHERE clause, so a row that another writer moved first
    is left alone: a lost race returns fewer rows, never an error or a second effect. For
    attempts the id is the fence; for jobs `attempt_nos` (when given) fences the write to
    the job's current attempt. `where` adds conditions a row must also meet. One event is
    appended per applied row, in the same transaction. Returns the rows that changed.
    """
    model.check_transition(entity, expected, to)
    if not ids:
        return []
    table = jobs if entity == "job" else attempts
    conditions = [dialects.one_of(conn, table.c.id, ids), table.c.state == expected, *where]
    if attempt_nos is not None:
        pairs = list(zip(ids, attempt_nos, strict=True))
        conditions.append(dialects.pairs_in(conn, jobs.c.id, jobs.c.attempt_count, pairs))
    cols = (
        (jobs.c.id, jobs.c.attempt_count)
        if entity == "job"
        else (attempts.c.job_id, attempts.c.attempt_no)
    )
    stmt = (
        update(table)
        .where(and_(*conditions))
        .values(state=to, updated_at=now, **(values or {}))
        .returning(table.c.id, *cols)
    )
    applied = [Applied(*row) for row in conn.execute(stmt)]
    by_id = dict(zip(ids, attempt_ids, strict=True)) if attempt_ids is not None else {}
    event_insert(
        conn,
        [
            event_row(
                job_id=a.job_id,
                attempt_id=a.id if entity == "attempt" else by_id.get(a.id),
                entity=entity,
                frm=expected,
                to=to,
                reason=reason,
                now=now,
                details=details,
            )
            for a in applied
        ],
    )
    return applied


def event_row(
    *,
    job_id: int,
    attempt_id: int | None,
    entity: model.Entity,
    frm: str | None,
    to: str,
    reason: str,
    now: datetime,
    details: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One row of the events table."""
    return {
        "job_id": job_id,
        "attempt_id": attempt_id,
        "entity": entity,
        "from_state": frm,
        "to_state": to,
        "reason": reason,
        "at": now,
        "details": dict(details or {}),
    }


def event_insert(conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
    """Append events (one multi-row INSERT)."""
    dialects.insert_many(conn, events, rows)


def event_note(
    conn: Connection,
    *,
    job_id: int,
    attempt_id: int | None,
    state: str,
    reason: str,
    now: datetime,
    details: Mapping[str, Any] | None = None,
    entity: model.Entity = "attempt",
) -> None:
    """Append an event that records news without a state change (e.g. a launch error)."""
    row = event_row(
        job_id=job_id,
        attempt_id=attempt_id,
        entity=entity,
        frm=state,
        to=state,
        reason=reason,
        now=now,
        details=details,
    )
    event_insert(conn, [row])


# --- submit -------------------------------------------------------------------------------------


def job_submit(
    conn: Connection, *, new: Sequence[model.NewJob], now: datetime
) -> list[tuple[int, bool]]:
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
            event_row(
                job_id=job_id,
                attempt_id=None,
                entity="job",
                frm=None,
                to=J.QUEUED,
                reason="submitted",
                now=now,
            )
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
        select(jobs.c.id).where(
            jobs.c.tenant == job.tenant, jobs.c.idempotency_key == job.idempotency_key
        )
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
    attempt whose id is its fence, and one event per job records the claim. This is the one
    state change that does not go through `transition`: it picks and moves the rows in a
    single statement, so PostgreSQL runs the pick once under SKIP LOCKED. It checks the same
    transition table and writes its events in the same transaction.
    """
    model.check_transition("job", J.QUEUED, J.RUNNING)
    stmt = _claim_statement(conn, now=now, limit=limit, executors=executors)
    claimed_jobs = sorted((job_from_row(r) for r in conn.execute(stmt)), key=_urgency)
    if not claimed_jobs:
        return []
    rows = [_attempt_row(job, now) for job in claimed_jobs]
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
                reason=f"claimed: attempt {c.attempt.attempt_no} launching",
                now=now,
                details={"launch_name": c.attempt.launch_name},
            )
            for c in claimed
        ],
    )
    return claimed


def _claim_pick(
    conn: Connection, *, now: datetime, limit: int, executors: Sequence[str]
) -> Select[Any]:
    """The due jobs a claim takes: most urgent first, at most `limit`, skipping locked rows."""
    due = (
        select(jobs.c.id)
        .where(jobs.c.state == J.QUEUED, jobs.c.run_at <= now, jobs.c.executor.in_(executors))
        .order_by(jobs.c.state, jobs.c.priority.desc(), jobs.c.run_at, jobs.c.id)
        .limit(limit)
    )
    return dialects.skip_locked(conn, due)


def _claim_statement(
    conn: Connection, *, now: datetime, limit: int, executors: Sequence[str]
) -> Any:
    # A materialised CTE runs the pick exactly once. As a plain IN (subquery), PostgreSQL may
    # run it again per row, and with SKIP LOCKED each run can pick other rows: more than
    # `limit` jobs would be claimed.
    picked = (
        _claim_pick(conn, now=now, limit=limit, executors=executors)
        .cte("due")
        .prefix_with("MATERIALIZED")
    )
    return (
        update(jobs)
        .where(jobs.c.id.in_(select(picked.c.id)), jobs.c.state == J.QUEUED)
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
    }


# --- attempts after launch ---------------------------------------------------------------------


def attempt_record_running(
    conn: Connection, *, fences: Sequence[int], now: datetime, reason: str = "launched"
) -> list[int]:
    """launching -> running for each fence still launching (the outbox's third step, or
    recovery adopting or relaunching an attempt)."""
    applied = transition(
        conn,
        entity="attempt",
        ids=fences,
        expected=A.LAUNCHING,
        to=A.RUNNING,
        now=now,
        reason=reason,
        values={"started_at": now, "last_seen_at": now},
    )
    return [a.id for a in applied]


Backoff = Callable[[int], float]
"""Seconds a job waits before its next attempt, given the number of the attempt that failed."""


def attempt_settle(
    conn: Connection,
    *,
    launched: Sequence[int],
    finishes: Sequence[Finish],
    now: datetime,
    backoff: Backoff | None = None,
) -> tuple[list[int], list[Outcome]]:
    """One transaction for a tick's last step: apply the completions that have arrived,
    then record the launched attempts that are still launching as running."""
    outcomes = attempt_finish(conn, finishes=finishes, now=now, backoff=backoff)
    ended = {o.fence for o in outcomes}
    still = [fence for fence in launched if fence not in ended]
    return attempt_record_running(conn, fences=still, now=now), outcomes


@dataclass(frozen=True, slots=True)
class Finish:
    """An attempt's end as an executor (or recovery) saw it: succeeded, failed or lost."""

    fence: int
    state: model.AttemptState
    exit_code: int | None
    reason: str | None


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one applied completion did to its job."""

    job_id: int
    fence: int
    attempt_no: int
    attempt_state: model.AttemptState
    job_state: model.JobState


ENDINGS = frozenset({A.SUCCEEDED, A.FAILED, A.LOST})


def attempt_finish(
    conn: Connection, *, finishes: Sequence[Finish], now: datetime, backoff: Backoff | None = None
) -> list[Outcome]:
    """Apply completions: each attempt ends once (repeats are no-ops), then its job follows.

    A success ends the job `succeeded`; a failure or a loss sends it back to `queued`
    while attempts remain (due again after `backoff`, at once without one), else ends it
    `failed`.
    """
    if bad := {f.state for f in finishes} - ENDINGS:
        raise errors.IllegalTransition(f"an attempt cannot finish as {', '.join(sorted(bad))}")
    dialects.lock_in_order(conn, attempts, [f.fence for f in finishes])
    groups: dict[tuple[model.AttemptState, int | None, str | None], list[int]] = defaultdict(list)
    for f in finishes:
        groups[(f.state, f.exit_code, f.reason)].append(f.fence)
    ended: list[tuple[Applied, model.AttemptState]] = []
    for (to, code, reason), fences in groups.items():
        values = {"exit_code": code, "reason": reason, "finished_at": now, "last_seen_at": now}
        why = reason or (f"exit {code}" if code is not None else str(to))
        todo = set(fences)
        for expected in (A.LAUNCHING, A.RUNNING):
            if to == A.LOST and expected == A.LAUNCHING:
                continue  # a launching attempt that is not there is launched again, not lost
            applied = transition(
                conn,
                entity="attempt",
                ids=sorted(todo),
                expected=expected,
                to=to,
                now=now,
                reason=why,
                values=values,
            )
            ended += [(a, to) for a in applied]
            todo -= {a.id for a in applied}
    if ended:
        failpoints.hit("mid_completion")
    return _jobs_follow(conn, ended, now, backoff)


def _jobs_follow(
    conn: Connection,
    ended: Sequence[tuple[Applied, model.AttemptState]],
    now: datetime,
    backoff: Backoff | None,
) -> list[Outcome]:
    """Move the jobs of ended attempts on, fenced to that attempt being the job's current one."""
    won = [a for a, state in ended if state == A.SUCCEEDED]
    lost = [a for a, state in ended if state != A.SUCCEEDED]
    state_of = {a.id: state for a, state in ended}
    plans = [
        (won, J.SUCCEEDED, "attempt {n} succeeded", (), {}),
        (
            lost,
            J.QUEUED,
            "retry: attempt {n} {state}, attempts remain; due again after a backoff"
            if backoff
            else "retry: attempt {n} {state}, attempts remain",
            [jobs.c.attempt_count < jobs.c.max_attempts],
            {"run_at": _retry_at(lost, now, backoff)},
        ),
        (
            lost,
            J.FAILED,
            "attempt {n} {state}: no attempts left",
            [jobs.c.attempt_count >= jobs.c.max_attempts],
            {},
        ),
    ]
    outcomes = []
    for attempts_ended, to, why, where, values in plans:
        by_kind: dict[tuple[int, model.AttemptState], list[Applied]] = defaultdict(list)
        for a in attempts_ended:
            by_kind[(a.attempt_no, state_of[a.id])].append(a)
        for (n, state), group in by_kind.items():  # one reason each keeps the run log exact
            applied = transition(
                conn,
                entity="job",
                ids=[a.job_id for a in group],
                expected=J.RUNNING,
                to=to,
                now=now,
                reason=why.format(n=n, state=state),
                values=values,
                where=where,
                attempt_nos=[a.attempt_no for a in group],
                attempt_ids=[a.id for a in group],
            )
            fence = {a.job_id: a.id for a in group}
            outcomes += [Outcome(j.id, fence[j.id], n, state, to) for j in applied]
    return outcomes


def attempt_list_active(
    conn: Connection, *, executor: str, limit: int, after: int = 0
) -> list[model.Attempt]:
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


def attempt_list_for_recovery(
    conn: Connection,
    *,
    now: datetime,
    launch_grace: timedelta,
    lease_timeout: timedelta,
    attempt_deadline: timedelta,
    limit: int,
    after: int = 0,
) -> list[model.Claimed]:
    """Attempts recovery must look at, by fence from `after` on, each with its job:
    launching for longer than `launch_grace`; running without news for `lease_timeout`,
    or for longer than `attempt_deadline`."""
    stale = or_(
        and_(attempts.c.state == A.LAUNCHING, attempts.c.created_at <= now - launch_grace),
        and_(
            attempts.c.state == A.RUNNING,
            or_(
                attempts.c.last_seen_at <= now - lease_timeout,
                attempts.c.started_at <= now - attempt_deadline,
            ),
        ),
    )
    stmt = select(attempts).where(stale, attempts.c.id > after).order_by(attempts.c.id).limit(limit)
    found = [attempt_from_row(r._mapping) for r in conn.execute(stmt)]
    if not found:
        return []
    job_rows = conn.execute(
        select(jobs).where(dialects.one_of(conn, jobs.c.id, [a.job_id for a in found]))
    )
    by_id = {job.id: job for job in (job_from_row(r) for r in job_rows)}
    return [model.Claimed(by_id[a.job_id], a) for a in found]


@dataclass(frozen=True, slots=True)
class Status:
    """Where an attempt and its job stand, with the attempt's identity."""

    attempt_state: str
    job_state: str
    identity: model.Identity


def attempt_states(conn: Connection, *, fences: Sequence[int]) -> dict[int, Status]:
    """The status of each fence the store knows."""
    if not fences:
        return {}
    stmt = (
        select(
            attempts.c.id, attempts.c.state, jobs.c.state, attempts.c.job_id, attempts.c.attempt_no
        )
        .join(jobs, jobs.c.id == attempts.c.job_id)
        .where(dialects.one_of(conn, attempts.c.id, fences))
    )
    return {
        fence: Status(a_state, j_state, model.Identity(job_id, attempt_no, fence))
        for fence, a_state, j_state, job_id, attempt_no in conn.execute(stmt)
    }


def attempt_seen(conn: Connection, *, fences: Sequence[int], now: datetime) -> None:
    """Record news of still-running attempts (a heartbeat or an observation)."""
    if fences:
        conn.execute(
            update(attempts)
            .where(attempts.c.id.in_(fences), attempts.c.state.in_([A.LAUNCHING, A.RUNNING]))
            .values(last_seen_at=now)
        )


# --- cancel ------------------------------------------------------------------------------------


def job_cancel(
    conn: Connection, *, job_id: int, now: datetime, reason: str
) -> model.Attempt | None:
    """Cancel a job that has not ended; returns its active attempt (now cancelled), if any.

    Cancelling a cancelled job again is a no-op. Raises NotFound, or InvalidInput when the
    job ended otherwise or changed under us. Attempts are written before their job, the
    same order completions use, so a cancel and a completion cannot deadlock.
    """
    job = job_get(conn, job_id=job_id)
    if job.state == J.CANCELLED:
        return None
    if job.state in model.FINAL_JOB_STATES:
        raise errors.InvalidInput(
            f"job {job_id} has already ended ({job.state}); nothing to cancel"
        )
    attempt = _active_attempt(conn, job_id)
    if attempt is not None:
        transition(
            conn,
            entity="attempt",
            ids=[attempt.id],
            expected=attempt.state,
            to=A.CANCELLED,
            now=now,
            reason=reason,
            values={"finished_at": now},
        )
    if not transition(
        conn,
        entity="job",
        ids=[job_id],
        expected=job.state,
        to=J.CANCELLED,
        now=now,
        reason=reason,
        attempt_nos=[job.attempt_count],
    ):
        raise errors.InvalidInput(f"job {job_id} changed state while cancelling; look again")
    return attempt


def _active_attempt(conn: Connection, job_id: int) -> model.Attempt | None:
    row = conn.execute(
        select(attempts).where(
            attempts.c.job_id == job_id, attempts.c.state.in_([A.LAUNCHING, A.RUNNING])
        )
    ).first()
    return None if row is None else attempt_from_row(row._mapping)


def _retry_at(lost: Sequence[Applied], now: datetime, backoff: Backoff | None) -> Any:
    """The new run_at of each job that will retry: one CASE over the job ids, so a batch of
    retries, each with its own jittered delay, is still one UPDATE."""
    if backoff is None or not lost:
        return now
    whens = [
        (
            jobs.c.id == a.job_id,
            literal(now + timedelta(seconds=backoff(a.attempt_no)), UTCDateTime()),
        )
        for a in lost
    ]
    return case(*whens, else_=literal(now, UTCDateTime()))


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


def attempt_from_row(row: Any) -> model.Attempt:
    return model.Attempt(**{**row, "state": A(row["state"])})
