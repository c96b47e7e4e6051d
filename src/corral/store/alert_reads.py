"""What the alerter reads before it decides: its cursor, the events after it with their
jobs' facts (the successes only of the subjects a success can change), and the rules muted.

Apart from alerts.py (the outbox the alerter writes, its deliveries and the mutes it is
told of), as these are the reads of each pass, on events and jobs, in one transaction.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, and_, func, or_, select

from corral import model, scheduling
from corral.store import alert_subjects, dialects
from corral.store.tables import alert_cursors, alert_mutes, alert_streaks, attempts, events, jobs

J = model.JobState
ST = alert_streaks.c


def alert_cursor(conn: Connection, *, name: str) -> int | None:
    """How far the alerter `name` has read the events (None: it never has)."""
    found = conn.execute(select(alert_cursors.c.event_id).where(alert_cursors.c.name == name))
    return found.scalar()


@dataclass(frozen=True, slots=True)
class JobFacts:
    """What rules match a job on (corral.alerts.rules): a few of its columns, read for
    the events that can make a message, not its whole row."""

    id: int
    queue: str
    tenant: str
    executor: str
    labels: Mapping[str, str]
    schedule: str | None  # the schedule a firing's job is for (its payload says)
    nominal: datetime | None = None  # and its nominal time
    spec: Mapping[str, Any] = field(default_factory=dict)  # what it runs (a message says it)
    attempt_no: int | None = None  # its newest attempt, and how that one ended
    attempt_reason: str | None = None
    idempotency_key: str | None = None  # its subject when it is of no schedule


@dataclass(frozen=True, slots=True)
class EventsRead:
    """What one read of the events found after a cursor: the ids of all of them in order
    (to see the gaps by), of those the events that can make a message with their jobs'
    facts (None once a job is gone), when each event right after a gap happened, and the
    subjects whose successes were read with them (`open`, see alert_events)."""

    ids: list[int]
    found: list[tuple[model.Event, JobFacts | None]]
    at_after_gap: dict[int, datetime]
    open: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class AlertRead:
    """What an alerter reads in one transaction: its cursor (None: it has none yet), the
    events after it, and the rules muted now."""

    cursor: int | None
    events: EventsRead
    muted: dict[str, datetime]


def alert_read(
    conn: Connection, *, name: str, limit: int, now: datetime, with_starts: bool = False
) -> AlertRead:
    """The alerter `name`'s cursor, the next `limit` events after it (alert_events), and
    the rules muted at `now`: one transaction, one trip to the store's thread."""
    cursor = alert_cursor(conn, name=name)
    if cursor is None:
        return AlertRead(None, EventsRead([], [], {}), {})
    read = alert_events(conn, after=cursor, limit=limit, with_starts=with_starts)
    return AlertRead(cursor, read, alert_muted(conn, now=now))


def alert_events(
    conn: Connection, *, after: int, limit: int, with_starts: bool = False
) -> EventsRead:
    """The next `limit` events after `after`: their ids, and those that can make a
    message, with their jobs' facts. Successes are most events, and matter only to a
    subject that owes a recovered message or counts a streak (alert_open): only theirs
    are read here; one a failure read here opens is read with alert_successes."""
    ids = list(
        conn.execute(
            select(events.c.id).where(events.c.id > after).order_by(events.c.id).limit(limit)
        ).scalars()
    )
    if not ids:
        return EventsRead([], [], {})
    found = [
        _found(r)
        for r in conn.execute(_events_read(conn, after, ids[-1], _may_matter(with_starts)))
    ]
    open_now = frozenset(alert_open(conn))
    if open_now:
        successes = alert_successes(conn, after=after, upto=ids[-1], subjects=open_now)
        found = sorted([*found, *successes], key=lambda f: f[0].id)
    after_gap = [i for prev, i in zip([after, *ids], ids, strict=False) if i != prev + 1]
    at_after_gap: dict[int, datetime] = {}
    if after_gap:
        at_after_gap = dict(
            conn.execute(
                select(events.c.id, events.c.at).where(
                    dialects.one_of(conn, events.c.id, after_gap)
                )
            ).all()
        )
    return EventsRead(ids, found, at_after_gap, open_now)


def alert_successes(
    conn: Connection, *, after: int, upto: int, subjects: Collection[str]
) -> list[tuple[model.Event, JobFacts | None]]:
    """The successes among the events after `after` up to `upto` of the jobs of
    `subjects` (their schedules, idempotency keys and jobs), in id order, with the jobs'
    facts. A subject of an older corral (a queue's) has no successes any more."""
    ours = _of_subjects(conn, subjects)
    if ours is None:
        return []
    wanted = set(subjects)
    read = conn.execute(_events_read(conn, after, upto, and_(_succeeded(), ours)))
    return [f for f in map(_found, read) if f[1] is not None and _subjects_of(f[1]) & wanted]


def _subjects_of(job: JobFacts) -> set[str]:
    return alert_subjects.job_subjects(job.tenant, job.id, job.schedule, job.idempotency_key)


KEY_CHARS = alert_subjects.SUBJECT_CHARS - len("key:/")
"""A key longer than this less its tenant's name is in a subject by its hash."""


