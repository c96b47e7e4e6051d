"""Schedules: create, change, pause, resume, delete and read them, and their firings'
records; the store's handle on them (`store.schedules`).

Firing what is due and backfilling, the scheduler's pass, are firings.py's: what a schedule
is and how it changes is apart from how its nominal times are fired.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, delete, func, select, tuple_, update

from corral import errors, model, quotas, scheduling, tenancy
from corral import firing_stats as counting
from corral.planning import Fired, Plan
from corral.store import dialects, firing_stats, firings, tables
from corral.store import flows as flow_store
from corral.store import quotas as holds
from corral.store.rows import schedule_from_row
from corral.store.tables import schedules

if TYPE_CHECKING:
    from corral.store.database import Database

F = scheduling.FiringOutcome


def firing_from_row(row: Any) -> scheduling.Firing:
    m = dict(row._mapping if hasattr(row, "_mapping") else row)
    return scheduling.Firing(**{**m, "outcome": F(m["outcome"])})


# --- create, change, delete --------------------------------------------------------------


def schedule_create(
    conn: Connection,
    *,
    new: scheduling.NewSchedule,
    anchor: datetime,
    next_due: datetime | None,
    now: datetime,
) -> scheduling.Schedule:
    """Store a new schedule whose first nominal time is `next_due`. A name is unique per
    tenant."""
    [made] = schedules_create(conn, items=[(new, anchor, next_due)], now=now)
    return made


def schedules_create(
    conn: Connection,
    *,
    items: Sequence[tuple[scheduling.NewSchedule, datetime, datetime | None]],
    now: datetime,
    paused: bool = False,
) -> list[scheduling.Schedule]:
    """Store new schedules, each with its anchor and first nominal time, in one statement
    (`paused`: made paused); refused, all of them, when a name is taken (per tenant), or
    when a flow their jobs name is not their tenant's (checked here, in the transaction that
    writes them, so a flow deleted meanwhile is never left named: flows_named)."""
    names = {(new.tenant, new.name) for new, _, _ in items}
    if len(names) < len(items):
        raise errors.InvalidInput("name: the same schedule twice in one request")
    if named := {(new.tenant, flow) for new, _, _ in items if (flow := _flow(new.template))}:
        flow_store.flows_named(conn, named=named)
    rows = [_schedule_row(new, anchor, next_due, now, paused) for new, anchor, next_due in items]
    inserted = dialects.insert_many(
        conn,
        schedules,
        rows,
        ("id", "tenant", "name"),
        on_conflict="ON CONFLICT (tenant, name) DO NOTHING",
    )
    if len(inserted) < len(rows):  # raised: the transaction keeps none of them
        taken = sorted(names - {(tenant, name) for _, tenant, name in inserted})
        tenant, name = taken[0]
        raise errors.Conflict(
            f"name: a schedule named {name!r} exists (tenant {tenant!r}); change it"
            " with `corral schedules update`, or delete it first"
        )
    return _schedules_read(conn, [schedule_id for schedule_id, _, _ in inserted])


def _schedule_row(
    new: scheduling.NewSchedule,
    anchor: datetime,
    next_due: datetime | None,
    now: datetime,
    paused: bool,
) -> dict[str, Any]:
    """A new schedule's row: never fired, nothing missed yet."""
    return {
        "tenant": new.tenant,
        "name": new.name,
        "cron": new.cron,
        "tz": new.tz,
        "every_seconds": new.every_seconds,
        "anchor": anchor,
        "template": dict(new.template),
        "catchup": new.catchup.value,
        "catchup_window_seconds": new.catchup_window_seconds,
        "catchup_max": new.catchup_max,
        "overlap": new.overlap.value,
        "jitter_seconds": new.jitter_seconds,
        "until": new.until,
        "tenant_made": new.tenant_made,
        "pause_after": new.pause_after,
        "paused_at": now if paused else None,
        "next_due": next_due,
        "last_nominal": None,
        "last_job_id": None,
        "missed_total": 0,
        "created_at": now,
        "updated_at": now,
    }


