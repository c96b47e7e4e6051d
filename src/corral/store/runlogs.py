"""Run logs: what each attempt left to read (launching.RunLog), written in the transaction that
ends the attempt and kept as long as its job; and the removal of finished jobs, with all
they hold, once their retention is over."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, delete, func, insert, select

from corral import launching, model
from corral.store import dialects
from corral.store.events import NO_JOB
from corral.store.tables import attempts, checkpoints, events, job_slas, jobs, run_logs

if TYPE_CHECKING:
    from corral.store.database import Database

J = model.JobState

FORGOTTEN = (J.SUCCEEDED, J.FAILED, J.CANCELLED)
"""The states whose jobs are removed after their retention: they will not change again.
A quarantined job waits for a person, however long."""


def log_fields(log: launching.RunLog) -> dict[str, Any]:
    """What a run_logs row holds of `log`, by column."""
    return {
        "latency": log.latency,
        "status": log.status,
        "address": log.address,
        "streams": [s.as_json() for s in log.streams],
    }


def run_log_values(fence: int, job_id: int, log: launching.RunLog, now: datetime) -> dict[str, Any]:
    """One run_logs row."""
    return {"attempt_id": fence, "job_id": job_id, "recorded_at": now, **log_fields(log)}


def run_logs_write(
    conn: Connection, logs: Sequence[tuple[int, int, launching.RunLog]], now: datetime
) -> None:
    """Keep the output of attempts that just ended: (fence, job id, log) each. The caller
    ended these attempts in this transaction, so each is written once."""
    if logs:
        conn.execute(insert(run_logs), [run_log_values(f, j, log, now) for f, j, log in logs])


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

    async def forget(self, *, before: datetime, limit: int = 500) -> int:
        """Remove up to `limit` jobs that finished before `before`, with their attempts,
        events and run logs; how many it removed."""
        return await self._db.tx(functools.partial(jobs_forget, before=before, limit=limit))
