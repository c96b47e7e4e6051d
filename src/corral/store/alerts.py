"""The alerts outbox: what the alerter read of the events (its cursor), the messages and
digests it wrote for them (in the transaction that moves the cursor), their delivery
tries, and muted rules."""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    and_,
    delete,
    func,
    insert,
    or_,
    select,
    tuple_,
    update,
)

from corral import model, scheduling
from corral.store import dialects
from corral.store.events import event_note
from corral.store.tables import (
    PENDING,
    alert_cursors,
    alert_mutes,
    alert_streaks,
    alert_tries,
    alerts,
    attempts,
    events,
    job_slas,
    jobs,
)

if TYPE_CHECKING:
    from corral.store.database import Database

AL = alerts.c
J = model.JobState

Try = tuple[datetime, bool, str | None]
"""A delivery try: when, whether it delivered, and the error if not."""

DIGEST_JOBS = 10
"""How many jobs a digest names; it counts the rest."""


@dataclass(frozen=True, slots=True)
class Alert:
    """One row of the outbox: a message for one channel."""

    id: int
    dedupe_key: str
    rule: str
    channel: str
    kind: str
    cause: str
    subject: str
    job_id: int | None
    details: Mapping[str, Any]
    state: str
    created_at: datetime
    due_at: datetime
    tries: int
    last_error: str | None
    delivered_at: datetime | None


def _alert(row: Any) -> Alert:
    return Alert(**{c.name: row._mapping[c.name] for c in alerts.c})


def alert_cursor(conn: Connection, *, name: str) -> int | None:
    """How far the alerter `name` has read the events (None: it never has)."""
    found = conn.execute(select(alert_cursors.c.event_id).where(alert_cursors.c.name == name))
    return found.scalar()


def event_newest(conn: Connection) -> int:
    """The newest event's id (0 when there is none)."""
    return conn.execute(select(func.max(events.c.id))).scalar() or 0


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


def queue_subject(tenant: str, queue: str) -> str:
    """The subject of a rule's messages about a queue's jobs: a tenant's queue, never
    another tenant's of the same name."""
    return f"queue:{tenant}/{queue}"


def schedule_subject(tenant: str, schedule: str) -> str:
    """The subject of a rule's messages about a schedule (its firings and their jobs)."""
    return f"schedule:{tenant}/{schedule}"


def _may_matter(with_starts: bool) -> ColumnElement[bool]:
    """The events `corral.alerts.rules.happening` may make something of, as SQL, but
    successes (read apart): a lost attempt, a schedule's news, and any change or note of
    a job but its submission and (unless `with_starts`) its start. A superset:
    `happening` decides on each one read."""
    e = events.c
    started = and_(e.to_state == J.RUNNING.value, e.from_state != J.RUNNING.value)
    job = and_(e.entity == "job", e.from_state.is_not(None), ~_succeeded())
    return or_(
        and_(e.entity == "attempt", e.to_state == model.AttemptState.LOST.value),
        e.entity == "schedule",
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
    `subjects` (their queues and schedules), in id order, with the jobs' facts."""
    wanted = []
    for s in sorted(subjects):
        kind, _, about = s.partition(":")
        tenant, slash, name = about.partition("/")
        if kind == "queue" and not slash:  # an older corral's subject: the queue alone
            wanted.append(jobs.c.queue == about)
        elif kind in ("queue", "schedule"):
            what = jobs.c.queue if kind == "queue" else _schedule_of(conn)
            wanted.append(and_(jobs.c.tenant == tenant, what == name))
    if not wanted:
        return []
    ours = or_(*wanted)
    return [
        _found(r) for r in conn.execute(_events_read(conn, after, upto, and_(_succeeded(), ours)))
    ]


def _schedule_of(conn: Connection) -> ColumnElement[Any]:
    return dialects.json_text(conn, jobs.c.payload, scheduling.FIRING, "schedule")


def _events_read(conn: Connection, after: int, upto: int, which: ColumnElement[bool]) -> Any:
    nominal = dialects.json_text(conn, jobs.c.payload, scheduling.FIRING, "nominal_time")
    facts = (jobs.c.queue, jobs.c.tenant, jobs.c.executor, jobs.c.labels, jobs.c.spec)
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
    )


