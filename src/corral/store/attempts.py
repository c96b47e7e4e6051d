"""Attempts after their claim: recorded running, seen, renewed by heartbeats, waited on when
their state is unknown, and listed for recovery. Their supersession and the ends that
queue their job again at once are attempt_ends.py's; their finishes, completions.py's."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from sqlalchemy import Connection, and_, func, or_, select, update

from corral import callbacks, errors, failpoints, model
from corral.store import attempt_ends, dialects, hotpath, parking, tables
from corral.store.events import event_insert, event_row, transition
from corral.store.rows import ACTIVE, attempt_from_row, job_from_row, per_row
from corral.store.tables import (
    attempts,
    jobs,
)

if TYPE_CHECKING:
    from corral import retry as retry_
    from corral.store import completions as completions_
    from corral.store.database import Database

A, J = model.AttemptState, model.JobState


def attempt_record_running(
    conn: Connection,
    *,
    fences: Sequence[int],
    now: datetime,
    reason: str = "launched",
    locked: bool = False,
    sent_by: str | None = None,
) -> list[int]:
    """launching -> running for each fence still launching (the outbox's third step, or
    recovery adopting or relaunching an attempt). A job that sends heartbeats gets its
    whole lease from now: the time it waited to be launched does not count against it.
    Rows are locked in fence order first, as completions lock them, so the two cannot
    deadlock when they write at once (PostgreSQL); `locked`: the caller did that already.
    `sent_by`: the loop that records a blind attempt before it sends it (store/loops.py)."""
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
        values={"started_at": now, "last_seen_at": now}
        | ({"sent_by": sent_by} if sent_by is not None else {}),
    )
    ids = [a.id for a in applied]
    if ids:
        _leases_restart(conn, ids, now)
    return ids


def _leases_restart(conn: Connection, fences: Sequence[int], now: datetime) -> None:
    """Each attempt of `fences` on a lease has all of it from `now`."""
    leased = conn.execute(
        select(attempts.c.id, attempts.c.lease_seconds).where(
            dialects.one_of(conn, attempts.c.id, fences), attempts.c.lease_seconds.is_not(None)
        )
    ).all()
    if leased:
        until = {fence: now + timedelta(seconds=seconds) for fence, seconds in leased}
        conn.execute(
            update(attempts)
            .where(dialects.one_of(conn, attempts.c.id, list(until)))
            .values(lease_until=per_row(attempts.c.id, until, now))
        )


def attempt_list_active(
    conn: Connection, *, executor: str, limit: int, after: int = 0
) -> list[model.Attempt]:
    """Attempts launching or running on `executor`, oldest fence first, after fence `after`."""
    stmt = (
        select(attempts)
        .where(tables.LIVE, attempts.c.executor == executor, attempts.c.id > after)
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
    stale = _recovery_due(now, launch_grace, lease_timeout, attempt_deadline)
    stmt = (
        select(attempts)
        .where(tables.LIVE, stale, attempts.c.id > after)  # LIVE: read from ix_attempts_live
        .order_by(attempts.c.id)
        .limit(limit)
    )
    found = [attempt_from_row(r._mapping) for r in conn.execute(stmt)]
    if not found:
        return []
    job_rows = conn.execute(
        select(jobs).where(dialects.one_of(conn, jobs.c.id, [a.job_id for a in found]))
    )
    by_id = {job.id: job for job in (job_from_row(r) for r in job_rows)}
    return [model.Claimed(by_id[a.job_id], a) for a in found]


def _recovery_due(
    now: datetime, launch_grace: timedelta, lease_timeout: timedelta, attempt_deadline: timedelta
) -> Any:
    """The condition of an attempt recovery must look at (attempt_list_for_recovery)."""
    return or_(
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


def attempt_note(conn: Connection, *, notes: Mapping[int, str | None], now: datetime) -> list[int]:
    """Why running attempts wait on their platform (`notes`: a pod that has not started,
    and why; None: it has started since), each an event in its run log (details
    `waiting`: true, or false once started), which `corral jobs explain` reads. Attempts
    no longer running are left alone; the caller notes a reason once, not at every look.
    Returns the fences written."""
    if not notes:
        return []
    found = conn.execute(
        select(attempts.c.id, attempts.c.job_id).where(
            dialects.one_of(conn, attempts.c.id, list(notes)), attempts.c.state == A.RUNNING
        )
    ).all()
    return _note_running(
        conn,
        [(fence, job_id) for fence, job_id in found],
        now=now,
        reason=lambda fence: notes[fence] or "started on its platform",
        details=lambda fence: {"waiting": notes[fence] is not None},
    )


def _note_running(
    conn: Connection,
    written: Sequence[tuple[int, int]],
    *,
    now: datetime,
    reason: Callable[[int], str],
    details: Callable[[int], dict[str, Any]],
) -> list[int]:
    """An event in the run log of each running attempt of `written` ((fence, job id)
    pairs), its state unchanged, with the reason and details it gets by fence. Returns
    the fences written."""
    event_insert(
        conn,
        [
            event_row(
                job_id=job_id,
                attempt_id=fence,
                entity="attempt",
                frm=A.RUNNING,
                to=A.RUNNING,
                reason=reason(fence),
                now=now,
                details=details(fence),
            )
            for fence, job_id in written
        ],
    )
    return [fence for fence, _ in written]


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
        _stale(conn, job_id=job_id, fence=fence, attempt_no=row.attempt_no, state=row.state)
    return lease


def attempt_check(conn: Connection, *, job_id: int, fence: int) -> None:
    """Attempt `fence` of job `job_id` is active (launching or running): a call made from
    inside it may act. StaleFence when it ended or a newer attempt exists, NotFound when
    there is no such attempt."""
    row = conn.execute(
        select(attempts.c.state, attempts.c.attempt_no).where(
            attempts.c.id == fence, attempts.c.job_id == job_id
        )
    ).first()
    if row is None:
        raise errors.NotFound(f"job {job_id} has no attempt with fence {fence}")
    if row.state not in ACTIVE:
        _stale(conn, job_id=job_id, fence=fence, attempt_no=row.attempt_no, state=row.state)


def _stale(conn: Connection, *, job_id: int, fence: int, attempt_no: int, state: str) -> NoReturn:
    newest = conn.execute(
        select(func.max(attempts.c.id)).where(attempts.c.job_id == job_id)
    ).scalar_one()
    current = f"; the job's newest attempt has fence {newest}" if newest != fence else ""
    raise errors.StaleFence(
        f"fence {fence} is stale: attempt {attempt_no} of job {job_id} is"
        f" {state}{current}; stop this attempt"
    )


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
    return _note_running(
        conn,
        [(fence, job_id) for fence, job_id in done],
        now=now,
        reason=lambda _: reason,
        details=lambda _: {"unknown": "wait"},
    )


def attempt_list(conn: Connection, *, job_id: int) -> list[model.Attempt]:
    stmt = select(attempts).where(attempts.c.job_id == job_id).order_by(attempts.c.id)
    return [attempt_from_row(r._mapping) for r in conn.execute(stmt)]


def _ended(outcomes: Sequence[completions_.Outcome]) -> None:
    """The failpoint `after_job_end`, once a write that ended jobs (and made their
    callback jobs) has committed."""
    if any(o.job_state in callbacks.SENT_ON for o in outcomes):
        failpoints.hit("after_job_end")


# --- the handle ----------------------------------------------------------------------------


class Attempts:
    """The store's handle on attempts (`store.attempts`): their ends (completions.py,
    attempt_ends.py), the news of them, and the reads; each call one transaction.

    Each method runs the store function its name shortens (`heartbeat`: attempt_heartbeat),
    named in its body; that function's docstring says what the call does.
    """

    def __init__(self, db: Database) -> None:
        self._db = db

    async def settle(
        self,
        *,
        launched: Sequence[int],
        finishes: Sequence[completions_.Finish],
        now: datetime,
        retry: retry_.Retry | None = None,
    ) -> tuple[list[int], list[completions_.Outcome]]:
        """Apply `finishes`, then record `launched` attempts still launching as running.
        On PostgreSQL, when every finish is a success, one statement (hotpath.POSTGRESQL.settle)."""
        from corral.store import completions as completions_  # it imports this module

        if all(f.state == A.SUCCEEDED for f in finishes):  # the hot path (hotpath.py)
            ran, outcomes = await self._settle_won(launched=launched, finishes=finishes, now=now)
        else:
            settle = functools.partial(
                completions_.attempt_settle,
                launched=launched,
                finishes=finishes,
                now=now,
                retry=retry,
            )
            ran, outcomes = await self._db.tx(settle)
        _ended(outcomes)
        return ran, outcomes

    async def _settle_won(
        self, *, launched: Sequence[int], finishes: Sequence[completions_.Finish], now: datetime
    ) -> tuple[list[int], list[completions_.Outcome]]:
        from corral.store import completions as completions_

        won = [(f.fence, f.exit_code, f.reason) for f in finishes]
        logs = {f.fence: f.output for f in finishes if f.output and f.output.kept}
        if won:
            failpoints.hit("mid_completion")  # one transaction: nothing half-written
        ran, done, later = await self._db.hot(
            functools.partial(
                hotpath.SQLITE.settle, launched=launched, won=won, logs=logs, now=now
            ),
            functools.partial(
                hotpath.POSTGRESQL.settle, launched=launched, won=won, logs=logs, now=now
            ),
        )
        outcomes = [completions_.Outcome(j, f, n, A.SUCCEEDED, J.SUCCEEDED) for j, f, n in done]
        if later:  # jobs with a callback: the general settle makes it with their end
            left = set(later)
            settle = functools.partial(
                completions_.attempt_settle,
                launched=[fence for fence in launched if fence in left],
                finishes=[f for f in finishes if f.fence in left],
                now=now,
            )
            more_ran, more = await self._db.tx(settle)
            ran, outcomes = ran + more_ran, outcomes + more
        return ran, outcomes

    async def finish(
        self,
        *,
        finishes: Sequence[completions_.Finish],
        now: datetime,
        retry: retry_.Retry | None = None,
    ) -> list[completions_.Outcome]:
        from corral.store import completions as completions_

        if not finishes:
            return []
        if all(f.state == A.SUCCEEDED for f in finishes):
            _, outcomes = await self.settle(launched=(), finishes=finishes, now=now)
            return outcomes
        finish = functools.partial(
            completions_.attempt_finish, finishes=finishes, now=now, retry=retry
        )
        outcomes = await self._db.tx(finish)
        _ended(outcomes)
        return outcomes

    async def record_running(
        self,
        *,
        fences: Sequence[int],
        now: datetime,
        reason: str = "launched",
        sent_by: str | None = None,
    ) -> list[int]:
        return await self._db.tx(
            functools.partial(
                attempt_record_running, fences=fences, now=now, reason=reason, sent_by=sent_by
            )
        )

    async def list_for_recovery(
        self,
        *,
        now: datetime,
        launch_grace: timedelta,
        lease_timeout: timedelta,
        attempt_deadline: timedelta,
        limit: int,
        after: int = 0,
    ) -> list[model.Claimed]:
        return await self._db.tx(
            functools.partial(
                attempt_list_for_recovery,
                now=now,
                launch_grace=launch_grace,
                lease_timeout=lease_timeout,
                attempt_deadline=attempt_deadline,
                limit=limit,
                after=after,
            )
        )

    async def states(self, *, fences: Sequence[int]) -> dict[int, Status]:
        return await self._db.tx(functools.partial(attempt_states, fences=fences))

    async def seen(self, *, fences: Sequence[int], now: datetime) -> None:
        await self._db.tx(functools.partial(attempt_seen, fences=fences, now=now))

    async def note(self, *, notes: Mapping[int, str | None], now: datetime) -> list[int]:
        return await self._db.tx(functools.partial(attempt_note, notes=notes, now=now))

    async def heartbeat(self, *, job_id: int, fence: int, now: datetime) -> datetime | None:
        return await self._db.tx(
            functools.partial(attempt_heartbeat, job_id=job_id, fence=fence, now=now)
        )

    async def wait(self, *, fences: Sequence[int], now: datetime, reason: str) -> list[int]:
        return await self._db.tx(
            functools.partial(attempt_wait, fences=fences, now=now, reason=reason)
        )

    async def supersede(self, *, fences: Sequence[int], now: datetime, reason: str) -> list[int]:
        return await self._db.tx(
            functools.partial(attempt_ends.attempt_supersede, fences=fences, now=now, reason=reason)
        )

    async def check(self, *, job_id: int, fence: int) -> None:
        await self._db.read(functools.partial(attempt_check, job_id=job_id, fence=fence))

    async def never_launched(
        self, *, fences: Sequence[int], now: datetime, why: str, recorded: bool = False
    ) -> list[int]:
        return await self._db.tx(
            functools.partial(
                attempt_ends.attempt_never_launched,
                fences=fences,
                now=now,
                why=why,
                recorded=recorded,
            )
        )

    async def list_active(
        self, *, executor: str, limit: int, after: int = 0
    ) -> list[model.Attempt]:
        return await self._db.tx(
            functools.partial(attempt_list_active, executor=executor, limit=limit, after=after)
        )

    async def hand_back(self, *, fences: Sequence[int], now: datetime) -> list[int]:
        return await self._db.tx(
            functools.partial(attempt_ends.attempt_hand_back, fences=fences, now=now)
        )

    async def park(
        self, *, fences: Sequence[int], task: str, version: int, now: datetime, why: str
    ) -> list[int]:
        return await self._db.tx(
            functools.partial(
                parking.attempt_park, fences=fences, task=task, version=version, now=now, why=why
            )
        )

    async def list(self, *, job_id: int) -> list[model.Attempt]:
        return await self._db.lookup(functools.partial(attempt_list, job_id=job_id))
