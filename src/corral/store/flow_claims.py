"""The flow claim: the due jobs of tenants' flows (corral.flows), claimed only while their
flow has room, within the same caps and fair shares as every other job, in one transaction
of a few statements on either database.

Jobs of a flow are kept out of the claim of every other job (claims.py, picks.py and the
hot paths pick `flow IS NULL` only, and ix_jobs_queued_tenant holds none of them), so the
flows' checks cost those nothing. Here:

1. the scheduled jobs of flows whose time has come are queued;
2. when pools or tenants are capped, the claim takes its turn with every claim that counts
   running jobs (as claims.job_claim does) and counts them (store/caps.py);
3. the flows with a due queued job that are not held by a Retry-After, of tenants with room,
   are read and locked (PostgreSQL: FOR NO KEY UPDATE SKIP LOCKED; a flow another
   dispatcher is claiming now is left to it, and a submit naming it, FOR KEY SHARE, is no
   obstacle), so no two claims count the same flow at once;
4. the claim's part of the room: the flows' tenants' fair part (shares.fair_part) beside the
   tenants with due jobs of no flow, which the main claim serves after this one, or all
   the room those jobs leave;
5. each flow's room (flows.room): its rate less the starts in its window, counted after the
   lock, so a start another claim just committed is counted; its parallelism less its jobs
   running;
6. that many of each one's most urgent jobs (of the pools with room), taken in fair shares
   across tenants (shares.in_turn) while their flow, pool and tenant have room, up to the
   claim's part; claimed as any job is (claims.jobs_claim), a start recorded for each, and
   the tenants served moved on (store/shares.places_move).

A flow whose jobs cannot start stays locked only for this transaction, and its jobs stay
queued: nothing behind them waits for them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    and_,
    delete,
    func,
    insert,
    literal,
    or_,
    select,
    true,
    tuple_,
    union_all,
)

from corral import flows, model, shares
from corral.store import caps as claim_caps
from corral.store import claims, dialects, picks
from corral.store import flows as stored_flows
from corral.store import shares as shares_store
from corral.store.rows import state_is
from corral.store.tables import flow_starts, jobs
from corral.store.tables import flows as flows_table

F, S, JC = flows_table.c, flow_starts.c, jobs.c
J = model.JobState
PROBES = 200
"""The most tenants one statement probes for due jobs of no flow (SQLite allows at most
500 SELECTs in one compound statement)."""


@dataclass(frozen=True, slots=True)
class Ask:
    """What a flow claim asks for: up to `limit` due jobs at `now` of `executors`, within
    `caps` (None: nothing capped), shared by `weights`."""

    now: datetime
    limit: int
    executors: Sequence[str]
    caps: claim_caps.Caps | None
    weights: shares.Weights


def flow_claim(
    conn: Connection,
    *,
    now: datetime,
    limit: int,
    executors: Sequence[str],
    limits: claims.DefaultLimits | None = None,
    pools: Mapping[str, int] | None = None,
    tenants: Mapping[str, int] | None = None,
    weights: shares.Weights | None = None,
) -> list[model.Claimed]:
    """Claim up to a fair part of `limit` due jobs of flows with room, of `executors`,
    within the caps of `pools` and `tenants` and shared by `weights` (see the module's
    docstring), each with its attempt in `launching`, most urgent first."""
    if limit <= 0:
        return []
    ask = Ask(now, limit, executors, picks.caps_of(pools, tenants), weights or shares.Weights())
    of = [JC.flow.is_not(None), JC.executor.in_(list(executors))]
    claims.jobs_promote_due(conn, now=now, limit=limit, where=of)
    if ask.caps is not None:
        dialects.take_turns(conn, "corral.pools")
        ask.caps.count(conn)
    waiting, picked = _pick(conn, ask)
    claimed = claims.jobs_claim(conn, ids=picked, now=now, limits=limits)
    by_name = {(f.tenant, f.name): f for f in waiting}
    started = Counter(by_name[(c.job.tenant, c.job.flow or "")].id for c in claimed)
    _starts_record(conn, [f for f in waiting if f.rate is not None], started, now)
    return claimed


def _pick(conn: Connection, ask: Ask) -> tuple[list[flows.Flow], list[int]]:
    """The flows waiting, of tenants with room (locked), and the ids of their jobs that
    the claim takes (steps 3 to 6 of the module's docstring)."""
    waiting = [
        f
        for f in _flows_waiting(conn, ask.now, ask.executors)
        if ask.caps is None or ask.caps.tenant_has_room(f.tenant)
    ]
    use = _use(conn, waiting, ask.now)
    room = {f.id: flows.room(f, use[f.id], ask.now) for f in waiting}
    mine = sorted({f.tenant for f in waiting if room[f.id] != 0})
    if not mine:
        return waiting, []
    others = _others_due(conn, ask, exclude=mine)
    part = shares.fair_part(ask.limit, mine, others, ask.weights)
    due: dict[int, tuple[int, Any]] = {}  # by job id: its flow's id, its row
    for flow in waiting:
        most = part if (left := room[flow.id]) is None else min(left, part)
        due |= {row.id: (flow.id, row) for row in _queued(conn, flow, most, ask)}
    return waiting, _in_turn(conn, due, room, ask, part, everyone=[*mine, *others])


def _flows_waiting(conn: Connection, now: datetime, executors: Sequence[str]) -> list[flows.Flow]:
    """The flows with a due queued job of `executors` that no Retry-After holds, locked
    (those another claim holds are skipped; the lock lets submits naming them by)."""
    due = select(JC.id).where(*_due(F.tenant, F.name, now, executors)).exists()
    stmt = (
        select(flows_table)
        .where(or_(F.held_until.is_(None), F.held_until <= now), due)
        .order_by(F.id)
    )
    if conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update(skip_locked=True, of=flows_table, key_share=True)
    return [stored_flows.flow_of(r) for r in conn.execute(stmt)]


def _use(conn: Connection, waiting: Sequence[flows.Flow], now: datetime) -> dict[int, flows.Use]:
    """What each flow of `waiting` uses now: how many starts its window counts (counted in
    the database, a range of ix_flow_starts_flow each), its jobs running."""
    rated = [f for f in waiting if f.rate is not None]
    started: Mapping[int, int] = {}
    if rated:
        windows = [
            and_(S.flow_id == f.id, S.started_at > now - f.rate.per)
            for f in rated
            if f.rate is not None
        ]
        counted = conn.execute(
            select(S.flow_id, func.count()).where(or_(*windows)).group_by(S.flow_id)
        )
        started = {flow_id: n for flow_id, n in counted}
    capped = [(f.tenant, f.name) for f in waiting if f.parallelism is not None]
    running: Mapping[tuple[str, str], int] = {}
    if capped:
        counted = conn.execute(
            select(JC.tenant, JC.flow, func.count())
            .where(
                JC.state == state_is(J.RUNNING),
                JC.flow.is_not(None),
                tuple_(JC.tenant, JC.flow).in_(capped),
            )
            .group_by(JC.tenant, JC.flow)
        )
        running = {(t, f): n for t, f, n in counted}
    return {
        f.id: flows.Use(started.get(f.id, 0), running.get((f.tenant, f.name), 0)) for f in waiting
    }


def _others_due(conn: Connection, ask: Ask, *, exclude: Sequence[str]) -> dict[str, int]:
    """The tenants but `exclude` whose due jobs of no flow (of `ask`'s executors) the main
    claim could take now (their tenant has room), and how many each has (up to the limit):
    a short walk of ix_jobs_queued_tenant and of ix_jobs_scheduled_tenant each."""
    waiting = [
        t
        for t in shares_store.tenants_waiting(conn)
        if t not in exclude and (ask.caps is None or ask.caps.tenant_has_room(t))
    ]
    found: dict[str, int] = {}
    for start in range(0, len(waiting), PROBES):
        probes = [
            select(
                literal(t).label("tenant"),
                _plain_due(t, J.QUEUED, ask) + _plain_due(t, J.SCHEDULED, ask),
            )
            for t in waiting[start : start + PROBES]
        ]
        found |= {t: n for t, n in conn.execute(union_all(*probes)) if n}
    return found


def _plain_due(tenant: str, state: model.JobState, ask: Ask) -> Any:
    """How many due jobs of no flow `tenant` has in `state`, of `ask`'s executors (counted
    up to the limit)."""
    due = (
        select(JC.id)
        .where(
            JC.state == state_is(state),
            JC.tenant == tenant,
            JC.run_at <= ask.now,
            JC.executor.in_(list(ask.executors)),
            JC.flow.is_(None),
        )
        .limit(ask.limit)
        .subquery()
    )
    return select(func.count()).select_from(due).scalar_subquery()


_COLUMNS = (JC.id, JC.tenant, JC.flow, JC.priority, JC.run_at, JC.pool)


def _queued(conn: Connection, flow: flows.Flow, most: int, ask: Ask) -> list[Any]:
    """`flow`'s `most` most urgent due queued jobs of `ask`'s executors (of each pool group
    with room when pools are capped): a walk of ix_jobs_flow_queued that stops there."""
    if most <= 0:
        return []
    groups = [(true(), most)] if ask.caps is None else ask.caps.pool_groups(most)
    out: list[Any] = []
    for in_pool, at_most in groups:
        stmt = (
            select(*_COLUMNS)
            .where(*_due(flow.tenant, flow.name, ask.now, ask.executors), in_pool)
            .order_by(JC.priority.desc(), JC.run_at, JC.id)
            .limit(min(at_most, most))
        )
        out += conn.execute(dialects.skip_locked(conn, stmt)).all()
    return out


def _due(tenant: Any, flow: Any, now: datetime, executors: Sequence[str]) -> list[Any]:
    """A flow's due queued jobs of `executors`, as ix_jobs_flow_queued's WHERE reads them
    (`flow IS NOT NULL` said, for the planner to match it)."""
    return [
        JC.state == state_is(J.QUEUED),
        JC.flow.is_not(None),
        JC.tenant == tenant,
        JC.flow == flow,
        JC.run_at <= now,
        JC.executor.in_(list(executors)),
    ]


def _in_turn(
    conn: Connection,
    due: Mapping[int, tuple[int, Any]],
    room: Mapping[int, int | None],
    ask: Ask,
    part: int,
    *,
    everyone: Sequence[str],
) -> list[int]:
    """Of the `due` rows (by job id: its flow's id and its row), the ids the claim takes:
    in fair shares across tenants (their turns read from the store, and moved on by what
    they got), each while its flow (`room`, by flow id), its pool and its tenant have room,
    up to `part`. Turns count when `everyone` (the tenants waiting) is more than one."""
    many = len(set(everyone)) > 1
    stood = shares_store.places_read(conn, tenants=sorted(set(everyone))) if many else None
    ordered = shares.in_turn(
        [shares.Due(r.id, r.tenant, r.priority, r.run_at) for _, r in due.values()],
        stood or shares.Places(),
        ask.weights,
    )
    left = dict(room)
    taken: list[tuple[float, shares.Due]] = []
    for turn, job in ordered:
        if len(taken) >= part:
            break
        flow_id, row = due[job.id]
        has = left[flow_id]
        if has == 0 or (ask.caps is not None and not ask.caps.take(row.pool, row.tenant)):
            continue
        left[flow_id] = None if has is None else has - 1
        taken.append((turn, job))
    if stood is not None and taken:
        added, reached = shares.moved_on(taken, ask.weights)
        shares_store.places_move(conn, places=stood, added=added, reached=reached)
    return [job.id for _, job in taken]


def _starts_record(
    conn: Connection, rated: Sequence[flows.Flow], started: Counter[int], now: datetime
) -> None:
    """A start at `now` for each job claimed of a flow with a rate, and the starts each such
    flow's window no longer counts deleted."""
    rows = [
        {"flow_id": f.id, "started_at": now} for f in rated for _ in range(started.get(f.id, 0))
    ]
    if rows:
        conn.execute(insert(flow_starts), rows)
    for f in rated:
        if started.get(f.id) and f.rate is not None:
            conn.execute(
                delete(flow_starts).where(S.flow_id == f.id, S.started_at <= now - f.rate.per)
            )
