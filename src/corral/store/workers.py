"""Python workers: who is registered and alive, which (task, payload version) each reads,
and their claim of the jobs they read. A registration, or a worker heard from again after
a silence, queues again the parked jobs it reads, and a stop parks the jobs no live worker
reads then: the parking itself is parking.py's.

A worker is live while it is `running` (not draining, not stopped) and its last word is
younger than `since` (now less the lease). A Python task's job carries its task and
payload version in its spec (`{"task": ..., "version": ...}`), which every query here
reads through task_jobs.py; the payload itself is the envelope `{task, version, data}`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Connection,
    and_,
    delete,
    insert,
    or_,
    select,
    update,
)

from corral import model, python_tasks, shares
from corral.store import attempts as attempts_
from corral.store import claims, dialects, hotpath, parking, task_jobs
from corral.store.tables import attempts, jobs, worker_tasks, workers

if TYPE_CHECKING:
    from corral.store.database import Database

A, J, W = model.AttemptState, model.JobState, python_tasks.WorkerState

CHANNEL = dialects.TASKS

# --- registration and liveness --------------------------------------------------------------


def worker_register(
    conn: Connection, *, worker: python_tasks.Worker, now: datetime, since: datetime
) -> int:
    """Store a worker and what it reads; the parked jobs it reads are queued again at once
    (in this transaction). Returns how many were."""
    conn.execute(
        insert(workers).values(
            id=worker.id,
            app=worker.app,
            app_version=worker.app_version,
            host=worker.host,
            pid=worker.pid,
            queues=list(worker.queues),
            concurrency=worker.concurrency,
            state=W.RUNNING,
            started_at=now,
            last_seen_at=now,
        )
    )
    if worker.reads:
        conn.execute(insert(worker_tasks), [_read_row(worker.id, r) for r in worker.reads])
    return parking.jobs_unpark(
        conn,
        reads=task_jobs.grouped((r.task, r.version) for r in worker.reads),
        queues=worker.queues,
        now=now,
        reason=f"a worker that reads it registered: {worker.app} {worker.app_version}"
        f" ({worker.id})",
    )


def _read_row(worker_id: str, read: python_tasks.TaskRead) -> dict[str, Any]:
    """A worker_tasks row: one (task, version) a worker reads, with its payload's schema."""
    return {
        "worker_id": worker_id,
        "task": read.task,
        "version": read.version,
        "newest": read.newest,
        "schema": dict(read.schema),
    }


def worker_beat(
    conn: Connection,
    *,
    worker_id: str,
    leases: Mapping[int, float],
    now: datetime,
    since: datetime,
) -> tuple[python_tasks.WorkerState | None, list[int]]:
    """A worker's heartbeat: it is alive, and each attempt it runs (fence: lease seconds)
    has its lease renewed from now. Returns the worker's state as stored (None: no such
    worker) and the fences no longer running (cancelled, or replaced by a newer attempt):
    the worker stops those runs. A worker heard from again after a silence past its lease
    (`since`: now less the lease) queues again the parked jobs it reads, as a registering
    one does: while it was silent, what only it reads may have parked."""
    before = conn.execute(
        select(workers.c.state, workers.c.last_seen_at, workers.c.queues).where(
            workers.c.id == worker_id
        )
    ).first()
    state = conn.execute(
        update(workers)
        .where(workers.c.id == worker_id)
        .values(last_seen_at=now)
        .returning(workers.c.state)
    ).scalar()
    if before is not None and before.state == W.RUNNING and before.last_seen_at <= since:
        reads = conn.execute(
            select(worker_tasks.c.task, worker_tasks.c.version).where(
                worker_tasks.c.worker_id == worker_id
            )
        ).all()
        parking.jobs_unpark(
            conn,
            reads=task_jobs.grouped((r.task, r.version) for r in reads),
            queues=before.queues,
            now=now,
            reason=f"a worker that reads it was heard from again ({worker_id})",
        )
    stale = sorted(set(leases) - _leases_renew(conn, leases, now))
    return (W(state) if state is not None else None), stale