Standing = tuple[datetime | None, bool, int]
"""Where a rule and subject stand: when its throttle window opened (None: never), whether
it owes a "recovered" message, and its streak of jobs that ended badly."""

ST = alert_streaks.c


def alert_sent(
    conn: Connection, *, pairs: Sequence[tuple[str, str]]
) -> dict[tuple[str, str], Standing]:
    """Where each (rule, subject) of `pairs` stands; one never alerted nor failing
    stands nowhere: (None, False, 0)."""
    wanted = sorted(set(pairs))
    out: dict[tuple[str, str], Standing] = {p: (None, False, 0) for p in wanted}
    if wanted:
        rows = conn.execute(select(alert_streaks).where(tuple_(ST.rule, ST.subject).in_(wanted)))
        for r in rows:
            out[(r.rule, r.subject)] = (r.window_at, r.owes_recovery, r.failures)
    return out


def alert_open(conn: Connection) -> set[str]:
    """The subjects a success can change for some rule: those owing a recovered message
    or counting a streak."""
    rows = conn.execute(select(ST.subject).where(or_(ST.owes_recovery, ST.failures > 0)).distinct())
    return set(rows.scalars())


def alert_write(
    conn: Connection,
    *,
    name: str,
    read_from: int,
    read_to: int,
    messages: Sequence[Mapping[str, Any]],
    digested: Sequence[Mapping[str, Any]],
    now: datetime,
    standing: Mapping[tuple[str, str], Standing] | None = None,
) -> bool:
    """Move the cursor `name` from `read_from` to `read_to` and write what the events in
    between made, with where the rules and subjects it changed now stand, in one
    transaction; False (and nothing written) when another alerter moved the cursor
    first. A message whose dedupe key exists is not written again."""
    moved = conn.execute(
        update(alert_cursors)
        .where(alert_cursors.c.name == name, alert_cursors.c.event_id == read_from)
        .values(event_id=read_to, updated_at=now)
    ).rowcount
    if not moved:
        if read_from != 0 or alert_cursor(conn, name=name) is not None:
            return False
        made = dialects.insert_ignore_conflict(conn, alert_cursors, ["name"]).values(
            name=name, event_id=read_to, updated_at=now
        )
        if not conn.execute(made).rowcount:
            return False
    rows = [{**m, "state": "pending", "created_at": now, "tries": 0} for m in messages]
    if rows:
        conn.execute(dialects.insert_ignore_conflict(conn, alerts, ["dedupe_key"]), rows)
    _digest(conn, digested, now)
    for (rule, about), (window_at, owes, failures) in sorted((standing or {}).items()):
        row = {"window_at": window_at, "owes_recovery": owes, "failures": failures}
        stmt = dialects.upsert(conn, alert_streaks).values(rule=rule, subject=about, **row)
        conn.execute(stmt.on_conflict_do_update(index_elements=["rule", "subject"], set_=row))
    return True


def _digest(conn: Connection, digested: Sequence[Mapping[str, Any]], now: datetime) -> None:
    """Count entries into their windows' digests: one row per (rule, subject, window,
    channel), due at the window's end, naming the first DIGEST_JOBS jobs."""
    by_key: dict[str, list[Mapping[str, Any]]] = {}
    for d in digested:
        by_key.setdefault(d["dedupe_key"], []).append(d)
    for key, entries in by_key.items():
        first = entries[0]
        row = conn.execute(
            select(AL.id, AL.details, AL.state, AL.due_at).where(AL.dedupe_key == key)
        ).first()
        jobs_named = [e["job_id"] for e in entries if e["job_id"] is not None]
        if row is not None and (row.state != "pending" or row.due_at != first["window_end"]):
            # Sent, or being sent: what came since goes in a digest of its own, due now.
            key, row = f"{key}|after:{now.isoformat()}", None
            first = {**first, "window_end": now}
        if row is None:
            _digest_new(conn, key, first, entries, jobs_named, now)
            continue
        old = dict(row.details)
        old["count"] = int(old.get("count", 0)) + len(entries)
        old["jobs"] = [*old.get("jobs", []), *jobs_named][:DIGEST_JOBS]
        old["causes"] = sorted({*old.get("causes", []), *(e["cause"] for e in entries)})
        conn.execute(update(alerts).where(AL.id == row.id).values(details=old))


