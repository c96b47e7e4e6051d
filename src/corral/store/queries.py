"""Every store operation, as a function of an open connection inside a transaction.

The Store (store/__init__.py) runs these in a worker thread, one transaction each. Time is
always an argument (`now`), never read here. Dialect differences live in dialects.py.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Select, and_, case, func, insert, literal, or_, select, update

from corral import config, errors, failpoints, model, retry
from corral.store import dialects
from corral.store.tables import (
    UTCDateTime,
    attempts,
    checkpoints,
    events,
    jobs,
    publish_pointers,
    retry_budgets,
)

A, J = model.AttemptState, model.JobState
FC = model.FailureClass
ACTIVE = (A.LAUNCHING, A.RUNNING)


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
        "policy": dict(job.policy),
        "code_version": job.code_version,
    }


# --- claim --------------------------------------------------------------------------------------


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
) -> list[model.Claimed]:
    """Claim up to `limit` due jobs (most urgent first) and create their attempts in `launching`.

    One transaction: the jobs move queued -> running (compare-and-set), each gets a new
    attempt whose id is its fence, and one event per job records the claim. This is the one
    state change that does not go through `transition`: it picks and moves the rows in a
    single statement, so PostgreSQL runs the pick once under SKIP LOCKED. It checks the same
    transition table and writes its events in the same transaction.
    """
    model.check_transition("job", J.QUEUED, J.RUNNING)
    if pools:
        ids = _claim_pick_pooled(conn, now=now, limit=limit, executors=executors, pools=pools)
        stmt = _claim_update(dialects.one_of(conn, jobs.c.id, ids), now)
    else:
        stmt = _claim_statement(conn, now=now, limit=limit, executors=executors)
    claimed_jobs = sorted((job_from_row(r) for r in conn.execute(stmt)), key=_urgency)
    if not claimed_jobs:
        return []
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
                reason=f"claimed: attempt {c.attempt.attempt_no} launching",
                now=now,
                details={"launch_name": c.attempt.launch_name},
            )
            for c in claimed
        ],
    )
    return claimed


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
            jobs.c.state == J.QUEUED,
            jobs.c.run_at <= now,
            jobs.c.executor.in_(executors),
            *where,
        )
        .order_by(jobs.c.state, jobs.c.priority.desc(), jobs.c.run_at, jobs.c.id)
        .limit(limit)
    )
    return dialects.skip_locked(conn, due)


def _claim_pick_pooled(
    conn: Connection,
    *,
    now: datetime,
    limit: int,
    executors: Sequence[str],
    pools: Mapping[str, int],
) -> list[int]:
    """The claim's pick when pools cap concurrency: the most urgent jobs outside any pool
    and, per pool, at most its free slots; then the `limit` most urgent of those. Claims
    that count a pool's running jobs take turns (PostgreSQL: one transaction-scoped lock),
    so two dispatchers cannot both fill the last slot."""
    dialects.take_turns(conn, "corral.pools")
    running = pool_running(conn, pools=list(pools))
    columns = (jobs.c.id, jobs.c.priority, jobs.c.run_at)
    unpooled = or_(jobs.c.pool.is_(None), jobs.c.pool.not_in(list(pools)))
    picks = [(unpooled, limit)]
    picks += [
        (jobs.c.pool == pool, min(slots - running.get(pool, 0), limit))
        for pool, slots in sorted(pools.items())
    ]
    found: list[Any] = []
    for condition, room in picks:
        if room > 0:
            stmt = _claim_pick(
                conn, now=now, limit=room, executors=executors, where=[condition], columns=columns
            )
            found += conn.execute(stmt).all()
    found.sort(key=lambda r: (-r.priority, r.run_at, r.id))
    return [r.id for r in found[:limit]]


def pool_running(conn: Connection, *, pools: Sequence[str]) -> dict[str, int]:
    """How many jobs of each pool are running now."""
    if not pools:
        return {}
    stmt = (
        select(jobs.c.pool, func.count())
        .where(jobs.c.state == J.RUNNING, jobs.c.pool.in_(list(pools)))
        .group_by(jobs.c.pool)
    )
    return {pool: count for pool, count in conn.execute(stmt)}


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


def _urgency(job: model.Job) -> tuple[int, datetime, int]:
    return (-job.priority, job.run_at, job.id)


def _attempt_row(job: model.Job, now: datetime, limits: DefaultLimits | None) -> dict[str, Any]:
    """A new attempt: its deadline is fixed now, from the job's own limit or the default;
    a job that sends heartbeats owes its first one within its lease."""
    deadline_at = lease_until = lease = None
    if limits is not None:
        policy = config.JobPolicy.read(job.policy)
        deadline_at = now + (policy.limits.attempt_deadline or limits.attempt_deadline)
        if policy.heartbeat:
            lease = policy.limits.lease_timeout or limits.lease_timeout
            lease_until = now + lease
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
        "lease_seconds": None if lease is None else lease.total_seconds(),
    }


# --- attempts after launch ---------------------------------------------------------------------


def attempt_record_running(
    conn: Connection,
    *,
    fences: Sequence[int],
    now: datetime,
    reason: str = "launched",
    locked: bool = False,
) -> list[int]:
    """launching -> running for each fence still launching (the outbox's third step, or
    recovery adopting or relaunching an attempt). A job that sends heartbeats gets its
    whole lease from now: the time it waited to be launched does not count against it.
    Rows are locked in fence order first, as completions lock them, so the two cannot
    deadlock when they write at once (PostgreSQL); `locked`: the caller did that already."""
    if not locked:
        dialects.lock_in_order(conn, attempts, fences)
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
    ids = [a.id for a in applied]
    if ids:
        leased = conn.execute(
            select(attempts.c.id, attempts.c.lease_seconds).where(
                dialects.one_of(conn, attempts.c.id, ids), attempts.c.lease_seconds.is_not(None)
            )
        ).all()
        if leased:
            until = {fence: now + timedelta(seconds=seconds) for fence, seconds in leased}
            conn.execute(
                update(attempts)
                .where(dialects.one_of(conn, attempts.c.id, list(until)))
                .values(lease_until=_per_row(attempts.c.id, until, now))
            )
    return ids


def attempt_settle(
    conn: Connection,
    *,
    launched: Sequence[int],
    finishes: Sequence[Finish],
    now: datetime,
    retry: retry.Retry | None = None,
) -> tuple[list[int], list[Outcome]]:
    """One transaction for a tick's last step: apply the completions that have arrived,
    then record the launched attempts that are still launching as running. Every row it
    writes is locked first, in fence order: another writer (the completion writer, a
    reconciler) may be writing some of them at the same moment."""
    dialects.lock_in_order(conn, attempts, sorted({*launched, *(f.fence for f in finishes)}))
    outcomes = attempt_finish(conn, finishes=finishes, now=now, retry=retry, locked=True)
    ended = {o.fence for o in outcomes}
    still = [fence for fence in launched if fence not in ended]
    return attempt_record_running(conn, fences=still, now=now, locked=True), outcomes


@dataclass(frozen=True, slots=True)
class Finish:
    """An attempt's end as an executor (or recovery) saw it: succeeded, failed or lost.

    `failure_class` is the platform's own verdict on a failure, when it has one (a deadline
    or a kill is transient); `message` is the last line of stderr or the like."""

    fence: int
    state: model.AttemptState
    exit_code: int | None
    reason: str | None
    failure_class: model.FailureClass | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one applied completion did to its job."""

    job_id: int
    fence: int
    attempt_no: int
    attempt_state: model.AttemptState
    job_state: model.JobState