def _schedules_read(conn: Connection, ids: Sequence[int]) -> list[scheduling.Schedule]:
    """The schedules of `ids`, in that order, read 500 at a time."""
    made: dict[int, scheduling.Schedule] = {}
    for start in range(0, len(ids), 500):
        some = ids[start : start + 500]
        found = conn.execute(select(schedules).where(dialects.one_of(conn, schedules.c.id, some)))
        made.update((r.id, schedule_from_row(r)) for r in found)
    return [made[i] for i in ids]


def schedule_update(
    conn: Connection,
    *,
    schedule_id: int,
    changes: Mapping[str, Any],
    next_due: datetime | None,
    now: datetime,
) -> scheduling.Schedule:
    """Change a schedule's rule, template or options; its next nominal time is `next_due`
    (the scheduler computed it from the changed rule). Firings already recorded stay. A
    changed template's flow must be the schedule's tenant's, as this transaction sees it
    (flows_named)."""
    values = {
        k: (v.value if isinstance(v, scheduling.Catchup | scheduling.Overlap) else v)
        for k, v in changes.items()
    }
    row = conn.execute(
        update(schedules)
        .where(schedules.c.id == schedule_id)
        .values(**values, next_due=next_due, updated_at=now)
        .returning(*schedules.c)
    ).first()
    if row is None:
        raise errors.NotFound(f"no schedule with id {schedule_id}")
    if "template" in changes and (flow := _flow(row.template)):
        flow_store.flows_named(conn, named=[(row.tenant, flow)])
    return schedule_from_row(row)


def _flow(template: Mapping[str, Any] | None) -> str | None:
    """The flow a schedule's jobs name (corral.flows), if any."""
    flow: str | None = (template or {}).get("flow")
    return flow


def schedule_delete(conn: Connection, *, schedule_id: int) -> None:
    """Delete a schedule and its firings. Jobs it created stay, as jobs. The schedule goes
    first: a pass firing it meanwhile holds its row, so its firings are in before this
    deletes them."""
    if not conn.execute(delete(schedules).where(schedules.c.id == schedule_id)).rowcount:
        raise errors.NotFound(f"no schedule with id {schedule_id}")
    conn.execute(delete(tables.firings).where(tables.firings.c.schedule_id == schedule_id))
    firing_stats.rollups_delete(conn, schedule_id=schedule_id)


def schedule_pause(conn: Connection, *, schedule_id: int, now: datetime) -> scheduling.Schedule:
    """Pause a schedule (pausing a paused one is a no-op)."""
    conn.execute(
        update(schedules)
        .where(schedules.c.id == schedule_id, schedules.c.paused_at.is_(None))
        .values(paused_at=now, updated_at=now)
    )
    return schedule_by_id(conn, schedule_id=schedule_id)


def schedule_resume(
    conn: Connection,
    *,
    schedule_id: int,
    skipped: Sequence[datetime],
    skipped_count: int,
    next_due: datetime | None,
    now: datetime,
) -> scheduling.Schedule:
    """Resume a paused schedule: the nominal times that passed while it was paused are
    recorded as skipped (`skipped`, at most a bounded number of them, of `skipped_count`),
    never fired; it fires next at `next_due`. Its failed firings are counted again from
    `now` on (corral.autopause): those before never count toward a pause again."""
    resumed = conn.execute(
        update(schedules)
        .where(schedules.c.id == schedule_id, schedules.c.paused_at.is_not(None))
        .values(
            paused_at=None,
            paused_reason=None,
            counted_from=now,
            next_due=next_due,
            last_nominal=skipped[-1] if skipped else schedules.c.last_nominal,
            missed_total=schedules.c.missed_total + skipped_count,
            updated_at=now,
        )
    ).rowcount
    if resumed:
        fires = [(schedule_id, scheduling.Fire(at, F.SKIPPED)) for at in skipped]
        firings.firings_record(conn, todo=fires, job_ids={}, now=now)
    return schedule_by_id(conn, schedule_id=schedule_id)


# --- reads ---------------------------------------------------------------------------------


def _find(conn: Connection, tenant: str, name: str) -> scheduling.Schedule | None:
    row = conn.execute(
        select(schedules).where(schedules.c.tenant == tenant, schedules.c.name == name)
    ).first()
    return None if row is None else schedule_from_row(row)


