"""Flows a tenant owns (corral.flows): made, listed, changed and deleted within their tenant;
what one uses now (its starts in its window, its jobs running), for `jobs explain`; and the
hold a Retry-After puts on a whole flow, written with the completion that brought it.

What a flow's fields may be is checked before they are stored (corral.flows); here only
what needs the transaction: a name taken, the tenant's limit, a flow still in use, and the
flows a submit names being the tenant's own. The claim of flows' jobs is flow_claims.py.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, delete, func, insert, select, tuple_, update
from sqlalchemy.exc import IntegrityError

from corral import errors, flows, model, shares
from corral.store import claims
from corral.store.events import event_insert, event_row
from corral.store.rows import state_is
from corral.store.tables import flow_starts, jobs, schedules
from corral.store.tables import flows as flows_table

if TYPE_CHECKING:
    from corral.store.database import Database

F, S = flows_table.c, flow_starts.c
J = model.JobState
UNFINISHED = (J.QUEUED, J.SCHEDULED, J.RUNNING, J.QUARANTINED, J.PARKED)
"""The states of a job that a flow's deletion waits for: a quarantined job may be sent back
to the queue, and a parked one goes back when its worker does, each still naming its flow."""


def flow_of(row: Any) -> flows.Flow:
    """A flows row as the model's Flow."""
    rate = None
    if row.rate is not None and row.per_seconds is not None:
        rate = flows.Rate(row.rate, timedelta(seconds=row.per_seconds))
    return flows.Flow(
        row.id,
        row.tenant,
        row.name,
        rate,
        row.parallelism,
        row.held_until,
        row.held_reason,
        row.created_at,
        row.updated_at,
    )


def _limits(limits: flows.Limits) -> dict[str, Any]:
    """The columns `limits` sets (an update's: only those it names)."""
    values: dict[str, Any] = {}
    if limits.rate is not None:
        values |= {"rate": limits.rate.count, "per_seconds": limits.rate.per.total_seconds()}
    elif "rate" in limits.clear:
        values |= {"rate": None, "per_seconds": None}
    if limits.parallelism is not None:
        values["parallelism"] = limits.parallelism
    elif "parallelism" in limits.clear:
        values["parallelism"] = None
    return values


def flow_add(
    conn: Connection, *, tenant: str, name: str, limits: flows.Limits, now: datetime, most: int
) -> flows.Flow:
    """Store `tenant`'s flow `name`: Conflict when the name is taken or it has `most`."""
    held = conn.execute(select(F.id).where(F.tenant == tenant).with_for_update()).all()
    if len(held) >= most:
        raise errors.Conflict(
            f"name: tenant {tenant!r} has {len(held)} flows already, the most a tenant may"
            f" have ({most}); delete one first"
        )
    values = {"tenant": tenant, "name": name, **_limits(limits)}
    try:
        with conn.begin_nested():
            stmt = insert(flows_table).values(**values, created_at=now, updated_at=now)
            return flow_of(conn.execute(stmt.returning(*flows_table.c)).one())
    except IntegrityError:
        raise errors.Conflict(
            f"name: tenant {tenant!r} has a flow named {name!r} already"
        ) from None


def flow_update(
    conn: Connection, *, tenant: str, name: str, limits: flows.Limits, now: datetime
) -> flows.Flow | None:
    """Change `tenant`'s flow `name`'s limits (those `limits` names); None: no such flow."""
    stmt = (
        update(flows_table)
        .where(F.tenant == tenant, F.name == name)
        .values(**_limits(limits), updated_at=now)
        .returning(*flows_table.c)
    )
    row = conn.execute(stmt).first()
    return None if row is None else flow_of(row)


def flows_list(conn: Connection, *, tenant: str) -> list[flows.Flow]:
    """`tenant`'s flows, by name."""
    found = conn.execute(select(flows_table).where(F.tenant == tenant).order_by(F.name))
    return [flow_of(r) for r in found]


def flow_get(conn: Connection, *, tenant: str, name: str) -> flows.Flow | None:
    """`tenant`'s flow `name`, or None."""
    row = conn.execute(select(flows_table).where(F.tenant == tenant, F.name == name)).first()
    return None if row is None else flow_of(row)


def flow_delete(conn: Connection, *, tenant: str, name: str) -> bool:
    """Delete `tenant`'s flow `name` and its starts (False: it has none so named); Conflict
    while a job of the tenant not ended yet, or a schedule, names it."""
    row = conn.execute(
        select(F.id).where(F.tenant == tenant, F.name == name).with_for_update()
    ).first()
    if row is None:
        return False
    waiting = conn.execute(
        select(func.count()).where(
            jobs.c.tenant == tenant, jobs.c.flow == name, jobs.c.state.in_(UNFINISHED)
        )
    ).scalar_one()
    if waiting:
        raise errors.Conflict(
            f"name: {waiting} jobs of flow {name!r} have not ended yet (queued, scheduled,"
            " running, quarantined or parked); wait for them, or cancel them, then delete"
            " the flow"
        )
    templates = conn.execute(
        select(schedules.c.name, schedules.c.template).where(schedules.c.tenant == tenant)
    )
    if using := sorted(s.name for s in templates if (s.template or {}).get("flow") == name):
        raise errors.Conflict(
            f"name: schedule {using[0]!r} names flow {name!r}; change or delete the schedule first"
        )
    conn.execute(delete(flow_starts).where(S.flow_id == row.id))
    conn.execute(delete(flows_table).where(F.id == row.id))
    return True


def flows_exist(conn: Connection) -> bool:
    """Whether any tenant has a flow: one probe of the table."""
    return conn.execute(select(F.id).limit(1)).first() is not None