def _leases_renew(conn: Connection, leases: Mapping[int, float], now: datetime) -> set[int]:
    """Renew each running attempt's lease (fence: lease seconds) from now, one statement per
    lease length; the fences renewed."""
    renewed: set[int] = set()
    by_length: dict[float, list[int]] = {}
    for fence, seconds in leases.items():
        by_length.setdefault(seconds, []).append(fence)
    dialects.lock_in_order(conn, attempts, sorted(leases))  # one order, as completions lock
    for seconds, fences in sorted(by_length.items()):
        renewed.update(
            conn.execute(
                update(attempts)
                .where(dialects.one_of(conn, attempts.c.id, fences), attempts.c.state == A.RUNNING)
                .values(last_seen_at=now, lease_until=now + timedelta(seconds=seconds))
                .returning(attempts.c.id)
            ).scalars()
        )
    return renewed


def worker_drain(conn: Connection, *, worker_id: str, now: datetime) -> None:
    """A worker told to stop: it claims nothing more, and no longer counts as reading what
    it reads (jobs only it reads may park)."""
    conn.execute(
        update(workers)
        .where(workers.c.id == worker_id, workers.c.state == W.RUNNING)
        .values(state=W.DRAINING, last_seen_at=now)
    )


def worker_stop(conn: Connection, *, worker_id: str, now: datetime, since: datetime) -> int:
    """A worker has stopped; the queued jobs no live worker reads now are parked. Returns
    how many were."""
    conn.execute(
        update(workers)
        .where(workers.c.id == worker_id)
        .values(state=W.STOPPED, stopped_at=now, last_seen_at=now)
    )
    return parking.jobs_park_unread(conn, now=now, since=since)


def worker_list(
    conn: Connection, *, since: datetime, live: bool = True, limit: int = 500
) -> list[python_tasks.Worker]:
    """Workers, newest first: the live ones, or (`live` False) every one stored."""
    stmt = select(workers).order_by(workers.c.started_at.desc(), workers.c.id).limit(limit)
    if live:
        stmt = stmt.where(task_jobs.live(since))
    rows = conn.execute(stmt).all()
    reads: dict[str, list[python_tasks.TaskRead]] = {}
    if rows:
        for r in conn.execute(
            select(worker_tasks)
            .where(worker_tasks.c.worker_id.in_([row.id for row in rows]))
            .order_by(worker_tasks.c.task, worker_tasks.c.version)
        ):
            reads.setdefault(r.worker_id, []).append(
                python_tasks.TaskRead(r.task, r.version, r.schema, r.newest)
            )
    return [
        python_tasks.Worker(
            id=r.id,
            app=r.app,
            app_version=r.app_version,
            host=r.host,
            pid=r.pid,
            queues=tuple(r.queues),
            concurrency=r.concurrency,
            state=W(r.state),
            started_at=r.started_at,
            last_seen_at=r.last_seen_at,
            stopped_at=r.stopped_at,
            reads=tuple(reads.get(r.id, ())),
        )
        for r in rows
    ]


def task_schemas(
    conn: Connection, *, task: str, since: datetime
) -> tuple[dict[int, Mapping[str, Any]], int | None]:
    """What live workers registered for `task`: each version they read with its schema
    (the newest registration's, should two differ), and the newest version a live worker
    writes (None: no live worker reads the task)."""
    rows = conn.execute(
        select(worker_tasks.c.version, worker_tasks.c.schema, worker_tasks.c.newest)
        .join(workers, workers.c.id == worker_tasks.c.worker_id)
        .where(worker_tasks.c.task == task, task_jobs.live(since))
        .order_by(workers.c.started_at)
    ).all()
    schemas = {r.version: r.schema for r in rows}
    newest = max((r.version for r in rows if r.newest), default=None)
    return schemas, newest


def known_schema(conn: Connection, *, task: str, version: int) -> Mapping[str, Any] | None:
    """The schema of (task, version) that any worker, live or not, registered last."""
    row = conn.execute(
        select(worker_tasks.c.schema)
        .join(workers, workers.c.id == worker_tasks.c.worker_id)
        .where(worker_tasks.c.task == task, worker_tasks.c.version == version)
        .order_by(workers.c.started_at.desc())
        .limit(1)
    ).first()
    return None if row is None else row.schema