ENDINGS = frozenset({A.SUCCEEDED, A.FAILED, A.LOST})


@dataclass(frozen=True, slots=True)
class _Judged:
    job: model.Job
    policy: config.JobPolicy
    failure: retry.Failure


def attempt_finish(
    conn: Connection,
    *,
    finishes: Sequence[Finish],
    now: datetime,
    retry: retry.Retry | None = None,
    locked: bool = False,
) -> list[Outcome]:
    """Apply completions: each attempt ends once (repeats are no-ops), then its job follows.

    A success ends the job `succeeded`. A failure or a loss is classed (retry.classify):
    a permanent one, or the same unknown one `quarantine_after` times in a row, quarantines
    the job; otherwise it goes back to `queued` while attempts remain (due after a backoff,
    and after a token from its queue's retry budget), else ends `failed`.
    """
    if bad := {f.state for f in finishes} - ENDINGS:
        raise errors.IllegalTransition(f"an attempt cannot finish as {', '.join(sorted(bad))}")
    rules = retry or _PLAIN
    if not locked:  # (`locked`: the caller locked these rows, in fence order, already)
        dialects.lock_in_order(conn, attempts, [f.fence for f in finishes])
    judged = _judge(conn, [f for f in finishes if f.state != A.SUCCEEDED])
    groups: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for f in finishes:
        j = judged.get(f.fence)
        cls, print_ = (j.failure.cls, j.failure.fingerprint) if j else (None, None)
        groups[(f.state, f.exit_code, f.reason, cls, print_)].append(f.fence)
    ended: list[tuple[Applied, model.AttemptState]] = []
    for (to, code, reason, cls, print_), fences in groups.items():
        values = {
            "exit_code": code,
            "reason": reason,
            "finished_at": now,
            "last_seen_at": now,
            "failure_class": cls,
            "fingerprint": print_,
        }
        why = reason or (f"exit {code}" if code is not None else str(to))
        todo = set(fences)
        for expected in ACTIVE:
            if to == A.LOST and expected == A.LAUNCHING:
                continue  # a launching attempt that is not there is launched again, not lost
            applied = transition(
                conn,
                entity="attempt",
                ids=sorted(todo),
                expected=expected,
                to=to,
                now=now,
                reason=why if cls is None else f"{why} ({cls})",
                values=values,
            )
            ended += [(a, to) for a in applied]
            todo -= {a.id for a in applied}
    if ended:
        failpoints.hit("mid_completion")
    won = [a for a, state in ended if state == A.SUCCEEDED]
    outcomes = _jobs_succeed(conn, won, now)
    lost = [(a, state) for a, state in ended if state != A.SUCCEEDED]
    return outcomes + _jobs_after_failure(conn, lost, judged, now, rules)


