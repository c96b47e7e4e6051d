"""Monitors (corral.monitoring): made, listed, paused, resumed, rotated and deleted within
their tenant, judged in the scheduler's pass, and the history of each one's state.

Every change of a monitor's state is written by compare-and-set on the state it was read
in, with a row of its history and, for a cause (monitor_down, monitor_failed, monitor_up),
an event of entity "monitor" that the alerter reads; what the change is, is decided by
corral.monitoring. Its pings are in monitor_pings.py.
"""

from __future__ import annotations

import dataclasses
import functools
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from corral import errors, monitoring
from corral.store import dialects, tenant_alerts
from corral.store.events import NO_JOB, event_insert, event_row
from corral.store.tables import monitor_changes, monitor_pings, monitors, monitors_judged

if TYPE_CHECKING:
    from corral.store.database import Database

M, CH = monitors.c, monitor_changes.c
BATCH = 500
"""Monitors judged in one transaction."""


@dataclass(frozen=True, slots=True)
class Judged:
    """When monitors were last judged, and by which process (its id in loops; None: one
    that has no row there)."""

    at: datetime
    loop_id: str | None


@dataclass(frozen=True, slots=True)
class StateChange:
    """One row of a monitor's history."""

    id: int
    at: datetime
    frm: str
    to: str
    reason: str
    details: Mapping[str, Any]


def monitor_of(row: Any) -> monitoring.Monitor:
    """A monitors row as the value corral.monitoring decides on."""
    period = row.period_seconds
    return monitoring.Monitor(
        id=row.id,
        tenant=row.tenant,
        name=row.name,
        ping_key=row.ping_key,
        period=None if period is None else timedelta(seconds=period),
        cron=row.cron,
        tz=row.tz,
        grace=timedelta(seconds=row.grace_seconds),
        state=row.state,
        state_at=row.state_at,
        basis_at=row.basis_at,
        expected_at=row.expected_at,
        check_at=row.check_at,
        last_ping_at=row.last_ping_at,
        run_started_at=row.run_started_at,
        created_at=row.created_at,
        ping_count=row.ping_count,
        rule=row.rule,
    )


def _get(conn: Connection, tenant: str, name: str, *, lock: bool = False) -> monitoring.Monitor:
    stmt = select(monitors).where(M.tenant == tenant, M.name == name)
    row = conn.execute(stmt.with_for_update() if lock else stmt).first()
    if row is None:
        raise errors.NotFound(f"no monitor {name!r}")
    return monitor_of(row)


def monitor_get(conn: Connection, *, tenant: str, name: str) -> monitoring.Monitor:
    """`tenant`'s monitor `name`; NotFound when it has none so named."""
    return _get(conn, tenant, name)


def monitors_list(conn: Connection, *, tenant: str | None) -> list[monitoring.Monitor]:
    """`tenant`'s monitors (None: every tenant's), by tenant and name."""
    stmt = select(monitors).order_by(M.tenant, M.name)
    if tenant is not None:
        stmt = stmt.where(M.tenant == tenant)
    return [monitor_of(r) for r in conn.execute(stmt)]


def monitor_add(
    conn: Connection,
    *,
    new: monitoring.Monitor,
    rule: Mapping[str, Any] | None,
    most: int,
    rules_most: int,
    now: datetime,
) -> monitoring.Monitor:
    """Store `new` (its id and key are made here) and, with `rule`, the tenant's alert rule
    its --channel makes (monitoring.rule_of), in one transaction: QuotaExceeded when the
    tenant has `most` monitors, Conflict when the name is taken (or the rule's), and
    InvalidInput when a channel of the rule is not the tenant's."""
    _hold(conn, new.tenant, most)
    rule_name = None if rule is None else monitoring.rule_name(new.name)
    try:
        with conn.begin_nested():
            values = _new_row(new, rule_name, now)
            row = conn.execute(insert(monitors).values(**values).returning(*monitors.c)).one()
    except IntegrityError:
        raise errors.Conflict(
            f"name: tenant {new.tenant!r} has a monitor named {new.name!r} already"
        ) from None
    if rule is not None and rule_name is not None:
        tenant_alerts.rule_add(
            conn, tenant=new.tenant, name=rule_name, rule=rule, now=now, most=rules_most
        )
    made = monitor_of(row)
    history(conn, made, monitoring.Change("new", made.state, "made"), now)
    return made


