"""The run log: every state change goes through `transition`, a compare-and-set that
appends one event per row it moved, in the same transaction; and the news without a
change of state (`event_note`)."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, and_, select, update

from corral import model, scheduling
from corral.store import dialects
from corral.store.tables import (
    attempts,
    events,
    jobs,
)

if TYPE_CHECKING:
    from corral.store.database import Database

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
    values = {"state": to, "updated_at": now, **(values or {})}
    stmt = _compare_and_set(conn, entity, ids, expected, values, attempt_nos, where)
    applied = [Applied(*row) for row in conn.execute(stmt)]
    by_id: dict[int, int | None] = {}
    if attempt_ids is not None:
        by_id = dict(zip(ids, attempt_ids, strict=True))
    line = functools.partial(
        event_row, entity=entity, frm=expected, to=to, reason=reason, now=now, details=details
    )
    if entity == "attempt":  # an attempt's event names the attempt itself
        by_id = {a.id: a.id for a in applied}
    event_insert(conn, [line(job_id=a.job_id, attempt_id=by_id.get(a.id)) for a in applied])
    return applied


def _compare_and_set(
    conn: Connection,
    entity: model.Entity,
    ids: Sequence[int],
    expected: str,
    values: Mapping[str, Any],
    attempt_nos: Sequence[int] | None,
    where: Sequence[Any],
) -> Any:
    """The UPDATE of `transition`: the rows of `ids` still in `expected` (and, for jobs
    with `attempt_nos`, still on that attempt) get `values`; it returns each row's id, job
    and attempt number."""
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
    return update(table).where(and_(*conditions)).values(**values).returning(table.c.id, *cols)


NO_JOB = 0
"""The job_id of an event that is no job's: a schedule's news (entity "schedule")."""


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


def schedule_news(
    schedule: scheduling.Schedule,
    *,
    to: str,
    reason: str,
    now: datetime,
    details: Mapping[str, Any],
) -> dict[str, Any]:
    """The event of something that happened to a schedule (no job's): it names the
    schedule and what its firings' jobs are (queue, executor, labels), which alert rules
    match on, then `details`."""
    template = schedule.template
    about = {
        "schedule": schedule.name,
        "tenant": schedule.tenant,
        "queue": str(template.get("queue") or "default"),
        "executor": str(template.get("executor") or ""),
        "labels": dict(template.get("labels") or {}),
    }
    return event_row(
        job_id=NO_JOB,
        attempt_id=None,
        entity="schedule",
        frm=None,
        to=to,
        reason=reason,
        now=now,
        details={**about, **details},
    )


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


def event_list(conn: Connection, *, job_id: int) -> list[model.Event]:
    stmt = select(events).where(events.c.job_id == job_id).order_by(events.c.id)
    return [model.Event(**{**r._mapping}) for r in conn.execute(stmt)]


def event_page(
    conn: Connection,
    *,
    after: int,
    limit: int,
    job_id: int | None = None,
    tenant: str | None = None,
) -> tuple[list[int], list[model.Event]]:
    """The ids of the next `limit` events after `after` (to see gaps by), and of those the
    events of `tenant`'s jobs (a schedule's news only when no tenant is given), in id
    order; or the next `limit` events of `job_id`, and their ids."""
    if job_id is not None:  # one job's: its own index, no gaps to see
        stmt = (
            select(events)
            .where(events.c.job_id == job_id, events.c.id > after)
            .order_by(events.c.id)
            .limit(limit)
        )
        found = [model.Event(**{**r._mapping}) for r in conn.execute(stmt)]
        return [e.id for e in found], found
    ids = list(
        conn.execute(
            select(events.c.id).where(events.c.id > after).order_by(events.c.id).limit(limit)
        ).scalars()
    )
    if not ids:
        return [], []
    stmt = select(events).where(events.c.id > after, events.c.id <= ids[-1]).order_by(events.c.id)
    if tenant is not None:
        mine = select(jobs.c.id).where(jobs.c.tenant == tenant, jobs.c.id == events.c.job_id)
        stmt = stmt.where(mine.exists())
    return ids, [model.Event(**{**r._mapping}) for r in conn.execute(stmt)]


# --- the handle ----------------------------------------------------------------------------


class Events:
    """The store's handle on the run log's events (`store.events`): each state change and
    note in a transaction of its own, and the reads.

    Each method runs the store function its name shortens (`page`: event_page),
    named in its body; that function's docstring says what the call does.
    """

    def __init__(self, db: Database) -> None:
        self._db = db

    async def transition(
        self,
        *,
        entity: model.Entity,
        ids: Sequence[int],
        expected: str,
        to: str,
        now: datetime,
        reason: str,
        values: Mapping[str, Any] | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """`transition` in its own transaction; returns the ids that changed."""
        move = functools.partial(
            transition,
            entity=entity,
            ids=ids,
            expected=expected,
            to=to,
            now=now,
            reason=reason,
            values=values,
            details=details,
        )
        return [a.id for a in await self._db.tx(move)]

    async def note(
        self,
        *,
        job_id: int,
        attempt_id: int | None,
        state: str,
        reason: str,
        now: datetime,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        await self._db.tx(
            functools.partial(
                event_note,
                job_id=job_id,
                attempt_id=attempt_id,
                state=state,
                reason=reason,
                now=now,
                details=details,
            )
        )

    async def page(
        self, *, after: int, limit: int, job_id: int | None = None, tenant: str | None = None
    ) -> tuple[list[int], list[model.Event]]:
        return await self._db.read(
            functools.partial(event_page, after=after, limit=limit, job_id=job_id, tenant=tenant)
        )

    async def list(self, *, job_id: int) -> list[model.Event]:
        return await self._db.lookup(functools.partial(event_list, job_id=job_id))


def jobs_follow(
    conn: Connection,
    applied: Sequence[Applied],
    *,
    to: model.JobState,
    now: datetime,
    reason: str,
    details: Mapping[str, Any] | None,
    values: Mapping[str, Any],
) -> list[Applied]:
    """Move the running jobs of the attempts `applied` ended to `to`, fenced to those
    attempts (a job that moved on to a newer one is left alone): the job's half of every
    attempt end, a retry's, a loss's and a supersession's alike."""
    return transition(
        conn,
        entity="job",
        ids=[a.job_id for a in applied],
        expected=J.RUNNING,
        to=to,
        now=now,
        reason=reason,
        details=details,
        values=values,
        attempt_nos=[a.attempt_no for a in applied],
        attempt_ids=[a.id for a in applied],
    )