def flows_named(conn: Connection, *, named: Collection[tuple[str, str]]) -> None:
    """InvalidInput naming `flow` unless each (tenant, flow) of `named` is a flow of that
    tenant. On PostgreSQL the flows are kept (FOR KEY SHARE) until the submit commits, so a
    deletion (FOR UPDATE) waits for it, and then sees its jobs; the flow claim's lock (FOR
    NO KEY UPDATE) and a hold's update do not wait for it, nor it for them."""
    wanted = sorted(named)
    found = conn.execute(
        select(F.tenant, F.name)
        .where(tuple_(F.tenant, F.name).in_(wanted))
        .with_for_update(read=True, key_share=True)
    ).all()
    have = {(r.tenant, r.name) for r in found}
    for tenant, name in wanted:
        if (tenant, name) not in have:
            raise errors.InvalidInput(
                f"flow: tenant {tenant!r} has no flow named {name!r}; add it first with"
                f" `corral flows add {name} --tenant {tenant}` (or POST /api/v1/flows)"
            )


def flow_use(conn: Connection, *, flow: flows.Flow, now: datetime) -> flows.Use:
    """What `flow` uses at `now`: how many starts its rate counts (counted in the database),
    the one that holds its next start once they reach the rate (one row, at OFFSET count -
    rate of them oldest first), and its jobs running."""
    started, holding = 0, None
    if flow.rate is not None:
        window = (S.flow_id == flow.id, S.started_at > now - flow.rate.per)
        started = conn.execute(select(func.count()).where(*window)).scalar_one()
        if started >= flow.rate.count:
            holding = conn.execute(
                select(S.started_at)
                .where(*window)
                .order_by(S.started_at)
                .offset(started - flow.rate.count)
                .limit(1)
            ).scalar()
    running = conn.execute(
        select(func.count()).where(
            jobs.c.state == state_is(J.RUNNING),
            jobs.c.flow == flow.name,
            jobs.c.tenant == flow.tenant,
        )
    ).scalar_one()
    return flows.Use(started, running, holding)


def flows_hold(
    conn: Connection,
    *,
    holds: Sequence[tuple[model.Job, int | None, float | None]],
    now: datetime,
) -> None:
    """Hold the flow of each job of `holds` whose attempt ended with a 429 or 503 and a
    Retry-After (job, HTTP status, seconds) until then (a hold already longer stays), each
    with an event on the job that brought it; the others are left alone. The flows are
    updated in (tenant, flow) order, as by every writer: two never wait for each other's."""
    rows = []
    for job, status, seconds in sorted(holds, key=lambda h: (h[0].tenant, h[0].flow or "")):
        if job.flow is None or seconds is None or status not in flows.HOLD_STATUSES:
            continue
        until = flows.hold_until(now, seconds)
        reason = flows.hold_reason(status, job.id)
        held = conn.execute(
            update(flows_table)
            .where(F.tenant == job.tenant, F.name == job.flow)
            .where((F.held_until.is_(None)) | (F.held_until < until))
            .values(held_until=until, held_reason=reason, updated_at=now)
            .returning(F.id)
        ).first()
        if held is not None:
            rows.append(
                event_row(
                    job_id=job.id,
                    attempt_id=None,
                    entity="job",
                    frm=job.state,
                    to=job.state,
                    reason=f"its flow {job.flow!r} is held until {until.isoformat()}: {reason}",
                    now=now,
                    details={"flow": job.flow, "held_until": until.isoformat()},
                )
            )
    if rows:
        event_insert(conn, rows)


# --- the handle ----------------------------------------------------------------------------


class Flows:
    """The store's handle on tenants' flows (`store.flows`).

    Each method runs the store function its name says, in one transaction; that function's
    docstring says what the call does.
    """

    def __init__(self, db: Database) -> None:
        self._db = db

    async def add(
        self, *, tenant: str, name: str, limits: flows.Limits, now: datetime, most: int
    ) -> flows.Flow:
        return await self._db.tx(
            functools.partial(flow_add, tenant=tenant, name=name, limits=limits, now=now, most=most)
        )

    async def update(
        self, *, tenant: str, name: str, limits: flows.Limits, now: datetime
    ) -> flows.Flow | None:
        return await self._db.tx(
            functools.partial(flow_update, tenant=tenant, name=name, limits=limits, now=now)
        )

    async def of(self, *, tenant: str) -> list[flows.Flow]:
        return await self._db.read(functools.partial(flows_list, tenant=tenant))

    async def get(self, *, tenant: str, name: str) -> flows.Flow | None:
        return await self._db.read(functools.partial(flow_get, tenant=tenant, name=name))

    async def delete(self, *, tenant: str, name: str) -> bool:
        return await self._db.tx(functools.partial(flow_delete, tenant=tenant, name=name))

    async def exist(self) -> bool:
        return await self._db.read(flows_exist)

    async def use(self, *, flow: flows.Flow, now: datetime) -> flows.Use:
        return await self._db.read(functools.partial(flow_use, flow=flow, now=now))

    async def claim(
        self,
        *,
        now: datetime,
        limit: int,
        executors: Sequence[str],
        limits: claims.DefaultLimits | None = None,
        pools: Mapping[str, int] | None = None,
        tenants: Mapping[str, int] | None = None,
        weights: shares.Weights | None = None,
    ) -> list[model.Claimed]:
        from corral.store import flow_claims  # it reads flows through this module

        claim = functools.partial(
            flow_claims.flow_claim,
            now=now,
            limit=limit,
            executors=executors,
            limits=limits,
            pools=pools,
            tenants=tenants,
            weights=weights,
        )
        return await self._db.tx(claim)