def _hold(conn: Connection, tenant: str, most: int) -> None:
    """QuotaExceeded when `tenant` has `most` monitors already. The adds of one tenant take
    turns (on PostgreSQL a lock of the tenant's name, held until the transaction ends), so
    each counts the monitors of those before it: locking the rows there are would not stop
    an insert, and with none there is nothing to lock."""
    dialects.take_turns(conn, f"max_monitors:{tenant}")
    held = conn.execute(
        select(func.count()).select_from(monitors).where(M.tenant == tenant)
    ).scalar_one()
    if held >= most:
        raise errors.QuotaExceeded(
            f"max_monitors: tenant {tenant!r} has {held} monitors, its quota of"
            f" {most}; delete one it no longer needs, or ask the operator to raise"
            " [tenants.NAME] max_monitors",
            quota="max_monitors",
            tenant=tenant,
        )


def _new_row(new: monitoring.Monitor, rule: str | None, now: datetime) -> dict[str, Any]:
    """The row of a new monitor: up, with a key of its own, its first ping expected from
    now (monitoring.made)."""
    verdict = monitoring.made(new)
    return {
        "tenant": new.tenant,
        "name": new.name,
        "ping_key": str(uuid.uuid4()),
        "period_seconds": None if new.period is None else int(new.period.total_seconds()),
        "cron": new.cron,
        "tz": new.tz,
        "grace_seconds": int(new.grace.total_seconds()),
        "state": verdict.state,
        "state_at": now,
        "basis_at": verdict.basis_at,
        "expected_at": verdict.expected_at,
        "check_at": verdict.check_at,
        "rule": rule,
        "created_at": now,
        "updated_at": now,
    }


def history(
    conn: Connection, monitor: monitoring.Monitor, change: monitoring.Change, now: datetime
) -> None:
    """Write `change` in the monitor's history (keeping CHANGES_KEPT) and, when it is an
    alert cause, its event."""
    conn.execute(
        insert(monitor_changes).values(
            monitor_id=monitor.id,
            at=now,
            from_state=change.frm,
            to_state=change.to,
            reason=change.reason,
            details=dict(change.details),
        )
    )
    oldest = (
        select(CH.id)
        .where(CH.monitor_id == monitor.id)
        .order_by(CH.id.desc())
        .offset(monitoring.CHANGES_KEPT)
        .limit(1)
        .scalar_subquery()
    )
    conn.execute(delete(monitor_changes).where(CH.monitor_id == monitor.id, CH.id <= oldest))
    if change.cause is not None:
        event_insert(conn, [news(monitor, change, now)])


def news(monitor: monitoring.Monitor, change: monitoring.Change, now: datetime) -> dict[str, Any]:
    """The event of a monitor's change that is an alert cause: it names the monitor and
    its tenant, which alert rules match on."""
    return event_row(
        job_id=NO_JOB,
        attempt_id=None,
        entity="monitor",
        frm=change.frm,
        to=change.to,
        reason=f"monitor {monitor.name!r}: {change.reason}",
        now=now,
        details={"monitor": monitor.name, "tenant": monitor.tenant, **change.details},
    )


def apply(
    conn: Connection, monitor: monitoring.Monitor, verdict: monitoring.Verdict, now: datetime
) -> bool:
    """Write `verdict` of `monitor` if its state and check time are still as read (False:
    something changed it first, and this is dropped), with its change's history."""
    values: dict[str, Any] = {
        "state": verdict.state,
        "basis_at": verdict.basis_at,
        "expected_at": verdict.expected_at,
        "check_at": verdict.check_at,
        "updated_at": now,
    }
    if verdict.state != monitor.state:
        values["state_at"] = now
    done = conn.execute(
        update(monitors)
        .where(M.id == monitor.id, M.state == monitor.state, _same(M.check_at, monitor.check_at))
        .values(**values)
    )
    if not done.rowcount:
        return False
    if verdict.change is not None:
        history(conn, monitor, verdict.change, now)
    return True


def _same(column: Any, value: datetime | None) -> Any:
    return column.is_(None) if value is None else column == value