def schedule_get(conn: Connection, *, name: str, tenant: str = "default") -> scheduling.Schedule:
    found = _find(conn, tenant, name)
    if found is None:
        raise errors.NotFound(
            f"no schedule named {name!r} (tenant {tenant!r}); `corral schedules list` shows them"
        )
    return found


def schedule_by_id(conn: Connection, *, schedule_id: int) -> scheduling.Schedule:
    row = conn.execute(select(schedules).where(schedules.c.id == schedule_id)).first()
    if row is None:
        raise errors.NotFound(f"no schedule with id {schedule_id}")
    return schedule_from_row(row)


def schedule_list(
    conn: Connection,
    *,
    tenant: str | None = None,
    limit: int = 1000,
    after: tuple[str, str] | None = None,
) -> list[scheduling.Schedule]:
    """Up to `limit` schedules (of `tenant`; None: of every tenant) by tenant and name,
    from after `after` (tenant, name) on: a walk of the (tenant, name) key from there."""
    stmt = select(schedules).order_by(schedules.c.tenant, schedules.c.name).limit(limit)
    if tenant is not None:
        stmt = stmt.where(schedules.c.tenant == tenant)
    if after is not None:
        stmt = stmt.where(tuple_(schedules.c.tenant, schedules.c.name) > tuple_(*after))
    return [schedule_from_row(r) for r in conn.execute(stmt)]


def firing_list(
    conn: Connection, *, schedule_id: int, limit: int = 20, before: datetime | None = None
) -> list[scheduling.Firing]:
    """A schedule's firings, the latest nominal time first."""
    stmt = (
        select(tables.firings)
        .where(tables.firings.c.schedule_id == schedule_id)
        .order_by(tables.firings.c.nominal_at.desc())
        .limit(limit)
    )
    if before is not None:
        stmt = stmt.where(tables.firings.c.nominal_at < before)
    return [firing_from_row(r) for r in conn.execute(stmt)]


def firing_counts(conn: Connection, *, schedule_id: int) -> dict[str, int]:
    rows = conn.execute(
        select(tables.firings.c.outcome, func.count())
        .where(tables.firings.c.schedule_id == schedule_id)
        .group_by(tables.firings.c.outcome)
    ).all()
    return {outcome: count for outcome, count in rows}


# --- the handle ----------------------------------------------------------------------------