_PLAIN = retry.Retry()


def _judge(conn: Connection, failed: Sequence[Finish]) -> dict[int, _Judged]:
    """Class and fingerprint of each failed attempt still active, with its job."""
    if not failed:
        return {}
    rows = conn.execute(
        select(attempts.c.id.label("fence"), attempts.c.executor.label("platform"), *jobs.c)
        .join(jobs, jobs.c.id == attempts.c.job_id)
        .where(
            dialects.one_of(conn, attempts.c.id, [f.fence for f in failed]),
            attempts.c.state.in_(ACTIVE),
        )
    ).all()
    found = {
        r.fence: (r.platform, job_from_row({c.name: r._mapping[c.name] for c in jobs.c}))
        for r in rows
    }
    out = {}
    for f in failed:
        if f.fence not in found:
            continue
        executor, job = found[f.fence]
        policy = config.JobPolicy.read(job.policy)
        failure = retry.classify(
            policy,
            executor=executor,
            state=f.state,
            exit_code=f.exit_code,
            reason=f.reason,
            hint=f.failure_class,
            message=f.message,
        )
        out[f.fence] = _Judged(job, policy, failure)
    return out


def _jobs_succeed(conn: Connection, won: Sequence[Applied], now: datetime) -> list[Outcome]:
    """Jobs whose current attempt succeeded end `succeeded` (fenced to that attempt)."""
    by_no: dict[int, list[Applied]] = defaultdict(list)
    for a in won:
        by_no[a.attempt_no].append(a)
    outcomes = []
    for n, group in by_no.items():  # one reason each keeps the run log exact
        applied = transition(
            conn,
            entity="job",
            ids=[a.job_id for a in group],
            expected=J.RUNNING,
            to=J.SUCCEEDED,
            now=now,
            reason=f"attempt {n} succeeded",
            attempt_nos=[a.attempt_no for a in group],
            attempt_ids=[a.id for a in group],
        )
        fence = {a.job_id: a.id for a in group}
        outcomes += [Outcome(j.id, fence[j.id], n, A.SUCCEEDED, J.SUCCEEDED) for j in applied]
    return outcomes


@dataclass(frozen=True, slots=True)
class _Next:
    """Where a job goes after a failed attempt, and why."""

    to: model.JobState
    reason: str
    details: tuple[tuple[str, Any], ...] = ()
    run_at: datetime | None = None
    extra_attempt: bool = False  # an ignored failure does not use up an attempt


