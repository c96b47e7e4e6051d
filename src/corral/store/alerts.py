"""The alerts outbox: the messages and digests the alerter wrote for the events it read
(in the transaction that moves its cursor), where each rule and subject stands, their
delivery tries, muted rules and missed SLAs; the store's handle on them (`store.alerts`).

What the alerter reads before it decides (its cursor, the events, the rules muted) is
alert_reads.py's.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, delete, func, insert, select, tuple_, update

from corral import model
from corral.store import alert_reads, dialects
from corral.store.events import event_note
from corral.store.tables import (
    PENDING,
    alert_cursors,
    alert_mutes,
    alert_streaks,
    alert_tries,
    alerts,
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


def event_newest(conn: Connection) -> int:
    """The newest event's id (0 when there is none)."""
    return conn.execute(select(func.max(events.c.id))).scalar() or 0


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
        if read_from != 0 or alert_reads.alert_cursor(conn, name=name) is not None:
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
    """Count entries into their digests: one row per (rule, tenant, period, channel), due
    at the period's end, naming the first DIGEST_JOBS jobs and subjects."""
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
        old["subjects"] = _subjects([*old.get("subjects", []), *_abouts(entries)])
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
        "subjects": _subjects(_abouts(entries)),
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


def _abouts(entries: Sequence[Mapping[str, Any]]) -> list[str]:
    return [e["about"] for e in entries if e.get("about")]


def _subjects(named: Sequence[str]) -> list[str]:
    """The first DIGEST_JOBS subjects a digest names, each once."""
    return list(dict.fromkeys(named))[:DIGEST_JOBS]


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
        return await self._db.tx(functools.partial(alert_reads.alert_cursor, name=name))

    async def event_newest(self) -> int:
        return await self._db.tx(event_newest)

    async def read(
        self, *, name: str, limit: int, now: datetime, with_starts: bool = False
    ) -> alert_reads.AlertRead:
        return await self._db.read(
            functools.partial(
                alert_reads.alert_read, name=name, limit=limit, now=now, with_starts=with_starts
            )
        )

    async def successes(
        self, *, after: int, upto: int, subjects: Collection[str]
    ) -> list[tuple[model.Event, alert_reads.JobFacts | None]]:
        return await self._db.read(
            functools.partial(
                alert_reads.alert_successes, after=after, upto=upto, subjects=subjects
            )
        )

    async def events(
        self, *, after: int, limit: int, with_starts: bool = False
    ) -> alert_reads.EventsRead:
        return await self._db.tx(
            functools.partial(
                alert_reads.alert_events, after=after, limit=limit, with_starts=with_starts
            )
        )

    async def sent(self, *, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], Standing]:
        return await self._db.read(functools.partial(alert_sent, pairs=pairs))

    async def open(self) -> set[str]:
        return await self._db.tx(alert_reads.alert_open)

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
        return await self._db.tx(functools.partial(alert_reads.alert_muted, now=now))

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