def _digest_new(
    conn: Connection,
    key: str,
    first: Mapping[str, Any],
    entries: Sequence[Mapping[str, Any]],
    jobs_named: Sequence[int],
    now: datetime,
) -> None:
    """A new digest of `entries` (the first of them `first`), due at its window's end."""
    details = {
        "tenant": first["tenant"],  # whose alert list shows it
        "count": len(entries),
        "jobs": jobs_named[:DIGEST_JOBS],
        "since": first["window_start"].isoformat(),
        "causes": sorted({e["cause"] for e in entries}),
    }
    conn.execute(
        dialects.insert_ignore_conflict(conn, alerts, ["dedupe_key"]).values(
            dedupe_key=key,
            rule=first["rule"],
            channel=first["channel"],
            kind="digest",
            cause=first["cause"],
            subject=first["subject"],
            job_id=None,
            details=details,
            state="pending",
            created_at=now,
            due_at=first["window_end"],
            tries=0,
        )
    )


def alerts_claim(
    conn: Connection,
    *,
    now: datetime,
    limit: int,
    lease: timedelta,
    ids: Sequence[int] | None = None,
) -> list[Alert]:
    """Take up to `limit` pending messages whose time has come (or those of `ids`), the
    oldest first, for one delivery each: each is due again only after `lease`, so no other
    alerter sends it meanwhile, and one whose sender died goes again after it."""
    pick = select(AL.id).where(PENDING).order_by(AL.due_at, AL.id).limit(limit)
    pick = pick.where(AL.id.in_(list(ids))) if ids is not None else pick.where(AL.due_at <= now)
    taken = list(conn.execute(dialects.skip_locked(conn, pick)).scalars())
    if not taken:
        return []
    conn.execute(
        update(alerts).where(dialects.one_of(conn, AL.id, taken)).values(due_at=now + lease)
    )
    rows = conn.execute(
        select(alerts).where(dialects.one_of(conn, AL.id, taken)).order_by(AL.id)
    ).all()
    return [_alert(r) for r in rows]


def alert_tried(
    conn: Connection,
    *,
    alert_id: int,
    now: datetime,
    error: str | None,
    retry_at: datetime | None,
) -> None:
    """Record a delivery try: delivered (no `error`), due again at `retry_at`, or given up
    (an error and no `retry_at`)."""
    conn.execute(
        insert(alert_tries).values(alert_id=alert_id, at=now, ok=error is None, error=error)
    )
    values: dict[str, Any] = {"tries": AL.tries + 1, "last_error": error}
    if error is None:
        values |= {"state": "delivered", "delivered_at": now}
    elif retry_at is None:
        values |= {"state": "failed"}
    else:
        values |= {"due_at": retry_at}
    conn.execute(update(alerts).where(AL.id == alert_id, PENDING).values(**values))


def alert_add(conn: Connection, *, message: Mapping[str, Any], now: datetime) -> int:
    """Write one message now (a test message): its id."""
    row = {**message, "state": "pending", "created_at": now, "tries": 0}
    return int(conn.execute(insert(alerts).values(**row).returning(AL.id)).scalar_one())


def alert_list(
    conn: Connection,
    *,
    limit: int,
    rule: str | None = None,
    before: int | None = None,
    tenant: str | None = None,
) -> list[Alert]:
    """The newest messages first (keyset: ids below `before`); only those about `tenant`'s
    jobs and schedules when it is given."""
    stmt = select(alerts).order_by(AL.id.desc()).limit(limit)
    if rule is not None:
        stmt = stmt.where(AL.rule == rule)
    if tenant is not None:
        stmt = stmt.where(dialects.json_has(conn, AL.details, {"tenant": tenant}))
    if before is not None:
        stmt = stmt.where(AL.id < before)
    return [_alert(r) for r in conn.execute(stmt).all()]