def readers(
    conn: Connection, *, pairs: Sequence[tuple[str, int, str]], since: datetime
) -> set[tuple[str, int, str]]:
    """Which of `pairs` (task, version, queue) some live worker reads, of that queue."""
    out: set[tuple[str, int, str]] = set()
    wanted = {(t, v) for t, v, _ in pairs}
    if not wanted:
        return out
    rows = conn.execute(
        select(worker_tasks.c.task, worker_tasks.c.version, workers.c.queues)
        .join(workers, workers.c.id == worker_tasks.c.worker_id)
        .where(
            or_(*(and_(worker_tasks.c.task == t, worker_tasks.c.version == v) for t, v in wanted)),
            task_jobs.live(since),
        )
    ).all()
    for task, version, queue in set(pairs):
        if any(
            (r.task, r.version) == (task, version) and (not r.queues or queue in r.queues)
            for r in rows
        ):
            out.add((task, version, queue))
    return out


def workers_forget(conn: Connection, *, before: datetime) -> int:
    """Remove workers stopped (or silent) since before `before`, keeping for each (task,
    version) the lowest app version known to read it (one worker row each)."""
    old = conn.execute(select(workers.c.id).where(workers.c.last_seen_at < before)).scalars().all()
    if not old:
        return 0
    best: dict[tuple[str, int], tuple[Any, str]] = {}
    for r in conn.execute(
        select(
            worker_tasks.c.worker_id,
            worker_tasks.c.task,
            worker_tasks.c.version,
            workers.c.app_version,
        ).join(workers, workers.c.id == worker_tasks.c.worker_id)
    ):
        key, rank = (r.task, r.version), python_tasks.version_key(r.app_version)
        if key not in best or rank < best[key][0]:
            best[key] = (rank, r.worker_id)
    keep = {worker for _, worker in best.values()}
    gone = [w for w in old if w not in keep]
    if gone:
        conn.execute(delete(worker_tasks).where(worker_tasks.c.worker_id.in_(gone)))
        conn.execute(delete(workers).where(workers.c.id.in_(gone)))
    return len(gone)


# --- the claim --------------------------------------------------------------------------------


def worker_claim(
    conn: Connection,
    *,
    worker_id: str,
    reads: Sequence[tuple[str, Sequence[int]]],
    queues: Sequence[str],
    now: datetime,
    limit: int,
    limits: claims.DefaultLimits,
    pools: Mapping[str, int] | None = None,
    tenants: Mapping[str, int] | None = None,
    weights: shares.Weights | None = None,
) -> list[model.Claimed]:
    """A worker's claim: up to `limit` due jobs of the tasks and versions it reads (of its
    `queues`; all when empty), through the dispatcher's own claim (fences, fair shares,
    pools, tenant limits, events), each attempt recorded running at once: the worker is
    its own platform, and starts the function as soon as this transaction commits."""
    also = [task_jobs.claimable(reads)]
    if queues:
        also.append(jobs.c.queue.in_(list(queues)))
    claimed = claims.job_claim(
        conn,
        now=now,
        limit=limit,
        executors=[python_tasks.PYTHON],
        limits=limits,
        pools=pools,
        tenants=tenants,
        weights=weights,
        also=also,
    )
    if not claimed:
        return []
    ran = set(
        attempts_.attempt_record_running(
            conn, fences=[c.attempt.id for c in claimed], now=now, reason=started_by(worker_id)
        )
    )
    return [_started(c, now) for c in claimed if c.attempt.id in ran]


def _started(claimed: model.Claimed, now: datetime) -> model.Claimed:
    """A claim whose attempt was recorded running at `now`."""
    attempt = dataclasses.replace(
        claimed.attempt, state=A.RUNNING, started_at=now, last_seen_at=now
    )
    return dataclasses.replace(claimed, attempt=attempt)


def started_by(worker_id: str) -> str:
    """The run log's reason for an attempt a worker claimed and started."""
    return f"started by worker {worker_id}"


# --- the handle ----------------------------------------------------------------------------


