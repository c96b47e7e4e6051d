"""Run logs: what each attempt left to read (launching.RunLog), written in the transaction that
ends the attempt and kept as long as its job, or until its tenant's run_log_bytes has it
trimmed (its streams removed, its facts kept); and the removal of finished jobs, with all
they hold, once their retention is over."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import Connection, delete, func, insert, select, update

from corral import launching, model
from corral.store import dialects
from corral.store.events import NO_JOB
from corral.store.tables import attempts, checkpoints, events, job_slas, jobs, run_logs

if TYPE_CHECKING:
    from corral.store.database import Database

J = model.JobState

FORGOTTEN = (J.SUCCEEDED, J.FAILED, J.CANCELLED)
"""The states whose jobs are removed after their retention, and whose run logs a tenant's
run_log_bytes trims: they will not change again. A quarantined job waits for a person,
however long, with its run log."""


def log_fields(log: launching.RunLog) -> dict[str, Any]:
    """What a run_logs row holds of `log`, by column (but for its attempt, job and tenant)."""
    streams = [s.as_json() for s in log.streams]
    return {
        "latency": log.latency,
        "status": log.status,
        "address": log.address,
        "streams": streams,
        "bytes": size(streams),
    }


def size(streams: Sequence[Mapping[str, Any]]) -> int:
    """A run log's size, as its tenant's run_log_bytes counts it: the UTF-8 bytes of its
    streams' text as stored (migration 0027 counted the rows stored before it alike). A
    callback job's log is stored as of 0 bytes (no quota counts a callback job), so no trim
    takes it: it goes with its job, at the end of its retention."""
    return sum(len(str(s["text"]).encode("utf-8", "surrogatepass")) for s in streams)


def run_log_values(
    fence: int, job_id: int, tenant: str, log: launching.RunLog, now: datetime, *, counted: bool
) -> dict[str, Any]:
    """One run_logs row; one not `counted` (a callback job's) is of 0 bytes, as its tenant's
    run_log_bytes counts it."""
    fields = log_fields(log)
    return {
        "attempt_id": fence,
        "job_id": job_id,
        "tenant": tenant,
        "recorded_at": now,
        **fields,
        "bytes": fields["bytes"] if counted else 0,
    }


def run_logs_write(
    conn: Connection, logs: Sequence[tuple[int, int, launching.RunLog]], now: datetime
) -> None:
    """Keep the output of attempts that just ended: (fence, job id, log) each, under its
    job's tenant (a callback job's counted as 0 bytes: no quota counts it). The caller ended
    these attempts in this transaction, so each is written once."""
    if not logs:
        return
    ids = sorted({job_id for _, job_id, _ in logs})
    owners: dict[int, tuple[str, bool]] = {
        job_id: (tenant, callback_of is None)
        for job_id, tenant, callback_of in conn.execute(
            select(jobs.c.id, jobs.c.tenant, jobs.c.callback_of).where(
                dialects.one_of(conn, jobs.c.id, ids)
            )
        )
    }
    rows = []
    for f, j, log in logs:
        tenant, counted = owners.get(j, ("", True))
        rows.append(run_log_values(f, j, tenant, log, now, counted=counted))
    conn.execute(insert(run_logs), rows)


def run_logs_of(conn: Connection, *, job_id: int) -> dict[int, launching.RunLog]:
    """A job's run logs, by fence."""
    rows = conn.execute(
        select(run_logs).where(run_logs.c.job_id == job_id).order_by(run_logs.c.attempt_id)
    ).all()
    return {r.attempt_id: run_log_from_row(r._mapping) for r in rows}


def run_log_from_row(row: Mapping[Any, Any]) -> launching.RunLog:
    return launching.RunLog(
        streams=tuple(
            launching.Stream(str(s["name"]), str(s["text"]), int(s["bytes"]), bool(s.get("cut")))
            for s in row["streams"]
        ),
        latency=row["latency"],
        status=row["status"],
        address=row["address"],
        fence=row["attempt_id"],
        recorded_at=row["recorded_at"],
        trimmed_at=row["trimmed_at"],
    )