class Schedules:
    """The store's handle on schedules and their firings (`store.schedules`): each call
    one transaction (the reads, whose statements each stand alone, none: Database.lookup).

    Each method runs the store function its name shortens (`pause`: schedule_pause),
    named in its body; that function's docstring says what the call does.
    """

    def __init__(self, db: Database) -> None:
        self._db = db

    async def create(
        self,
        *,
        new: scheduling.NewSchedule,
        anchor: datetime,
        next_due: datetime | None,
        now: datetime,
        quota: quotas.Limits | None = None,
    ) -> scheduling.Schedule:
        """schedule_create; with `quota` (a tenant's request), refused past the tenant's
        max_schedules (store.quotas.schedule_held)."""
        write = functools.partial(
            schedule_create, new=new, anchor=anchor, next_due=next_due, now=now
        )
        if quota is None:
            return await self._db.tx(write)
        return await self._db.tx(
            functools.partial(holds.schedule_held, quota=quota, now=now, write=write)
        )

    async def create_many(
        self,
        *,
        items: Sequence[tuple[scheduling.NewSchedule, datetime, datetime | None]],
        now: datetime,
        paused: bool = False,
    ) -> list[scheduling.Schedule]:
        return await self._db.tx(
            functools.partial(schedules_create, items=items, now=now, paused=paused)
        )

    async def update(
        self,
        *,
        schedule_id: int,
        changes: Mapping[str, Any],
        next_due: datetime | None,
        now: datetime,
    ) -> scheduling.Schedule:
        return await self._db.tx(
            functools.partial(
                schedule_update,
                schedule_id=schedule_id,
                changes=changes,
                next_due=next_due,
                now=now,
            )
        )

    async def delete(self, *, schedule_id: int) -> None:
        await self._db.tx(functools.partial(schedule_delete, schedule_id=schedule_id))

    async def pause(self, *, schedule_id: int, now: datetime) -> scheduling.Schedule:
        return await self._db.tx(
            functools.partial(schedule_pause, schedule_id=schedule_id, now=now)
        )

    async def resume(
        self,
        *,
        schedule_id: int,
        skipped: Sequence[datetime],
        skipped_count: int,
        next_due: datetime | None,
        now: datetime,
    ) -> scheduling.Schedule:
        return await self._db.tx(
            functools.partial(
                schedule_resume,
                schedule_id=schedule_id,
                skipped=skipped,
                skipped_count=skipped_count,
                next_due=next_due,
                now=now,
            )
        )

    async def get(self, *, name: str, tenant: str = "default") -> scheduling.Schedule:
        return await self._db.lookup(functools.partial(schedule_get, name=name, tenant=tenant))

    async def by_id(self, *, schedule_id: int) -> scheduling.Schedule:
        return await self._db.lookup(functools.partial(schedule_by_id, schedule_id=schedule_id))

    async def firings(
        self, *, schedule_id: int, limit: int = 20, before: datetime | None = None
    ) -> list[scheduling.Firing]:
        return await self._db.lookup(
            functools.partial(firing_list, schedule_id=schedule_id, limit=limit, before=before)
        )

    async def firing_counts(self, *, schedule_id: int) -> dict[str, int]:
        return await self._db.lookup(functools.partial(firing_counts, schedule_id=schedule_id))

    async def next_wake(self, *, ahead: timedelta = timedelta(0)) -> datetime | None:
        return await self._db.tx(functools.partial(firings.schedule_next_wake, ahead=ahead))

    async def fire_due(
        self,
        *,
        now: datetime,
        limit: int,
        plan: Callable[[scheduling.Schedule, model.JobState | None], Plan],
        ahead: timedelta = timedelta(0),
        tenants: Mapping[str, tenancy.TenantSettings] | None = None,
    ) -> Fired:
        fire = functools.partial(
            firings.schedules_fire_due, now=now, limit=limit, plan=plan, ahead=ahead
        )
        return await self._db.tx(functools.partial(fire, tenants=tenants))

    async def backfill(
        self,
        *,
        schedule: scheduling.Schedule,
        fires: Sequence[scheduling.Fire],
        now: datetime,
        quota: quotas.Limits | None = None,
    ) -> tuple[int, int]:
        """firings.backfill; with `quota` (a tenant's request), firings.backfill_held."""
        if quota is None:
            return await self._db.tx(
                functools.partial(firings.backfill, schedule=schedule, fires=fires, now=now)
            )
        return await self._db.tx(
            functools.partial(
                firings.backfill_held, schedule=schedule, fires=fires, now=now, quota=quota
            )
        )

    # --- history and stats (firing_stats.py) ----------------------------------------------

    async def history(
        self, *, schedule_id: int, before: datetime | None, limit: int
    ) -> list[counting.FiringRow]:
        return await self._db.lookup(
            functools.partial(
                firing_stats.firing_page, schedule_id=schedule_id, before=before, limit=limit
            )
        )

    async def job_runs(self, *, job_ids: Sequence[int]) -> dict[int, counting.JobRun]:
        return await self._db.lookup(functools.partial(firing_stats.job_runs, job_ids=job_ids))

    async def stats_read(self, *, schedule_id: int, now: datetime) -> counting.Counted:
        return await self._db.lookup(
            functools.partial(firing_stats.stats_read, schedule_id=schedule_id, now=now)
        )

    async def page(
        self, *, schedule_id: int, before: datetime | None, limit: int, now: datetime
    ) -> tuple[list[counting.FiringRow], counting.Counted]:
        return await self._db.lookup(
            functools.partial(
                firing_stats.page_read,
                schedule_id=schedule_id,
                before=before,
                limit=limit,
                now=now,
            )
        )

    async def hours_close(
        self, *, schedule_id: int, closing: counting.Closing, keep_from: datetime
    ) -> bool:
        return await self._db.tx(
            functools.partial(
                firing_stats.hours_close,
                schedule_id=schedule_id,
                closing=closing,
                keep_from=keep_from,
            )
        )

    async def list(
        self, *, tenant: str | None = None, limit: int = 1000, after: tuple[str, str] | None = None
    ) -> list[scheduling.Schedule]:
        return await self._db.lookup(
            functools.partial(schedule_list, tenant=tenant, limit=limit, after=after)
        )
