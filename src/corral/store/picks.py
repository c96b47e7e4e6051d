"""What a claim takes, on the general path and SQLite's hot one: the due jobs of each tenant
waiting, in fair shares across tenants (corral.shares), within the caps of pools and
tenants' max_running (a tenant at its max_running still runs its callback jobs, which no
quota counts: corral.callbacks). PostgreSQL's hot claim makes the same choice in one statement
(store/postgres/claim.py); tests/contract/test_hot_paths.py holds them to it.

A pick reads each tenant's most urgent queued jobs and its longest due scheduled ones (the
due-`scheduled` rule: a scheduled job whose time has come is claimed as a queued one
would be), orders them by turn, and takes up to the limit. With one tenant waiting there
is no share to keep: its jobs are taken most urgent first, and no turn is written. A
tenant that gets n jobs also has its n longest due scheduled jobs queued, as PostgreSQL's
claim does with the ones it locked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select, true

from corral import model, shares
from corral.store import caps as claim_caps
from corral.store import quotas as store_quotas
from corral.store import shares as shares_store
from corral.store.rows import state_is
from corral.store.tables import jobs

J = model.JobState


@dataclass(frozen=True, slots=True)
class Picked:
    """A pick: the jobs to claim (most urgent first), and the scheduled jobs to queue first
    (those claimed among them)."""

    claim: list[int]
    promote: list[int]


@dataclass(frozen=True, slots=True)
class Ask:
    """What a claim asks for: up to `limit` jobs due at `now`, of `executors`, that meet
    `also`, shared by `weights`."""

    now: datetime
    limit: int
    executors: Sequence[str]
    weights: shares.Weights
    also: Sequence[Any] = ()

    def callbacks(self) -> Ask:
        """This ask of callback jobs only: all a tenant at its max_running may still run
        (store/caps.py), read from ix_jobs_callbacks_waiting (store/quotas.py)."""
        return replace(self, also=(*self.also, store_quotas.CALLBACKS_WAITING))

    def where(self, tenant: str, *more: Any) -> list[Any]:
        return [
            jobs.c.tenant == tenant,
            jobs.c.run_at <= self.now,
            jobs.c.executor.in_(list(self.executors)),
            jobs.c.flow.is_(None),  # a flow's jobs are the flow claim's (flow_claims.py)
            *self.also,
            *more,
        ]


_COLUMNS = (
    jobs.c.id,
    jobs.c.tenant,
    jobs.c.priority,
    jobs.c.run_at,
    jobs.c.pool,
    jobs.c.callback_of,
)


def fair_pick(conn: Connection, ask: Ask, caps: claim_caps.Caps | None = None) -> Picked:
    """The jobs `ask` claims, fairly across tenants, within `caps` (none: no pool or tenant
    is capped)."""
    waiting = shares_store.tenants_waiting(conn)
    due: list[shares.Due] = []
    pools: dict[int, tuple[str | None, bool]] = {}
    for tenant in waiting:
        room = ask if caps is None or caps.tenant_has_room(tenant) else ask.callbacks()
        for row in _queued(conn, room, tenant, caps):
            due.append(shares.Due(row.id, row.tenant, row.priority, row.run_at))
            pools[row.id] = (row.pool, row.callback_of is not None)
        for row in _scheduled(conn, room, tenant):
            due.append(shares.Due(row.id, row.tenant, row.priority, row.run_at, waited=True))
            pools[row.id] = (row.pool, row.callback_of is not None)
    many = len(waiting) > 1
    stood = shares_store.places_read(conn, tenants=waiting) if many else shares.Places()
    ordered = shares.in_turn(due, stood, ask.weights)
    if caps is None:
        taken = ordered[: ask.limit]
    else:
        taken = [t for t in ordered if _fits(caps, pools[t[1].id], t[1].tenant)][: ask.limit]
    if many and taken:
        added, reached = shares.moved_on(taken, ask.weights)
        shares_store.places_move(conn, places=stood, added=added, reached=reached)
    return _picked(taken, due, exact=caps is None)


def _fits(caps: claim_caps.Caps, of: tuple[str | None, bool], tenant: str) -> bool:
    """Whether a job (its pool, and whether it is a callback job) fits `caps`."""
    pool, callback = of
    return caps.take(pool, tenant, callback=callback)


def _queued(conn: Connection, ask: Ask, tenant: str, caps: claim_caps.Caps | None) -> list[Any]:
    """`tenant`'s most urgent due queued jobs: up to the limit, of each pool group with room
    when pools are capped."""
    groups = [(true(), ask.limit)] if caps is None else caps.pool_groups(ask.limit)
    out: list[Any] = []
    for in_pool, most in groups:
        out += conn.execute(queued_pick(ask, tenant, in_pool, most)).all()
    return out


def queued_pick(ask: Ask, tenant: str, in_pool: Any = None, most: int | None = None) -> Any:
    """The pick of `tenant`'s most urgent due queued jobs (of `in_pool`), `most` of them
    (by default the limit): a walk of ix_jobs_queued_tenant that stops there."""
    return (
        select(*_COLUMNS)
        .where(jobs.c.state == state_is(J.QUEUED), *ask.where(tenant, *_given(in_pool)))
        .order_by(jobs.c.priority.desc(), jobs.c.run_at, jobs.c.id)
        .limit(ask.limit if most is None else most)
    )


def _given(condition: Any) -> list[Any]:
    return [] if condition is None else [condition]


def _scheduled(conn: Connection, ask: Ask, tenant: str) -> list[Any]:
    """`tenant`'s longest due scheduled jobs, up to the limit."""
    stmt = (
        select(*_COLUMNS)
        .where(jobs.c.state == state_is(J.SCHEDULED), *ask.where(tenant))
        .order_by(jobs.c.run_at, jobs.c.id)
        .limit(ask.limit)
    )
    return list(conn.execute(stmt).all())


def _picked(
    taken: Sequence[tuple[float, shares.Due]], due: Sequence[shares.Due], *, exact: bool
) -> Picked:
    """The pick of `taken`: for each tenant that got n jobs, its n longest due scheduled
    jobs are queued; uncapped (`exact`), the tenant's claimed jobs are then the n most
    urgent of its n most urgent queued and those, as PostgreSQL's claim takes them."""
    counts: dict[str, int] = {}
    for _, job in taken:
        counts[job.tenant] = counts.get(job.tenant, 0) + 1
    claim: list[shares.Due] = [] if exact else [job for _, job in taken]
    promote: set[int] = set() if exact else {job.id for job in claim if job.waited}
    for tenant, n in counts.items():
        own = [job for job in due if job.tenant == tenant]
        came = sorted((j for j in own if j.waited), key=lambda j: (j.run_at, j.id))[:n]
        promote.update(j.id for j in came)
        if exact:
            ready = sorted((j for j in own if not j.waited), key=shares.urgency)[:n]
            claim += sorted([*ready, *came], key=shares.urgency)[:n]
    claim.sort(key=shares.urgency)
    return Picked([j.id for j in claim], sorted(promote))


def caps_of(
    pools: Mapping[str, int] | None, tenants: Mapping[str, int] | None
) -> claim_caps.Caps | None:
    """The caps a claim keeps, or None when no pool or tenant is capped."""
    return claim_caps.Caps(pools or {}, tenants or {}) if pools or tenants else None
