"""The caps a claim keeps: each pool's slots and each tenant's max_running, counted against
the jobs running now, and taken one job at a time as a claim picks (store/picks.py). A
callback job (corral.callbacks) counts against no quota: max_running neither counts it
running nor holds it back (a pool's slots, the operator's, do)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, func, or_, select, true

from corral import model
from corral.store.rows import state_is
from corral.store.tables import jobs

J = model.JobState


class Caps:
    """The room pools and tenants have left, taken one job at a time."""

    def __init__(self, pools: Mapping[str, int], tenants: Mapping[str, int]) -> None:
        self.pools, self.tenants = pools, tenants
        self.pool_room: dict[str | None, int] = {}
        self.tenant_room: dict[str, int] = {}

    def count(self, conn: Connection) -> None:
        """Read how many jobs of each capped pool and tenant run now."""
        in_pools = pool_running(conn, pools=list(self.pools))
        of_tenants = tenant_running(conn, tenants=list(self.tenants))
        self.pool_room = {p: n - in_pools.get(p, 0) for p, n in self.pools.items()}
        self.tenant_room = {t: n - of_tenants.get(t, 0) for t, n in self.tenants.items()}

    def tenant_has_room(self, tenant: str) -> bool:
        return self.tenant_room.get(tenant, 1) > 0

    def pool_groups(self, limit: int) -> list[tuple[Any, int]]:
        """(pool condition, most jobs) for each pool with free slots, and for the jobs of
        no capped pool."""
        pools = list(self.pools)
        groups: list[tuple[Any, int]] = [
            (or_(jobs.c.pool.is_(None), jobs.c.pool.not_in(pools)) if pools else true(), limit)
        ]
        groups += [
            (jobs.c.pool == p, min(r, limit)) for p, r in sorted(self.pool_room.items()) if r > 0
        ]
        return groups

    def take(self, pool: str | None, tenant: str, *, callback: bool = False) -> bool:
        """Whether a job of `pool` and `tenant` fits, counting it in when it does (a
        `callback` job against its pool only)."""
        capped = not callback and tenant in self.tenant_room
        if self.pool_room.get(pool, 1) <= 0 or (capped and self.tenant_room[tenant] <= 0):
            return False
        if pool in self.pool_room:
            self.pool_room[pool] -= 1
        if capped:
            self.tenant_room[tenant] -= 1
        return True


def pool_running(
    conn: Connection, *, pools: Sequence[str], tenant: str | None = None
) -> dict[str, int]:
    """How many jobs of each pool are running now (of `tenant` only, when given)."""
    if not pools:
        return {}
    stmt = (
        select(jobs.c.pool, func.count())
        .where(jobs.c.state == state_is(J.RUNNING), jobs.c.pool.in_(list(pools)))
        .group_by(jobs.c.pool)
    )
    if tenant is not None:
        stmt = stmt.where(jobs.c.tenant == tenant)
    return {pool: count for pool, count in conn.execute(stmt)}


def tenant_running(conn: Connection, *, tenants: Sequence[str]) -> dict[str, int]:
    """How many jobs of each tenant are running now, as max_running counts them (no
    callback job)."""
    if not tenants:
        return {}
    stmt = (
        select(jobs.c.tenant, func.count())
        .where(
            jobs.c.state == state_is(J.RUNNING),
            jobs.c.tenant.in_(list(tenants)),
            jobs.c.callback_of.is_(None),
        )
        .group_by(jobs.c.tenant)
    )
    return {tenant: count for tenant, count in conn.execute(stmt)}