def _of_subjects(conn: Connection, subjects: Collection[str]) -> ColumnElement[bool] | None:
    """The jobs of `subjects`, as SQL (None: none): one list of job ids, and a (tenant,
    name) test for each schedule and key; a superset where a key is hashed."""
    wanted: list[ColumnElement[bool]] = []
    ids: list[int] = []
    for s in sorted(subjects):
        kind, tenant, name = alert_subjects.subject_parts(s)
        if kind == "job" and name.isdigit():
            ids.append(int(name))
        elif kind == "key" and tenant:
            wanted.append(and_(jobs.c.tenant == tenant, jobs.c.idempotency_key == name))
        elif kind == "keyhash" and tenant:  # a long key: its tenant's keyed jobs, then its hash
            long_key = func.length(jobs.c.idempotency_key) > KEY_CHARS - len(tenant)
            wanted.append(and_(jobs.c.tenant == tenant, long_key))
        elif kind == "schedule" and tenant:
            wanted.append(and_(jobs.c.tenant == tenant, _schedule_of(conn) == name))
    if len(ids) > ONE_OFF_IDS:  # every success of their tenants: alert_successes picks
        tenants = sorted({alert_subjects.subject_parts(s)[1] for s in subjects})
        wanted.append(jobs.c.tenant.in_(tenants))
    elif ids:
        wanted.append(dialects.one_of(conn, jobs.c.id, ids))
    return or_(*wanted) if wanted else None


ONE_OFF_IDS = 1000
"""Most jobs (subjects of their own) a read of successes names by id; past it, the read
takes their tenants' successes and keeps theirs (a statement stays under SQLite's limit
of parameters however many jobs were alerted on)."""


def _schedule_of(conn: Connection) -> ColumnElement[Any]:
    return dialects.json_text(conn, jobs.c.payload, scheduling.FIRING, "schedule")


def _events_read(conn: Connection, after: int, upto: int, which: ColumnElement[bool]) -> Any:
    nominal = dialects.json_text(conn, jobs.c.payload, scheduling.FIRING, "nominal_time")
    facts = (
        jobs.c.queue,
        jobs.c.tenant,
        jobs.c.executor,
        jobs.c.labels,
        jobs.c.spec,
        jobs.c.idempotency_key,
    )
    newest = (
        select(attempts.c.reason)
        .where(attempts.c.job_id == jobs.c.id, attempts.c.attempt_no == jobs.c.attempt_count)
        .scalar_subquery()
    )
    return (
        select(
            events,
            *[c.label(f"j_{c.name}") for c in facts],
            jobs.c.attempt_count.label("j_attempt_no"),
            newest.label("j_attempt_reason"),
            _schedule_of(conn).label("j_schedule"),
            nominal.label("j_nominal"),
        )
        .outerjoin(jobs, jobs.c.id == events.c.job_id)
        .where(events.c.id > after, events.c.id <= upto, which)
        .order_by(events.c.id)
    )


def _found(row: Any) -> tuple[model.Event, JobFacts | None]:
    m = row._mapping
    event = model.Event(**{c.name: m[c.name] for c in events.c})
    if m["j_queue"] is None:  # the job is gone (or there is none: a schedule's news)
        return event, None
    named, nominal_at = m["j_schedule"], m["j_nominal"]
    return event, JobFacts(
        id=event.job_id,
        queue=m["j_queue"],
        tenant=m["j_tenant"],
        executor=m["j_executor"],
        labels=m["j_labels"],
        schedule=named if isinstance(named, str) else None,
        nominal=_time(nominal_at) if named is not None else None,
        spec=m["j_spec"] or {},
        attempt_no=m["j_attempt_no"] or None,
        attempt_reason=m["j_attempt_reason"],
        idempotency_key=m["j_idempotency_key"],
    )


def alert_open(conn: Connection) -> set[str]:
    """The subjects a success can change for some rule: those owing a recovered message
    or counting a streak. A queue (an older corral's subject) is none: no success is a
    queue's any more, and its row stays as it was."""
    owing = or_(ST.owes_recovery, ST.failures > 0)
    rows = conn.execute(select(ST.subject).where(owing, ~ST.subject.like("queue:%")).distinct())
    return set(rows.scalars())


def alert_muted(conn: Connection, *, now: datetime) -> dict[str, datetime]:
    """The rules muted at `now`, each with when its mute ends (alerts.alert_mute sets it)."""
    rows = conn.execute(select(alert_mutes).where(alert_mutes.c.until > now))
    return {r.rule: r.until for r in rows}


def _may_matter(with_starts: bool) -> ColumnElement[bool]:
    """The events `corral.alerts.rules.happening` may make something of, as SQL, but
    successes (read apart): a lost attempt, a schedule's or a monitor's news, and any
    change or note of a job but its submission and (unless `with_starts`) its start. A
    superset: `happening` decides on each one read."""
    e = events.c
    started = and_(e.to_state == J.RUNNING.value, e.from_state != J.RUNNING.value)
    job = and_(e.entity == "job", e.from_state.is_not(None), ~_succeeded())
    return or_(
        and_(e.entity == "attempt", e.to_state == model.AttemptState.LOST.value),
        e.entity == "schedule",
        e.entity == "monitor",
        and_(job, ~started) if not with_starts else job,
    )


def _succeeded() -> ColumnElement[bool]:
    e = events.c
    return and_(e.entity == "job", e.to_state == J.SUCCEEDED.value, e.from_state.is_not(None))


def _time(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None