def alert_try_list(conn: Connection, *, alert_ids: Sequence[int]) -> dict[int, list[Try]]:
    """Every delivery try of each alert, in order."""
    out: dict[int, list[Try]] = {i: [] for i in alert_ids}
    if alert_ids:
        rows = conn.execute(
            select(alert_tries)
            .where(dialects.one_of(conn, alert_tries.c.alert_id, alert_ids))
            .order_by(alert_tries.c.id)
        )
        for r in rows:
            out[r.alert_id].append((r.at, r.ok, r.error))
    return out


def alert_mute(conn: Connection, *, rule: str, until: datetime, now: datetime) -> None:
    row = {"rule": rule, "until": until, "muted_at": now}
    stmt = dialects.upsert(conn, alert_mutes).values(**row)
    conn.execute(stmt.on_conflict_do_update(index_elements=["rule"], set_=row))


def alert_unmute(conn: Connection, *, rule: str) -> bool:
    """Lift a rule's mute: whether it had one."""
    return bool(conn.execute(delete(alert_mutes).where(alert_mutes.c.rule == rule)).rowcount)


def alert_muted(conn: Connection, *, now: datetime) -> dict[str, datetime]:
    rows = conn.execute(select(alert_mutes).where(alert_mutes.c.until > now))
    return {r.rule: r.until for r in rows}


SLA_MISSED = "missed"
"""The `sla` detail of the run-log note a missed SLA leaves."""


def sla_check(conn: Connection, *, now: datetime, limit: int) -> int:
    """Look at up to `limit` SLAs that are due: a job that has not succeeded (nor been
    cancelled) gets a note in its run log that it missed it; every row looked at goes.
    How many were missed."""
    rows = conn.execute(
        select(job_slas.c.job_id, job_slas.c.due_at, jobs.c.state)
        .outerjoin(jobs, jobs.c.id == job_slas.c.job_id)
        .where(job_slas.c.due_at <= now)
        .order_by(job_slas.c.due_at)
        .limit(limit)
    ).all()
    if not rows:
        return 0
    mine = set(
        conn.execute(
            delete(job_slas)
            .where(dialects.one_of(conn, job_slas.c.job_id, [r.job_id for r in rows]))
            .returning(job_slas.c.job_id)
        ).scalars()
    )  # another reconciler that took a row first notes it; this one does not
    missed = [r for r in rows if r.job_id in mine and r.state not in _NO_MISS]
    for r in missed:
        event_note(
            conn,
            job_id=r.job_id,
            attempt_id=None,
            state=r.state,
            entity="job",
            reason=f"SLA missed: not succeeded by {r.due_at.isoformat()}",
            now=now,
            details={"sla": SLA_MISSED, "due_at": r.due_at.isoformat()},
        )
    return len(missed)


_NO_MISS = (None, J.SUCCEEDED, J.CANCELLED)
"""A job gone, succeeded or cancelled has missed no SLA."""


def alerts_forget(conn: Connection, *, before: datetime, limit: int) -> int:
    """Remove up to `limit` messages made before `before` that are done with (delivered
    or given up), with their tries. Where each rule and subject stands is kept apart
    (alert_streaks), so no message is needed for it."""
    ids = list(
        conn.execute(
            select(AL.id)
            .where(AL.state != "pending", AL.created_at < before)
            .order_by(AL.id)
            .limit(limit)
        ).scalars()
    )
    if ids:
        conn.execute(delete(alert_tries).where(dialects.one_of(conn, alert_tries.c.alert_id, ids)))
        conn.execute(delete(alerts).where(dialects.one_of(conn, AL.id, ids)))
    return len(ids)


# --- the handle ----------------------------------------------------------------------------


