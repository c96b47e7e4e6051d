"""Each tenant's use of its quotas, and the tenants the store knows of.

A use is read in a few statements (jobs waiting and running, schedules, monitors, submit
buckets, run-log bytes), each over every tenant or narrowed to one: never a statement per
tenant, so one read serves a scrape of every tenant's gauges. Jobs are counted tenant by tenant
inside one statement, through the (tenant, state) index, so that the finished jobs beside
the counted ones are never read. The tenants
known are those that own a token, a dashboard user, a job or a schedule; jobs and
schedules are skipped through by their tenant index, a probe a tenant, however many rows
each tenant has.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from sqlalchemy import Column, ColumnElement, Connection, Table, TextClause, func, literal, select

from corral import model, quotas, usage
from corral.store import quotas as store_quotas
from corral.store import runlogs
from corral.store.tables import jobs, monitors, schedules, tenant_buckets, tokens, users

if TYPE_CHECKING:
    from corral.store.database import Database

J = model.JobState


def tenant_use(conn: Connection, *, tenant: str | None = None) -> dict[str, usage.Use]:
    """What each tenant uses (only `tenant`, when given), a tenant that uses nothing left
    out: six grouped statements."""
    waiting, running = _jobs_counted(conn, tenant)
    made = _counted(conn, schedules, tenant)
    watching = _counted(conn, monitors, tenant)
    buckets = _buckets(conn, tenant)
    kept = runlogs.run_log_bytes(conn, tenant=tenant)
    return {
        name: usage.Use(
            waiting=waiting.get(name, 0),
            running=running.get(name, 0),
            schedules=made.get(name, 0),
            monitors=watching.get(name, 0),
            bucket=buckets.get(name),
            log_bytes=kept.get(name, 0),
        )
        for name in sorted({*waiting, *running, *made, *watching, *buckets, *kept})
    }


def _jobs_counted(conn: Connection, tenant: str | None) -> tuple[dict[str, int], dict[str, int]]:
    """Each tenant's jobs waiting and running, as its quotas count them (no callback job):
    for each tenant (skipped through by ix_jobs_tenant_state, or `tenant` alone) a range of
    that index read for those states, so the read grows with the jobs counted, never with
    the finished ones beside them; its callbacks that wait read from
    ix_jobs_callbacks_waiting (store/quotas.py), and its running jobs' rows, to leave out
    the callbacks among them."""
    waiting_states = [s.value for s in quotas.WAITING]
    if tenant is None:
        walk = _tenant_walk(jobs.c.tenant)
        names: Any = select(walk.c.tenant).where(walk.c.tenant.is_not(None)).subquery()
    else:
        names = select(literal(tenant).label("tenant")).subquery()

    def count(*where: ColumnElement[bool] | TextClause) -> Any:
        return select(func.count()).where(jobs.c.tenant == names.c.tenant, *where).scalar_subquery()

    stmt = select(
        names.c.tenant,
        count(jobs.c.state.in_(waiting_states)),
        count(store_quotas.CALLBACKS_WAITING),
        count(jobs.c.state == J.RUNNING.value, jobs.c.callback_of.is_(None)),
    )
    waiting, running = {}, {}
    for name, waits, callbacks, runs in conn.execute(stmt):
        if waits := waits - callbacks:
            waiting[name] = int(waits)
        if runs:
            running[name] = int(runs)
    return waiting, running


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
    walk = _tenant_walk(column)
    return [name for name in conn.execute(select(walk.c.tenant)).scalars() if name is not None]


def _tenant_walk(column: Column[Any]) -> Any:
    """The recursive statement of `_tenants_of`: its last row's tenant is NULL."""
    walk = select(func.min(column).label("tenant")).cte("walk", recursive=True)
    above = select(func.min(column)).where(column > walk.c.tenant).scalar_subquery()
    return walk.union_all(select(above).where(walk.c.tenant.is_not(None)))


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