def monitors_judge(
    conn: Connection, *, now: datetime, gap: monitoring.Gap | None, limit: int = BATCH
) -> tuple[int, list[tuple[monitoring.Monitor, monitoring.Change]]]:
    """Judge up to `limit` monitors whose check time came (corral.monitoring.judge) in a
    pass that follows `gap`, each held by this transaction (SKIP LOCKED on PostgreSQL: two
    judges share the work); how many were judged, and the changes made."""
    stmt = (
        select(monitors)
        .where(M.check_at <= now, M.state.in_([monitoring.UP, monitoring.LATE]))
        .order_by(M.check_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    due = [monitor_of(r) for r in conn.execute(stmt)]
    changed = []
    for monitor in due:
        verdict = monitoring.judge(monitor, now=now, gap=gap)
        if apply(conn, monitor, verdict, now) and verdict.change is not None:
            changed.append((monitor, verdict.change))
    return len(due), changed


def judged_last(conn: Connection) -> Judged | None:
    """When monitors were last judged, and by which process (None: never)."""
    row = conn.execute(select(monitors_judged).where(monitors_judged.c.id == 1)).first()
    return None if row is None else Judged(row.judged_at, row.loop_id)


def judged_note(conn: Connection, *, at: datetime, loop_id: str | None) -> None:
    """Note that process `loop_id` judged monitors at `at` (a pass of another that began
    later and ended first keeps its time)."""
    J = monitors_judged.c
    stmt = dialects.upsert(conn, monitors_judged).values(id=1, judged_at=at, loop_id=loop_id)
    stmt = stmt.on_conflict_do_update(
        index_elements=[J.id],
        set_={"judged_at": stmt.excluded.judged_at, "loop_id": stmt.excluded.loop_id},
        where=J.judged_at <= stmt.excluded.judged_at,
    )
    conn.execute(stmt)


def monitor_pause(conn: Connection, *, tenant: str, name: str, now: datetime) -> bool:
    """Pause `tenant`'s monitor `name` (False: it was paused already)."""
    monitor = _get(conn, tenant, name, lock=True)
    if monitor.state == monitoring.PAUSED:
        return False
    return apply(conn, monitor, monitoring.paused(monitor), now)


def monitor_resume(conn: Connection, *, tenant: str, name: str, now: datetime) -> bool:
    """Resume `tenant`'s monitor `name`, counted from `now` (False: it was not paused)."""
    monitor = _get(conn, tenant, name, lock=True)
    if monitor.state != monitoring.PAUSED:
        return False
    return apply(conn, monitor, monitoring.resumed(monitor, now), now)


def monitor_rotate(conn: Connection, *, tenant: str, name: str, now: datetime) -> str:
    """Give `tenant`'s monitor `name` a new ping key (the old URL is not found from now):
    the new key."""
    monitor = _get(conn, tenant, name, lock=True)
    key = str(uuid.uuid4())
    conn.execute(update(monitors).where(M.id == monitor.id).values(ping_key=key, updated_at=now))
    return key


def monitor_update(
    conn: Connection,
    *,
    changed: monitoring.Monitor,
    rule: Mapping[str, Any] | None,
    rules_most: int,
    now: datetime,
) -> None:
    """Give `tenant`'s monitor `changed.name` the period, cron, zone and grace of `changed`
    (corral.monitoring.reshaped says what that makes of its state), and its --channel rule
    `rule`: made, changed, or deleted when None. NotFound when it has none so named."""
    monitor = _get(conn, changed.tenant, changed.name, lock=True)
    shaped = dataclasses.replace(
        monitor, period=changed.period, cron=changed.cron, tz=changed.tz, grace=changed.grace
    )
    verdict = monitoring.reshaped(shaped, now)
    rule_name = _rule_kept(conn, monitor, rule, rules_most=rules_most, now=now)
    conn.execute(
        update(monitors)
        .where(M.id == monitor.id)
        .values(
            period_seconds=None if shaped.period is None else int(shaped.period.total_seconds()),
            cron=shaped.cron,
            tz=shaped.tz,
            grace_seconds=int(shaped.grace.total_seconds()),
            rule=rule_name,
            expected_at=verdict.expected_at,
            check_at=verdict.check_at,
            updated_at=now,
        )
    )


def _rule_kept(
    conn: Connection,
    monitor: monitoring.Monitor,
    rule: Mapping[str, Any] | None,
    *,
    rules_most: int,
    now: datetime,
) -> str | None:
    """Make the monitor's --channel rule `rule`: changed, made (also when the one it had is
    gone), or deleted when None; the rule's name."""
    name = None if rule is None else monitoring.rule_name(monitor.name)
    if monitor.rule is not None and monitor.rule != name:
        tenant_alerts.rule_delete(conn, tenant=monitor.tenant, name=monitor.rule)
    if rule is None or name is None:
        return None
    if monitor.rule == name:
        try:
            tenant_alerts.rule_change(conn, tenant=monitor.tenant, name=name, rule=rule)
            return name
        except errors.NotFound:
            pass  # deleted by hand before its monitor forgot it: made again
    tenant_alerts.rule_add(
        conn, tenant=monitor.tenant, name=name, rule=rule, now=now, most=rules_most
    )
    return name


def monitor_delete(conn: Connection, *, tenant: str, name: str) -> bool:
    """Delete `tenant`'s monitor `name` with its pings, its history and the alert rule its
    --channel made (False: it has none so named)."""
    try:
        monitor = _get(conn, tenant, name, lock=True)
    except errors.NotFound:
        return False
    conn.execute(delete(monitor_pings).where(monitor_pings.c.monitor_id == monitor.id))
    conn.execute(delete(monitor_changes).where(CH.monitor_id == monitor.id))
    conn.execute(delete(monitors).where(M.id == monitor.id))
    if monitor.rule is not None:
        tenant_alerts.rule_delete(conn, tenant=tenant, name=monitor.rule)
    return True


def changes_list(conn: Connection, *, monitor_id: int, limit: int) -> list[StateChange]:
    """A monitor's history, the newest first."""
    rows = conn.execute(
        select(monitor_changes)
        .where(CH.monitor_id == monitor_id)
        .order_by(CH.id.desc())
        .limit(limit)
    )
    return [StateChange(r.id, r.at, r.from_state, r.to_state, r.reason, r.details) for r in rows]


def monitors_count(conn: Connection) -> dict[str, int]:
    """How many monitors are in each state (of every tenant)."""
    rows = conn.execute(select(M.state, func.count()).group_by(M.state))
    return {state: int(n) for state, n in rows}


def monitors_exist(conn: Connection) -> bool:
    """Whether any tenant has a monitor: one probe of the table."""
    return conn.execute(select(M.id).limit(1)).first() is not None


# --- the handle ----------------------------------------------------------------------------


class Monitors:
    """The store's handle on monitors (`store.monitors`).

    Each method runs the store function its name says, in one transaction; that
    function's docstring says what the call does.
    """

    def __init__(self, db: Database) -> None:
        self._db = db

    async def add(
        self,
        *,
        new: monitoring.Monitor,
        rule: Mapping[str, Any] | None,
        most: int,
        rules_most: int,
        now: datetime,
    ) -> monitoring.Monitor:
        return await self._db.tx(
            functools.partial(
                monitor_add, new=new, rule=rule, most=most, rules_most=rules_most, now=now
            )
        )

    async def get(self, *, tenant: str, name: str) -> monitoring.Monitor:
        return await self._db.read(functools.partial(monitor_get, tenant=tenant, name=name))

    async def listed(self, *, tenant: str | None) -> list[monitoring.Monitor]:
        return await self._db.read(functools.partial(monitors_list, tenant=tenant))

    async def judge(
        self, *, now: datetime, gap: monitoring.Gap | None, limit: int = BATCH
    ) -> tuple[int, list[tuple[monitoring.Monitor, monitoring.Change]]]:
        return await self._db.tx(functools.partial(monitors_judge, now=now, gap=gap, limit=limit))

    async def judged_last(self) -> Judged | None:
        return await self._db.read(judged_last)

    async def judged_note(self, *, at: datetime, loop_id: str | None) -> None:
        await self._db.tx(functools.partial(judged_note, at=at, loop_id=loop_id))

    async def pause(self, *, tenant: str, name: str, now: datetime) -> bool:
        return await self._db.tx(
            functools.partial(monitor_pause, tenant=tenant, name=name, now=now)
        )

    async def resume(self, *, tenant: str, name: str, now: datetime) -> bool:
        return await self._db.tx(
            functools.partial(monitor_resume, tenant=tenant, name=name, now=now)
        )

    async def rotate(self, *, tenant: str, name: str, now: datetime) -> str:
        return await self._db.tx(
            functools.partial(monitor_rotate, tenant=tenant, name=name, now=now)
        )

    async def delete(self, *, tenant: str, name: str) -> bool:
        return await self._db.tx(functools.partial(monitor_delete, tenant=tenant, name=name))

    async def changes(self, *, monitor_id: int, limit: int) -> list[StateChange]:
        return await self._db.read(
            functools.partial(changes_list, monitor_id=monitor_id, limit=limit)
        )

    async def counts(self) -> dict[str, int]:
        return await self._db.read(monitors_count)

    async def any(self) -> bool:
        return await self._db.read(monitors_exist)