def jobs_forget(conn: Connection, *, before: datetime, limit: int) -> int:
    """Remove up to `limit` jobs that finished (FORGOTTEN) before `before`, oldest ids
    first, with their attempts, events, run logs and checkpoints; how many it removed.
    Firings keep their job's id: a schedule's history outlives its jobs. Schedules' news
    (events of no job) older than `before` goes too, up to `limit` of it.

    The jobs that hold the highest job id, fence and event id are kept whatever their age:
    SQLite gives a new row the highest id + 1 (these tables are not AUTOINCREMENT there),
    and a fence or a job id given twice would unfence a stale writer and mix two jobs'
    run folders and histories."""
    old_news = select(events.c.id).where(events.c.job_id == NO_JOB, events.c.at < before)
    conn.execute(delete(events).where(events.c.id.in_(old_news.limit(limit).scalar_subquery())))
    ids = _forgettable(conn, before, limit)
    if not ids:
        return 0
    dialects.lock_in_order(conn, jobs, ids)
    # Locked, each is checked again: a rerun may have made one live since it was read.
    ids = list(
        conn.execute(
            select(jobs.c.id).where(
                dialects.one_of(conn, jobs.c.id, ids),
                jobs.c.state.in_([s.value for s in FORGOTTEN]),
                jobs.c.updated_at < before,
            )
        ).scalars()
    )
    for table in (run_logs, events, checkpoints, attempts, job_slas):
        conn.execute(delete(table).where(dialects.one_of(conn, table.c.job_id, ids)))
    conn.execute(delete(jobs).where(dialects.one_of(conn, jobs.c.id, ids)))
    return len(ids)


def _forgettable(conn: Connection, before: datetime, limit: int) -> list[int]:
    """Up to `limit` ids of jobs that finished before `before`, oldest first, but for the
    jobs that hold the highest job id, fence and event id (see jobs_forget)."""
    newest = {
        conn.execute(select(func.max(jobs.c.id))).scalar(),
        *(
            conn.execute(select(t.c.job_id).order_by(t.c.id.desc()).limit(1)).scalar()
            for t in (attempts, events)
        ),
    }
    return list(
        conn.execute(
            select(jobs.c.id)
            .where(
                jobs.c.state.in_([s.value for s in FORGOTTEN]),
                jobs.c.updated_at < before,
                jobs.c.id.not_in([i for i in newest if i is not None]),
            )
            .order_by(jobs.c.id)
            .limit(limit)
        ).scalars()
    )


# --- each tenant's run_log_bytes ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Trimmed:
    """What one trim of a tenant's run logs did."""

    logs: int  # run logs whose streams it removed
    bytes: int  # their size
    jobs: tuple[int, ...]  # their jobs, the oldest finished first
    more: bool  # it stopped at its limit: more of the tenant's logs may be trimmed


def run_log_bytes(conn: Connection, *, tenant: str | None = None) -> dict[str, int]:
    """The run-log bytes each tenant keeps (only `tenant`'s, when given), a tenant that keeps
    none left out: one grouped read of ix_run_logs_tenant, no row and no job read."""
    stmt = select(run_logs.c.tenant, func.sum(run_logs.c.bytes)).group_by(run_logs.c.tenant)
    if tenant is not None:
        stmt = stmt.where(run_logs.c.tenant == tenant)
    return {name: int(kept) for name, kept in conn.execute(stmt) if kept}