def _jobs_after_failure(
    conn: Connection,
    lost: Sequence[tuple[Applied, model.AttemptState]],
    judged: Mapping[int, _Judged],
    now: datetime,
    rules: retry.Retry,
) -> list[Outcome]:
    """Move each job on after its current attempt failed: quarantined, queued or failed."""
    if not lost:
        return []
    streaks = _streaks(conn, [(a, judged[a.id]) for a, _ in lost], rules)
    plans = {a.id: _next(a, state, judged[a.id], streaks[a.id], now, rules) for a, state in lost}
    _spend_budget(conn, [(a, judged[a.id]) for a, _ in lost], plans, now, rules)
    groups: dict[tuple[Any, ...], list[Applied]] = defaultdict(list)
    for a, _ in lost:
        p = plans[a.id]
        groups[(p.to, p.reason, p.details)].append(a)
    state_of = {a.id: state for a, state in lost}
    outcomes = []
    for (to, reason, details), group in groups.items():
        values: dict[str, Any] = {}
        if to == J.QUEUED:
            run_at = {a.job_id: plans[a.id].run_at for a in group}
            values["run_at"] = _per_row(jobs.c.id, run_at, now)
        if any(plans[a.id].extra_attempt for a in group):
            values["max_attempts"] = jobs.c.max_attempts + 1
        applied = transition(
            conn,
            entity="job",
            ids=[a.job_id for a in group],
            expected=J.RUNNING,
            to=to,
            now=now,
            reason=reason,
            values=values,
            details=dict(details),
            attempt_nos=[a.attempt_no for a in group],
            attempt_ids=[a.id for a in group],
        )
        fence = {a.job_id: a for a in group}
        outcomes += [
            Outcome(j.id, fence[j.id].id, fence[j.id].attempt_no, state_of[fence[j.id].id], to)
            for j in applied
        ]
    return outcomes


def _next(
    a: Applied,
    state: model.AttemptState,
    j: _Judged,
    streak: int,
    now: datetime,
    rules: retry.Retry,
) -> _Next:
    f, job, n = j.failure, j.job, a.attempt_no
    cls = f.cls
    details = (("failure_class", str(cls)), ("fingerprint", f.fingerprint), ("rule", f.why))
    if cls == FC.PERMANENT:
        return _Next(
            J.QUARANTINED, f"quarantined: attempt {n} failed permanently ({f.why})", details
        )
    k = j.policy.quarantine_after or rules.quarantine_after
    if cls == FC.UNKNOWN and streak >= k:
        same = "failed" if k == 1 else f"failed the same way {k} times in a row"
        return _Next(
            J.QUARANTINED,
            f"quarantined: attempt {n} {same} (fingerprint {f.fingerprint}); waits for a person",
            details,
        )
    if f.counts and job.charged_attempts >= job.max_attempts:
        return _Next(J.FAILED, f"attempt {n} {state} ({cls}): no attempts left", details)
    ignored = "" if f.counts else ", which does not count toward max_attempts"
    delay = rules.delay(n, j.policy)
    wait = "; due again after a backoff" if delay > 0 else ""
    return _Next(
        J.QUEUED,
        f"retry: attempt {n} {state} ({cls}){ignored}, attempts remain{wait}",
        details,
        run_at=now + timedelta(seconds=delay),
        extra_attempt=not f.counts,
    )


def _streaks(
    conn: Connection, ended: Sequence[tuple[Applied, _Judged]], rules: retry.Retry
) -> dict[int, int]:
    """For each ended attempt of unknown class: how many attempts in a row, ending with it,
    failed with its fingerprint. Attempts that never launched are not in the row: they
    neither break a streak nor add to it."""
    out = {a.id: 1 for a, _ in ended}
    todo = [(a, j) for a, j in ended if j.failure.cls == FC.UNKNOWN and a.attempt_no > 1]
    if not todo:
        return out
    longest = max(j.policy.quarantine_after or rules.quarantine_after for _, j in todo)
    rows = conn.execute(
        select(attempts.c.job_id, attempts.c.attempt_no, attempts.c.fingerprint, attempts.c.reason)
        .where(
            dialects.one_of(conn, attempts.c.job_id, [a.job_id for a, _ in todo]),
            or_(
                and_(attempts.c.state == A.FAILED, attempts.c.failure_class == FC.UNKNOWN),
                attempts.c.reason == model.NEVER_LAUNCHED,
            ),
        )
        .order_by(attempts.c.job_id, attempts.c.attempt_no.desc())
    ).all()
    prints = {(r.job_id, r.attempt_no): r.fingerprint for r in rows if model.charged(r.reason)}
    skip = {(r.job_id, r.attempt_no) for r in rows if not model.charged(r.reason)}
    for a, j in todo:
        n = a.attempt_no - 1
        while out[a.id] < longest and n > 0:
            if (a.job_id, n) not in skip:
                if prints.get((a.job_id, n)) != j.failure.fingerprint:
                    break
                out[a.id] += 1
            n -= 1
    return out


