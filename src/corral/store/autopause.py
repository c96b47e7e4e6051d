"""Auto-pause in the scheduler's pass: a due schedule whose last firings' jobs ended badly
(corral.autopause decides) is paused instead of fired, with its reason and an event.

Why here, and not where a job ends: a schedule's jobs end on many paths (a completion, the
reconciler, a worker, a cancel), each batched its own way, and what the decision reads is
durable already (the firings and their jobs' states). Read again just before a schedule
would fire, the decision costs one short indexed read per due schedule that has a
pause_after, none for the others, and nothing on the completion path; a crash loses
nothing, as the next pass reads the same rows. It is written in the transaction that would
fire the schedule, whose row that pass holds (SKIP LOCKED on PostgreSQL, the one writer on
SQLite), by compare-and-set on its next due time and on its not being paused: two
schedulers never both pause it, and a schedule paused and resumed meanwhile (its due time
moved, its count begun again) is left as it is. A schedule is paused at the latest when it
would fire again: the firing it would make is the one a pause is for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select, update

from corral import autopause, scheduling, tenancy
from corral.store.events import event_insert, schedule_news
from corral.store.tables import firings, jobs, schedules

F = scheduling.FiringOutcome
PAUSED = "paused"
"""The to_state of the event of a schedule corral paused (entity "schedule")."""


def schedules_auto_pause(
    conn: Connection,
    *,
    due: Sequence[scheduling.Schedule],
    tenants: Mapping[str, tenancy.TenantSettings],
    now: datetime,
) -> set[int]:
    """Pause each of the `due` schedules (held by this transaction) that
    corral.autopause.should_pause says to, with its reason and a `paused` event; the ids of
    those paused, which this pass must not fire."""
    paused: set[int] = set()
    news = []
    for schedule in due:
        limit = autopause.effective(schedule, tenants)
        if limit <= 0:
            continue
        ended = _ended(conn, schedule, limit)
        if not autopause.should_pause(limit, [state for _, state in ended]):
            continue
        why = autopause.reason(schedule, limit, [job_id for job_id, _ in ended])
        if _pause(conn, schedule, why, now):
            paused.add(schedule.id)
            news.append(_paused_news(schedule, why, limit, [i for i, _ in ended], now))
    if news:
        event_insert(conn, news)
    return paused


def _ended(conn: Connection, schedule: scheduling.Schedule, limit: int) -> list[tuple[int, Any]]:
    """The newest `limit` firings' jobs of `schedule` that ended (failed, quarantined or
    succeeded), recorded since its last resume, newest nominal time first: (id, state)."""
    f = firings.c
    stmt = (
        select(jobs.c.id, jobs.c.state)
        .select_from(firings.join(jobs, jobs.c.id == f.job_id))
        .where(
            f.schedule_id == schedule.id,
            f.outcome.in_([F.FIRED.value, F.BACKFILLED.value]),
            jobs.c.state.in_(sorted(s.value for s in autopause.ENDED)),
        )
        .order_by(f.nominal_at.desc())
        .limit(limit)
    )
    if schedule.counted_from is not None:
        stmt = stmt.where(f.recorded_at >= schedule.counted_from)
    return [(job_id, autopause.J(state)) for job_id, state in conn.execute(stmt)]


def _pause(conn: Connection, schedule: scheduling.Schedule, why: str, now: datetime) -> bool:
    """Pause `schedule` if it is as this pass read it (due at the same time, not paused)."""
    s = schedules.c
    return bool(
        conn.execute(
            update(schedules)
            .where(
                s.id == schedule.id,
                s.next_due == schedule.next_due,
                s.paused_at.is_(None),
            )
            .values(paused_at=now, paused_reason=why, updated_at=now)
        ).rowcount
    )


def _paused_news(
    schedule: scheduling.Schedule, why: str, limit: int, job_ids: Sequence[int], now: datetime
) -> dict[str, Any]:
    """The event of a schedule corral paused: names the schedule, what its firings' jobs
    are (queue, executor, labels) for alert rules to match, and how to resume it."""
    return schedule_news(
        schedule,
        to=PAUSED,
        reason=f"schedule {schedule.name!r} {why}; {autopause.how_to_resume(schedule)}",
        now=now,
        details={
            "pause_after": limit,
            "jobs": list(job_ids),
            "resume": autopause.how_to_resume(schedule),
        },
    )
