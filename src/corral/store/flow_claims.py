"""The flow claim: the due jobs of tenants' flows (corral.flows), claimed only while their
flow has room, in one transaction of a few statements on either database.

Jobs of a flow are kept out of the claim of every other job (claims.py, picks.py and the
hot paths pick `flow IS NULL` only), so the flows' checks cost those nothing. Here:

1. the scheduled jobs of flows whose time has come are queued;
2. the flows with a due queued job that are not held by a Retry-After are read and locked
   (PostgreSQL: FOR UPDATE SKIP LOCKED; a flow another dispatcher is claiming now is left
   to it), so no two claims count the same flow at once;
3. each one's room (flows.room): its rate less the starts in its window, read after the
   lock, so a start another claim just committed is counted; its parallelism less its jobs
   running;
4. that many of each one's most urgent jobs, and of them all the most urgent up to the
   limit, are claimed as any job is (claims.jobs_claim), and a start recorded for each.

A flow whose jobs cannot start stays locked only for this transaction, and its jobs stay
queued: nothing behind them waits for them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, delete, func, insert, or_, select, tuple_

from corral import flows, model
from corral.store import claims, dialects
from corral.store import flows as stored_flows
from corral.store.rows import state_is
from corral.store.tables import flow_starts, jobs
from corral.store.tables import flows as flows_table

F, S, JC = flows_table.c, flow_starts.c, jobs.c
J = model.JobState


def flow_claim(
    conn: Connection,
    *,
    now: datetime,
    limit: int,
    executors: Sequence[str],
    limits: claims.DefaultLimits | None = None,
) -> list[model.Claimed]:
    """Claim up to `limit` due jobs of flows with room, of `executors` (see the module's
    docstring), each with its attempt in `launching`, most urgent first."""
    if limit <= 0:
        return []
    of = [JC.flow.is_not(None), JC.executor.in_(list(executors))]
    claims.jobs_promote_due(conn, now=now, limit=limit, where=of)
    waiting = _flows_waiting(conn, now, executors)
    if not waiting:
        return []
    use = _use(conn, waiting, now)
    picked: list[Any] = []
    for flow in waiting:
        room = flows.room(flow, use[flow.id], now)
        most = limit if room is None else min(room, limit)
        if most > 0:
            picked += _queued(conn, flow, most, now, executors)
    picked.sort(key=lambda r: (-r.priority, r.run_at, r.id))
    claimed = claims.jobs_claim(conn, ids=[r.id for r in picked[:limit]], now=now, limits=limits)
    by_name = {(f.tenant, f.name): f for f in waiting}
    started = Counter(by_name[(c.job.tenant, c.job.flow or "")].id for c in claimed)
    _starts_record(conn, [f for f in waiting if f.rate is not None], started, now)
    return claimed


def _flows_waiting(conn: Connection, now: datetime, executors: Sequence[str]) -> list[flows.Flow]:
    """The flows with a due queued job of `executors` that no Retry-After holds, locked
    (those another transaction holds are skipped)."""
    due = select(JC.id).where(*_due(F.tenant, F.name, now, executors)).exists()
    stmt = (
        select(flows_table)
        .where(or_(F.held_until.is_(None), F.held_until <= now), due)
        .order_by(F.id)
    )
    if conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update(skip_locked=True, of=flows_table)
    return [stored_flows.flow_of(r) for r in conn.execute(stmt)]


def _use(conn: Connection, waiting: Sequence[flows.Flow], now: datetime) -> dict[int, flows.Use]:
    """What each flow of `waiting` uses now: its starts within its window, its jobs running."""
    windows = {f.id: f.rate.per for f in waiting if f.rate is not None}
    starts: dict[int, list[datetime]] = {f.id: [] for f in waiting}
    if windows:
        rows = conn.execute(
            select(S.flow_id, S.started_at).where(
                S.flow_id.in_(list(windows)), S.started_at > now - max(windows.values())
            )
        )
        for flow_id, at in rows:
            if at > now - windows[flow_id]:
                starts[flow_id].append(at)
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
        f.id: flows.Use(sorted(starts[f.id]), running.get((f.tenant, f.name), 0)) for f in waiting
    }


def _queued(
    conn: Connection, flow: flows.Flow, most: int, now: datetime, executors: Sequence[str]
) -> list[Any]:
    """`flow`'s `most` most urgent due queued jobs of `executors` (a walk of
    ix_jobs_flow_queued that stops there)."""
    stmt = (
        select(JC.id, JC.priority, JC.run_at)
        .where(*_due(flow.tenant, flow.name, now, executors))
        .order_by(JC.priority.desc(), JC.run_at, JC.id)
        .limit(most)
    )
    return list(conn.execute(dialects.skip_locked(conn, stmt)).all())


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