def _spend_budget(
    conn: Connection,
    retries: Sequence[tuple[Applied, _Judged]],
    plans: dict[int, _Next],
    now: datetime,
    rules: retry.Retry,
) -> None:
    """Take a token from its queue's budget for every retry; a retry that finds none waits
    until the budget has one for it (its plan's run_at moves, and its reason says so)."""
    if rules.budget is None:
        return
    by_queue: dict[str, list[Applied]] = defaultdict(list)
    for a, j in retries:
        if plans[a.id].to == J.QUEUED:
            by_queue[j.job.queue].append(a)
    for queue in sorted(by_queue):  # one order for every writer: no deadlock on PostgreSQL
        group = by_queue[queue]
        for a, ready in zip(
            group, _budget_take(conn, queue, len(group), now, rules.budget), strict=True
        ):
            p = plans[a.id]
            if ready is None or p.run_at is None or ready <= p.run_at:
                continue
            plans[a.id] = _Next(
                p.to,
                p.reason.replace("; due again after a backoff", "")
                + f"; queue {queue!r} retry budget is empty, so it waits for a token",
                (*p.details, ("budget", "empty"), ("queue", queue)),
                run_at=ready,
                extra_attempt=p.extra_attempt,
            )


def _budget_take(
    conn: Connection, queue: str, n: int, now: datetime, budget: retry.Budget
) -> list[datetime | None]:
    """Take `n` tokens from `queue`'s bucket; for each, when it is paid for (None: at once)."""
    # A queue's budget starts full; from then on first attempts are counted by fence.
    newest = conn.execute(select(func.coalesce(func.max(attempts.c.id), 0))).scalar_one()
    conn.execute(
        dialects.insert_ignore_conflict(conn, retry_budgets, ["queue"]).values(
            queue=queue, tokens=budget.burst, updated_at=now, counted_fence=newest
        )
    )
    row = conn.execute(
        select(retry_budgets).where(retry_budgets.c.queue == queue).with_for_update()
    ).one()
    bucket = retry.Bucket(row.tokens, row.updated_at, row.counted_fence)
    # First attempts since the last count (enough of them fill the bucket: stop there).
    # One started in a transaction that commits after this one is not counted: the budget
    # errs on the side of fewer retries.
    firsts = (
        select(attempts.c.id)
        .join(jobs, jobs.c.id == attempts.c.job_id)
        .where(
            attempts.c.id > bucket.counted_fence,
            attempts.c.id <= newest,
            attempts.c.attempt_no == 1,
            jobs.c.queue == queue,
        )
        .limit(budget.firsts_to_fill(bucket.tokens))
        .subquery()
    )
    counted = conn.execute(select(func.count()).select_from(firsts)).scalar_one()
    tokens = budget.refill(bucket, now, counted)
    ready = []
    for _ in range(n):
        tokens, at = budget.reserve(tokens, now)
        ready.append(at)
    conn.execute(
        update(retry_budgets)
        .where(retry_budgets.c.queue == queue)
        .values(
            tokens=tokens,
            updated_at=max(now, bucket.updated_at),  # two hosts' clocks: never count time twice
            counted_fence=max(newest, bucket.counted_fence),
        )
    )
    return ready


