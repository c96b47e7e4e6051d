"""SQLite's claim: with one tenant waiting, its due jobs moved to running in one statement
(`UPDATE ... WHERE id IN (SELECT ... LIMIT n)`: there is one writer, so no row is locked);
with more, the general path's fair pick (store/picks.py) and the jobs picked moved. Their
attempts are inserted in one executemany, and their run-log lines built in SQL from the
attempts just made."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from corral import model, shares
from corral.store import claimed, claims, dialects, picks, statements
from corral.store.sqlite import cursor as cursors

WAITING = f"WITH RECURSIVE {statements.TENANTS_WAITING} SELECT tenant FROM waiting LIMIT 2"
"""Whether one tenant has jobs waiting, or more (statements.TENANTS_WAITING)."""
CLAIM = f"""
UPDATE jobs SET state = 'running', attempt_count = attempt_count + 1, updated_at = ?
WHERE id IN (SELECT value FROM json_each(?)) AND state = 'queued'
RETURNING {", ".join(claimed.JOB_COLUMNS)}
"""
"""The jobs picked (store/picks.py), still queued, moved to running."""
CLAIM_ALONE = f"""
UPDATE jobs SET state = 'running', attempt_count = attempt_count + 1, updated_at = ?
WHERE id IN (
    SELECT id FROM jobs
    WHERE state = 'queued' AND tenant = ? AND run_at <= ?
        AND executor IN (SELECT value FROM json_each(?)) AND flow IS NULL
    ORDER BY {statements.CLAIM_ORDER}
    LIMIT ?
)
RETURNING {", ".join(claimed.JOB_COLUMNS)}
"""
"""The due queued jobs of the one tenant waiting, of the executors given, most urgent first,
moved to running (none of a flow: those are the flow claim's, store/flow_claims.py)."""
DUE_ALONE = """
SELECT id FROM jobs
WHERE state = 'scheduled' AND tenant = ? AND run_at <= ?
    AND executor IN (SELECT value FROM json_each(?)) AND flow IS NULL
ORDER BY run_at, id
LIMIT ?
"""
"""The one tenant's scheduled jobs whose time has come, the longest due first: they are
queued before its claim picks."""

ATTEMPT = f"""
INSERT INTO attempts ({statements.ATTEMPT_COLUMNS})
VALUES (?, ?, ?, ?, 'launching', ?, ?, ?, ?, ?)
"""
"""One claimed job's new attempt, launching."""
CLAIMED = f"""
INSERT INTO events ({statements.EVENT_COLUMNS})
SELECT job_id, id, 'job', 'queued', 'running', {statements.claimed_sql("attempt_no")},
    ?, json_object('launch_name', launch_name)
FROM attempts WHERE id > ?
"""
"""The claim's run-log line of each attempt made after fence ?."""

_Made = tuple[model.Job, str, tuple[datetime | None, datetime | None, float | None]]


def sqlite_claim(
    conn: Connection,
    *,
    now: datetime,
    limit: int,
    executors: Sequence[str],
    deadline: float | None,
    lease: float | None,
    weights: shares.Weights,
) -> list[model.Claimed]:
    """Claim up to `limit` due jobs, shared by `weights` (see claims.job_claim for what a
    claim is), inside the caller's (write-locked) transaction. `deadline` and `lease`: the
    default limits in seconds; both None sets no limits."""
    cursor = cursors.of(conn)
    at, kinds = dialects.sqlite_time(now), json.dumps(list(executors))
    waiting = [tenant for (tenant,) in cursor.execute(WAITING)]
    if len(waiting) > 1:
        rows = _claim_shared(conn, cursor, picks.Ask(now, limit, executors, weights), at)
    elif waiting:
        # One tenant: no share to keep (picks.py). Its longest due scheduled jobs are queued
        # first, then its most urgent taken, in one statement each.
        alone = waiting[0]
        if due := [i for (i,) in cursor.execute(DUE_ALONE, (alone, at, kinds, limit))]:
            claims.jobs_promote(conn, ids=due, now=now)
        rows = cursor.execute(CLAIM_ALONE, (at, alone, at, kinds, limit)).fetchall()
    else:
        rows = []
    if not rows:
        return []
    read = claimed.Reader()
    claimed_jobs = sorted((read.job(row) for row in rows), key=claims.urgency)
    limits = claimed.Limits(now, deadline, lease)
    made = [
        (job, model.launch_name(job.id, job.attempt_count), limits.of(job)) for job in claimed_jobs
    ]
    fences = _attempts_insert(cursor, made, at)
    return [
        model.Claimed(job, claimed.launching(job, fences[job.id], name, now, job_limits))
        for job, name, job_limits in made
    ]


def _claim_shared(conn: Connection, cursor: Any, ask: picks.Ask, at: str | None) -> list[Any]:
    """The rows of the jobs claimed when tenants share (picks.fair_pick), moved to running."""
    picked = picks.fair_pick(conn, ask)
    if not picked.claim:
        return []
    if picked.promote:
        claims.jobs_promote(conn, ids=picked.promote, now=ask.now)
    return list(cursor.execute(CLAIM, (at, json.dumps(picked.claim))).fetchall())


def _attempts_insert(cursor: Any, made: Sequence[_Made], at: str | None) -> dict[int, int]:
    """Insert the claimed jobs' attempts and their run-log lines; each job's fence, by job id.
    (Each claimed job gets one attempt, so the fences made past the newest before are
    theirs: no row is read back one at a time.)"""
    before = cursor.execute("SELECT coalesce(max(id), 0) FROM attempts").fetchone()[0]
    stamp = functools.lru_cache(maxsize=None)(dialects.sqlite_time)  # a few distinct times
    cursor.executemany(
        ATTEMPT,
        [
            (job.id, job.attempt_count, name, job.executor, at, at, stamp(d), stamp(u), seconds)
            for job, name, (d, u, seconds) in made
        ],
    )
    fences = dict(cursor.execute("SELECT job_id, id FROM attempts WHERE id > ?", (before,)))
    cursor.execute(CLAIMED, (at, before))
    return fences