class Workers:
    """The store's handle on Python workers, the task versions they read and the jobs
    parked for want of one (`store.workers`): each call one transaction (a worker's
    claim, on PostgreSQL, one statement of the hot path).

    Each method runs the store function its name shortens (`beat`: worker_beat),
    named in its body; that function's docstring says what the call does.
    """

    def __init__(self, db: Database) -> None:
        self._db = db

    async def claim(
        self,
        *,
        worker_id: str,
        reads: Sequence[tuple[str, Sequence[int]]],
        queues: Sequence[str],
        now: datetime,
        limit: int,
        limits: claims.DefaultLimits,
        pools: Mapping[str, int] | None = None,
        tenants: Mapping[str, int] | None = None,
        weights: shares.Weights | None = None,
    ) -> list[model.Claimed]:
        """A worker's claim (worker_claim), shared across tenants by `weights`; without
        pools or tenants' running jobs to count, the hot path (hotpath.py): one statement
        on PostgreSQL."""
        weights = weights or shares.Weights()
        claim = functools.partial(
            worker_claim,
            worker_id=worker_id,
            reads=reads,
            queues=queues,
            now=now,
            limit=limit,
            limits=limits,
            weights=weights,
        )
        if not pools and not tenants:
            on_postgresql = functools.partial(
                hotpath.POSTGRESQL.worker_claim,
                worker_id=worker_id,
                reads=reads,
                queues=queues,
                now=now,
                limit=limit,
                limits=limits,
                weights=weights,
            )
            return await self._db.hot(claim, on_postgresql)
        return await self._db.tx(functools.partial(claim, pools=pools, tenants=tenants))

    async def register(self, *, worker: python_tasks.Worker, now: datetime, since: datetime) -> int:
        return await self._db.tx(
            functools.partial(worker_register, worker=worker, now=now, since=since)
        )

    async def beat(
        self, *, worker_id: str, leases: Mapping[int, float], now: datetime, since: datetime
    ) -> tuple[python_tasks.WorkerState | None, list[int]]:
        return await self._db.tx(
            functools.partial(worker_beat, worker_id=worker_id, leases=leases, now=now, since=since)
        )

    async def drain(self, *, worker_id: str, now: datetime) -> None:
        await self._db.tx(functools.partial(worker_drain, worker_id=worker_id, now=now))

    async def stop(self, *, worker_id: str, now: datetime, since: datetime) -> int:
        return await self._db.tx(
            functools.partial(worker_stop, worker_id=worker_id, now=now, since=since)
        )

    async def forget(self, *, before: datetime) -> int:
        return await self._db.tx(functools.partial(workers_forget, before=before))

    async def task_schemas(
        self, *, task: str, since: datetime
    ) -> tuple[dict[int, Mapping[str, Any]], int | None]:
        return await self._db.read(functools.partial(task_schemas, task=task, since=since))

    async def known_schema(self, *, task: str, version: int) -> Mapping[str, Any] | None:
        return await self._db.read(functools.partial(known_schema, task=task, version=version))

    async def task_readers(
        self, *, pairs: Sequence[tuple[str, int, str]], since: datetime
    ) -> set[tuple[str, int, str]]:
        return await self._db.read(functools.partial(readers, pairs=pairs, since=since))

    async def unpark_read(self, *, now: datetime, since: datetime) -> int:
        return await self._db.tx(functools.partial(parking.jobs_unpark_read, now=now, since=since))

    async def lowest_app_versions(
        self, *, pairs: Sequence[tuple[str, int]]
    ) -> dict[tuple[str, int], str]:
        return await self._db.read(functools.partial(parking.lowest_app_versions, pairs=pairs))

    async def park_unread(
        self, *, now: datetime, since: datetime, job_ids: Sequence[int] | None = None
    ) -> int:
        return await self._db.tx(
            functools.partial(parking.jobs_park_unread, now=now, since=since, job_ids=job_ids)
        )

    async def parked_release(
        self, *, job_ids: Sequence[int] = (), task: str | None = None, now: datetime
    ) -> list[int]:
        return await self._db.tx(
            functools.partial(parking.parked_release, job_ids=job_ids, task=task, now=now)
        )

    async def parked_list(
        self, *, task: str | None = None, tenant: str | None = None, limit: int = 100
    ) -> list[python_tasks.ParkedJob]:
        return await self._db.read(
            functools.partial(parking.parked_list, task=task, tenant=tenant, limit=limit)
        )

    async def payload_versions(
        self, *, tasks: Sequence[str]
    ) -> dict[tuple[str, int], dict[str, int]]:
        return await self._db.read(functools.partial(parking.payload_versions, tasks=tasks))

    async def list(
        self, *, since: datetime, live: bool = True, limit: int = 500
    ) -> list[python_tasks.Worker]:
        return await self._db.read(
            functools.partial(worker_list, since=since, live=live, limit=limit)
        )