def _per_row(key: Any, at: Mapping[int, datetime | None], default: datetime) -> Any:
    """Each row's own time in one UPDATE: a CASE over the rows' ids."""
    whens = [(key == row_id, literal(t or default, UTCDateTime())) for row_id, t in at.items()]
    return case(*whens, else_=literal(default, UTCDateTime()))


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
    past its lease (a job that sends heartbeats went quiet), or past its deadline
    (`attempt_deadline` from its start for attempts made before deadlines were stored)."""
    stale = or_(
        and_(attempts.c.state == A.LAUNCHING, attempts.c.created_at <= now - launch_grace),
        and_(
            attempts.c.state == A.RUNNING,
            or_(
                attempts.c.last_seen_at <= now - lease_timeout,
                attempts.c.lease_until <= now,
                attempts.c.deadline_at <= now,
                and_(
                    attempts.c.deadline_at.is_(None),
                    attempts.c.started_at <= now - attempt_deadline,
                ),
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
    """Record news of still-running attempts (an observation)."""
    if fences:
        conn.execute(
            update(attempts)
            .where(attempts.c.id.in_(fences), attempts.c.state.in_(ACTIVE))
            .values(last_seen_at=now)
        )


def attempt_heartbeat(
    conn: Connection, *, job_id: int, fence: int, now: datetime
) -> datetime | None:
    """A heartbeat from inside attempt `fence` of job `job_id`: news, and for a job that
    sends heartbeats a lease renewed from now. Returns the new lease end (None when the job
    is not on a lease). Raises StaleFence when the attempt is no longer its job's current
    one (it must stop), NotFound when there is no such attempt."""
    row = conn.execute(
        select(attempts.c.state, attempts.c.attempt_no, attempts.c.lease_seconds).where(
            attempts.c.id == fence, attempts.c.job_id == job_id
        )
    ).first()
    if row is None:
        raise errors.NotFound(f"job {job_id} has no attempt with fence {fence}")
    # The lease's length was fixed at the claim, from the job and corral's settings: a
    # heartbeat only says when it was sent.
    lease = None if row.lease_seconds is None else now + timedelta(seconds=row.lease_seconds)
    changed = conn.execute(
        update(attempts)
        .where(attempts.c.id == fence, attempts.c.state.in_(ACTIVE))
        .values(last_seen_at=now, lease_until=lease)
    ).rowcount
    if not changed:
        newest = conn.execute(
            select(func.max(attempts.c.id)).where(attempts.c.job_id == job_id)
        ).scalar_one()
        current = f"; the job's newest attempt has fence {newest}" if newest != fence else ""
        raise errors.StaleFence(
            f"fence {fence} is stale: attempt {row.attempt_no} of job {job_id} is"
            f" {row.state}{current}; stop this attempt"
        )
    return lease


def attempt_wait(
    conn: Connection, *, fences: Sequence[int], now: datetime, reason: str
) -> list[int]:
    """Unknown state, policy `wait`: each fence still running is left alone until its
    deadline (its lease runs to the deadline), and the run log says so, once per silence:
    an attempt whose lease already runs to its deadline is not written again (news, such
    as a heartbeat, renews the lease and ends the silence). Returns the fences written."""
    if not fences:
        return []
    not_yet = or_(
        attempts.c.lease_until.is_distinct_from(attempts.c.deadline_at),
        attempts.c.deadline_at.is_(None),
    )
    done = conn.execute(
        update(attempts)
        .where(dialects.one_of(conn, attempts.c.id, fences), attempts.c.state == A.RUNNING, not_yet)
        .values(lease_until=attempts.c.deadline_at)
        .returning(attempts.c.id, attempts.c.job_id)
    ).all()
    event_insert(
        conn,
        [
            event_row(
                job_id=job_id,
                attempt_id=fence,
                entity="attempt",
                frm=A.RUNNING,
                to=A.RUNNING,
                reason=reason,
                now=now,
                details={"unknown": "wait"},
            )
            for fence, job_id in done
        ],
    )
    return [fence for fence, _ in done]


def attempt_supersede(
    conn: Connection, *, fences: Sequence[int], now: datetime, reason: str
) -> list[int]:
    """Unknown state, policy `fence_and_relaunch`: each running attempt of `fences` whose job
    has attempts left is superseded, and its job queued at once for a new attempt, whose
    higher fence makes sinks refuse the old one's writes. The superseded attempt ran, so it
    is charged. Returns the superseded fences; the others (no attempts left) are left as
    they are."""
    left = jobs.c.attempt_count - jobs.c.uncharged_attempts < jobs.c.max_attempts
    return _supersede(
        conn,
        fences=fences,
        expected=A.RUNNING,
        where=[left],
        now=now,
        reason=reason,
        job_reason=f"relaunch with a higher fence: {reason}",
    )


def attempt_never_launched(
    conn: Connection, *, fences: Sequence[int], now: datetime, why: str
) -> list[int]:
    """Attempts that never reached their platform and can no longer be launched (their
    deadline, fixed at the claim, passed first): each still `launching` is superseded with
    the reason model.NEVER_LAUNCHED, and its job queued at once for a new attempt, with a
    higher fence and a fresh deadline. It is not charged: the job's uncharged_attempts
    grows, so neither max_attempts nor the retry budget pays for it. Returns the
    superseded fences; one that moved meanwhile (adopted, cancelled) is left alone."""
    return _supersede(
        conn,
        fences=fences,
        expected=A.LAUNCHING,
        now=now,
        reason=f"{model.NEVER_LAUNCHED}: {why}; not charged",
        job_reason=f"new attempt: the last one {model.NEVER_LAUNCHED} ({why}); not charged",
        attempt_reason=model.NEVER_LAUNCHED,
        job_values={"uncharged_attempts": jobs.c.uncharged_attempts + 1},
    )


def _supersede(
    conn: Connection,
    *,
    fences: Sequence[int],
    expected: model.AttemptState,
    now: datetime,
    reason: str,
    job_reason: str,
    where: Sequence[Any] = (),
    attempt_reason: str | None = None,
    job_values: Mapping[str, Any] | None = None,
) -> list[int]:
    """Supersede each current attempt of `fences` still in `expected` (and meeting
    `where`), and queue its job at once for a new attempt. Returns the superseded fences."""
    dialects.lock_in_order(conn, attempts, fences)
    rows = conn.execute(
        select(attempts.c.id)
        .join(jobs, jobs.c.id == attempts.c.job_id)
        .where(
            dialects.one_of(conn, attempts.c.id, fences),
            attempts.c.state == expected,
            jobs.c.state == J.RUNNING,
            jobs.c.attempt_count == attempts.c.attempt_no,
            *where,
        )
    ).all()
    if not rows:
        return []
    values: dict[str, Any] = {"finished_at": now}
    if attempt_reason is not None:
        values["reason"] = attempt_reason
    applied = transition(
        conn,
        entity="attempt",
        ids=[r.id for r in rows],
        expected=expected,
        to=A.SUPERSEDED,
        now=now,
        reason=reason,
        values=values,
    )
    transition(
        conn,
        entity="job",
        ids=[a.job_id for a in applied],
        expected=J.RUNNING,
        to=J.QUEUED,
        now=now,
        reason=job_reason,
        values={"run_at": now, **(job_values or {})},
        attempt_nos=[a.attempt_no for a in applied],
        attempt_ids=[a.id for a in applied],
    )
    return [a.id for a in applied]


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


# --- quarantine ----------------------------------------------------------------------------------


def job_unquarantine(
    conn: Connection, *, job_id: int, to: model.JobState, now: datetime, reason: str
) -> None:
    """A person decides on a quarantined job: back to `queued` now (with one more attempt
    if it had none left), or `cancelled` to give up on it."""
    _quarantined(conn, job_id)
    charged = jobs.c.attempt_count - jobs.c.uncharged_attempts
    values: dict[str, Any] = {}
    if to == J.QUEUED:
        values = {
            "run_at": now,
            "max_attempts": case(
                (jobs.c.max_attempts > charged, jobs.c.max_attempts),
                else_=charged + 1,
            ),
        }
    transition(
        conn,
        entity="job",
        ids=[job_id],
        expected=J.QUARANTINED,
        to=to,
        now=now,
        reason=reason,
        values=values,
    )


def _quarantined(conn: Connection, job_id: int) -> None:
    job = job_get(conn, job_id=job_id)
    if job.state != J.QUARANTINED:
        raise errors.InvalidInput(
            f"job {job_id} is {job.state}, not quarantined; `corral dead list` shows the"
            " quarantined jobs"
        )


# --- reads --------------------------------------------------------------------------------------


def job_get(conn: Connection, *, job_id: int) -> model.Job:
    row = conn.execute(select(jobs).where(jobs.c.id == job_id)).first()
    if row is None:
        raise errors.NotFound(f"no job with id {job_id}")
    return job_from_row(row._mapping)


def job_list(
    conn: Connection,
    *,
    states: Iterable[str] = (),
    limit: int = 100,
    queue: str | None = None,
    tenant: str | None = None,
    pool: str | None = None,
) -> list[model.Job]:
    """Newest jobs first, optionally only those in `states`, of `queue`, `tenant`, `pool`."""
    stmt = select(jobs).order_by(jobs.c.id.desc()).limit(limit)
    if states := list(states):
        stmt = stmt.where(jobs.c.state.in_(states))
    for column, value in ((jobs.c.queue, queue), (jobs.c.tenant, tenant), (jobs.c.pool, pool)):
        if value is not None:
            stmt = stmt.where(column == value)
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
    cls = row.get("failure_class")
    return model.Attempt(
        **{**row, "state": A(row["state"]), "failure_class": FC(cls) if cls else None}
    )


# --- checkpoints -------------------------------------------------------------------------------


def checkpoint_save(
    conn: Connection, *, job_id: int, fence: int, state: Any, now: datetime
) -> None:
    """Keep `state` as job `job_id`'s checkpoint, written by attempt `fence`. Refused with
    StaleFence when a newer attempt of the job exists or has saved: an attempt that was
    replaced cannot roll its successor's progress back. The job's row is locked first, so
    a relaunch cannot slip between the check and the write."""
    # A claim updates the job's row: locking it first orders this check against a
    # relaunch committing meanwhile (PostgreSQL; SQLite writers never overlap).
    dialects.lock_in_order(conn, jobs, [job_id])
    newest = conn.execute(
        select(func.max(attempts.c.id)).where(attempts.c.job_id == job_id)
    ).scalar_one_or_none()
    if newest is None:
        raise errors.NotFound(f"job {job_id} has no attempts: no checkpoint to keep")
    if fence < newest:
        raise errors.StaleFence(
            f"fence {fence} is stale: job {job_id}'s newest attempt has fence {newest};"
            " its checkpoint is not this attempt's to write"
        )
    insert = dialects.upsert(conn, checkpoints)
    stmt = (
        insert.values(job_id=job_id, fence=fence, state=state, saved_at=now)
        .on_conflict_do_update(
            index_elements=[checkpoints.c.job_id],
            set_={"fence": fence, "state": state, "saved_at": now},
            where=checkpoints.c.fence <= fence,
        )
        .returning(checkpoints.c.job_id)
    )
    if conn.execute(stmt).first() is None:
        held = conn.execute(
            select(checkpoints.c.fence).where(checkpoints.c.job_id == job_id)
        ).scalar_one()
        raise errors.StaleFence(
            f"fence {fence} is stale: job {job_id}'s checkpoint was saved by fence {held}"
        )


def checkpoint_load(conn: Connection, *, job_id: int) -> tuple[int, Any] | None:
    """Job `job_id`'s checkpoint: the fence that saved it and its state; None if none."""
    row = conn.execute(
        select(checkpoints.c.fence, checkpoints.c.state).where(checkpoints.c.job_id == job_id)
    ).first()
    return None if row is None else (int(row.fence), row.state)