class Alerts:
    """The store's handle on the alerts outbox and what the alerter reads
    (`store.alerts`): each call one transaction.

    Each method runs the store function its name shortens (`claim`: alerts_claim),
    named in its body; that function's docstring says what the call does.
    """

    def __init__(self, db: Database) -> None:
        self._db = db

    async def cursor(self, *, name: str) -> int | None:
        return await self._db.tx(functools.partial(alert_cursor, name=name))

    async def event_newest(self) -> int:
        return await self._db.tx(event_newest)

    async def read(
        self, *, name: str, limit: int, now: datetime, with_starts: bool = False
    ) -> AlertRead:
        return await self._db.read(
            functools.partial(alert_read, name=name, limit=limit, now=now, with_starts=with_starts)
        )

    async def successes(
        self, *, after: int, upto: int, subjects: Collection[str]
    ) -> list[tuple[model.Event, JobFacts | None]]:
        return await self._db.read(
            functools.partial(alert_successes, after=after, upto=upto, subjects=subjects)
        )

    async def events(self, *, after: int, limit: int, with_starts: bool = False) -> EventsRead:
        return await self._db.tx(
            functools.partial(alert_events, after=after, limit=limit, with_starts=with_starts)
        )

    async def sent(self, *, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], Standing]:
        return await self._db.read(functools.partial(alert_sent, pairs=pairs))

    async def open(self) -> set[str]:
        return await self._db.tx(alert_open)

    async def write(
        self,
        *,
        name: str,
        read_from: int,
        read_to: int,
        messages: Sequence[Mapping[str, Any]],
        digested: Sequence[Mapping[str, Any]],
        now: datetime,
        standing: Mapping[tuple[str, str], Standing] | None = None,
    ) -> bool:
        return await self._db.tx(
            functools.partial(
                alert_write,
                name=name,
                read_from=read_from,
                read_to=read_to,
                messages=messages,
                digested=digested,
                now=now,
                standing=standing,
            )
        )

    async def claim(
        self, *, now: datetime, limit: int, lease: timedelta, ids: Sequence[int] | None = None
    ) -> list[Alert]:
        return await self._db.tx(
            functools.partial(alerts_claim, now=now, limit=limit, lease=lease, ids=ids)
        )

    async def forget(self, *, before: datetime, limit: int = 500) -> int:
        return await self._db.tx(functools.partial(alerts_forget, before=before, limit=limit))

    async def tried(
        self, *, alert_id: int, now: datetime, error: str | None, retry_at: datetime | None
    ) -> None:
        await self._db.tx(
            functools.partial(
                alert_tried, alert_id=alert_id, now=now, error=error, retry_at=retry_at
            )
        )

    async def add(self, *, message: Mapping[str, Any], now: datetime) -> int:
        return await self._db.tx(functools.partial(alert_add, message=message, now=now))

    async def tries(self, *, alert_ids: Sequence[int]) -> dict[int, list[Try]]:
        return await self._db.tx(functools.partial(alert_try_list, alert_ids=alert_ids))

    async def sla_check(self, *, now: datetime, limit: int = 500) -> int:
        """Note in their run logs the jobs whose SLA passed before they succeeded."""
        return await self._db.tx(functools.partial(sla_check, now=now, limit=limit))

    async def mute(self, *, rule: str, until: datetime, now: datetime) -> None:
        await self._db.tx(functools.partial(alert_mute, rule=rule, until=until, now=now))

    async def unmute(self, *, rule: str) -> bool:
        return await self._db.tx(functools.partial(alert_unmute, rule=rule))

    async def muted(self, *, now: datetime) -> dict[str, datetime]:
        return await self._db.tx(functools.partial(alert_muted, now=now))

    async def list(
        self,
        *,
        limit: int = 50,
        rule: str | None = None,
        before: int | None = None,
        tenant: str | None = None,
    ) -> list[Alert]:
        return await self._db.tx(
            functools.partial(alert_list, limit=limit, rule=rule, before=before, tenant=tenant)
        )
