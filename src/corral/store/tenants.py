"""Each tenant's use of its quotas, and the tenants the store knows of.

A use is read in grouped statements, one for each kind (jobs waiting, jobs running,
schedules, submit buckets, run-log bytes), each grouped by tenant or narrowed to one: never
a statement per tenant, so one read serves a scrape of every tenant's gauges. The tenants
known are those that own a token, a dashboard user, a job or a schedule; jobs and
schedules are skipped through by their tenant index, a probe a tenant, however many rows
each tenant has.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from sqlalchemy import Column, ColumnElement, Connection, Table, func, select

from corral import model, quotas, usage
from corral.store import runlogs
from corral.store.tables import jobs, schedules, tenant_buckets, tokens, users

if TYPE_CHECKING:
    from corral.store.database import Database

J = model.JobState


def tenant_use(conn: Connection, *, tenant: str | None = None) -> dict[str, usage.Use]:
    """What each tenant uses (only `tenant`, when given), a tenant that uses nothing left
    out: five grouped statements."""
    waiting = _counted(conn, jobs, tenant, jobs.c.state.in_([s.value for s in quotas.WAITING]))
    running = _counted(conn, jobs, tenant, jobs.c.state == J.RUNNING.value)
    made = _counted(conn, schedules, tenant)
    buckets = _buckets(conn, tenant)
    kept = runlogs.run_log_bytes(conn, tenant=tenant)
    return {
        name: usage.Use(
            waiting=waiting.get(name, 0),
            running=running.get(name, 0),
            schedules=made.get(name, 0),
            bucket=buckets.get(name),
            log_bytes=kept.get(name, 0),
        )
        for name in sorted({*waiting, *running, *made, *buckets, *kept})
    }


def _counted(
    conn: Connection, table: Table, tenant: str | None, *where: ColumnElement[bool]
) -> dict[str, int]:
    """Rows of `table` (that match `where`) by tenant."""
    stmt = select(table.c.tenant, func.count()).where(*where).group_by(table.c.tenant)
    if tenant is not None:
        stmt = stmt.where(table.c.tenant == tenant)
    return {name: int(n) for name, n in conn.execute(stmt)}


def _buckets(conn: Connection, tenant: str | None) -> dict[str, usage.Bucket]:
    """Each tenant's submit_rate bucket as stored."""
    stmt = select(tenant_buckets)
    if tenant is not None:
        stmt = stmt.where(tenant_buckets.c.tenant == tenant)
    return {row.tenant: usage.Bucket(row.tokens, row.filled_at) for row in conn.execute(stmt)}


def tenants_known(conn: Connection) -> list[str]:
    """The tenants that own a live token, a dashboard user, a job or a schedule, by name."""
    found = {*_tenants_of(conn, jobs.c.tenant), *_tenants_of(conn, schedules.c.tenant)}
    for table, gone in ((tokens, tokens.c.revoked_at), (users, users.c.removed_at)):
        stmt = select(table.c.tenant).where(table.c.tenant.is_not(None), gone.is_(None))
        found.update(conn.execute(stmt.distinct()).scalars())
    return sorted(found)


def _tenants_of(conn: Connection, column: Column[Any]) -> list[str]:
    """The distinct values of an indexed tenant column, skipping through its index: the
    least, then the least above it, and so on (a recursive statement, one probe a tenant;
    neither database skips through an index by itself for DISTINCT)."""
    walk = select(func.min(column).label("tenant")).cte("walk", recursive=True)
    above = select(func.min(column)).where(column > walk.c.tenant).scalar_subquery()
    walk = walk.union_all(select(above).where(walk.c.tenant.is_not(None)))
    return [name for name in conn.execute(select(walk.c.tenant)).scalars() if name is not None]


def tenants_every(conn: Connection) -> dict[str, usage.Use]:
    """Every tenant known, with what it uses (nothing, for one that uses nothing)."""
    used = tenant_use(conn)
    return {name: used.get(name, usage.Use()) for name in sorted({*tenants_known(conn), *used})}


# --- the handle ----------------------------------------------------------------------------


class Tenants:
    """The store's handle on tenants' use of their quotas (`store.tenants`): each call a
    read of its own.

    Each method runs the store function its name shortens (`use`: tenant_use), named in
    its body; that function's docstring says what the call does.
    """

    def __init__(self, db: Database) -> None:
        self._db = db

    async def use(self, *, tenant: str) -> usage.Use:
        """What `tenant` uses now."""
        found = await self._db.lookup(functools.partial(tenant_use, tenant=tenant))
        return found.get(tenant, usage.Use())

    async def every(self) -> dict[str, usage.Use]:
        """Every tenant the store knows of, with what each uses now, by name."""
        return await self._db.lookup(tenants_every)

    async def known(self) -> list[str]:
        """The tenants that own a live token, a dashboard user, a job or a schedule."""
        return await self._db.lookup(tenants_known)