# --- publish pointers ---------------------------------------------------------------------


def pointer_swap(
    conn: Connection,
    *,
    dataset: str,
    fence: int,
    location: str,
    code_version: str | None,
    now: datetime,
) -> model.Pointer | int:
    """Point `dataset` at `location`, published by attempt `fence`: a compare-and-swap
    that applies when the stored fence is lower, or there is none (or it is this same
    publish again: same fence and location, so a retried publish is not refused).
    Returns the pointer it wrote, else the fence that holds the pointer."""
    insert = dialects.upsert(conn, publish_pointers)
    values = {"fence": fence, "location": location, "code_version": code_version}
    held = publish_pointers.c
    stmt = (
        insert.values(dataset=dataset, published_at=now, **values)
        .on_conflict_do_update(
            index_elements=[held.dataset],
            set_={**values, "published_at": now},
            where=(held.fence < fence) | ((held.fence == fence) & (held.location == location)),
        )
        .returning(*publish_pointers.c)
    )
    row = conn.execute(stmt).first()
    if row is not None:
        return _pointer(row)
    return int(conn.execute(select(held.fence).where(held.dataset == dataset)).scalar_one())


def pointer_get(conn: Connection, *, dataset: str) -> model.Pointer | None:
    """Where `dataset` points now, and who put it there."""
    row = conn.execute(
        select(publish_pointers).where(publish_pointers.c.dataset == dataset)
    ).first()
    return None if row is None else _pointer(row)


def _pointer(row: Any) -> model.Pointer:
    return model.Pointer(
        dataset=row.dataset,
        fence=int(row.fence),
        location=row.location,
        code_version=row.code_version,
        published_at=row.published_at,
    )