def run_logs_trim(
    conn: Connection, *, tenant: str, over: int, limit: int, now: datetime
) -> Trimmed:
    """Trim `tenant`'s run logs by `over` bytes or more where it can, at most `limit` of
    them: those of its oldest finished jobs first (by when they finished), succeeded,
    failed or cancelled, never a quarantined job's nor one of a job that may run again.
    A trimmed log keeps its facts (latency, status, address) and when it was trimmed;
    another tenant's logs are not read. The jobs are locked in id order and checked
    again, as jobs_forget does, and a log another trim took first is not counted."""
    found = _trimmable(conn, tenant, limit)
    chosen = _covering(found, over)
    ids = sorted({row.job_id for row in chosen})
    dialects.lock_in_order(conn, jobs, ids)
    finished = set(
        conn.execute(
            select(jobs.c.id).where(
                dialects.one_of(conn, jobs.c.id, ids),
                jobs.c.state.in_([s.value for s in FORGOTTEN]),
            )
        ).scalars()
    )
    fences = [row.attempt_id for row in chosen if row.job_id in finished]
    done = set(
        conn.execute(
            update(run_logs)
            .where(dialects.one_of(conn, run_logs.c.attempt_id, fences), run_logs.c.bytes > 0)
            .values(streams=[], bytes=0, trimmed_at=now)
            .returning(run_logs.c.attempt_id)
        ).scalars()
    )
    trimmed = [row for row in chosen if row.attempt_id in done]
    return Trimmed(
        logs=len(trimmed),
        bytes=sum(row.bytes for row in trimmed),
        jobs=tuple(dict.fromkeys(row.job_id for row in trimmed)),
        more=len(chosen) == len(found) == limit,
    )


class _Log(NamedTuple):
    """A run log that a trim may take."""

    attempt_id: int
    job_id: int
    bytes: int


def _trimmable(conn: Connection, tenant: str, limit: int) -> list[_Log]:
    """Up to `limit` of `tenant`'s run logs with streams left whose jobs have finished (not
    quarantined), the oldest finished job's first."""
    rows = conn.execute(
        select(run_logs.c.attempt_id, run_logs.c.job_id, run_logs.c.bytes)
        .join(jobs, jobs.c.id == run_logs.c.job_id)
        .where(
            run_logs.c.tenant == tenant,
            run_logs.c.bytes > 0,
            jobs.c.tenant == tenant,
            jobs.c.state.in_([s.value for s in FORGOTTEN]),
        )
        .order_by(jobs.c.updated_at, jobs.c.id, run_logs.c.attempt_id)
        .limit(limit)
    )
    return [_Log(*row) for row in rows]


def _covering(found: Sequence[_Log], over: int) -> list[_Log]:
    """The first of `found` whose bytes add up to `over` or more (all of them if they
    never do)."""
    chosen, freed = [], 0
    for row in found:
        if freed >= over:
            break
        chosen.append(row)
        freed += row.bytes
    return chosen


# --- the handle ----------------------------------------------------------------------------


class RunLogs:
    """The store's handle on run logs and the retention of finished jobs
    (`store.runlogs`): each call one transaction.

    Each method runs the store function its name shortens (`of_job`: run_logs_of),
    named in its body; that function's docstring says what the call does.
    """

    def __init__(self, db: Database) -> None:
        self._db = db

    async def of_job(self, *, job_id: int) -> dict[int, launching.RunLog]:
        """What each ended attempt of a job left to read, by fence."""
        return await self._db.lookup(functools.partial(run_logs_of, job_id=job_id))

    async def kept(self, *, tenant: str | None = None) -> dict[str, int]:
        """The run-log bytes each tenant keeps (only `tenant`'s, when given)."""
        return await self._db.lookup(functools.partial(run_log_bytes, tenant=tenant))

    async def trim(self, *, tenant: str, over: int, limit: int, now: datetime) -> Trimmed:
        """Trim `tenant`'s run logs by `over` bytes, the oldest finished jobs' first, at most
        `limit` of them; what it trimmed."""
        return await self._db.tx(
            functools.partial(run_logs_trim, tenant=tenant, over=over, limit=limit, now=now)
        )

    async def forget(self, *, before: datetime, limit: int = 500) -> int:
        """Remove up to `limit` jobs that finished before `before`, with their attempts,
        events and run logs; how many it removed."""
        return await self._db.tx(functools.partial(jobs_forget, before=before, limit=limit))
