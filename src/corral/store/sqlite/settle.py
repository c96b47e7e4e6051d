"""SQLite's settle: a tick's launched attempts recorded running and its successes applied,
with their jobs, run-log lines and run logs, inside the store's one writer's transaction.

It keeps every promise of the general settle (completions.attempt_settle): compare-and-set
on every row (the writer's lock makes the reads inside the transaction exact), and a job
succeeds only with its current attempt.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from corral import launching
from corral.store import dialects, runlogs, statements
from corral.store.sqlite import cursor as cursors

_NONE: Mapping[int, launching.RunLog] = {}

RUNNING = """
UPDATE attempts SET state = 'running', updated_at = ?1, started_at = ?1, last_seen_at = ?1
WHERE id IN (SELECT value FROM json_each(?2)) AND state = 'launching'
RETURNING id, job_id, lease_seconds
"""
"""The attempts of the fences given (a JSON list) still launching, recorded running."""
ACTIVE = """
SELECT a.id, a.job_id, a.attempt_no, a.state,
    j.state = 'running' AND j.attempt_count = a.attempt_no, j.tenant, j.callback_of IS NULL
FROM attempts AS a JOIN jobs AS j ON j.id = a.job_id
WHERE a.id IN (SELECT value FROM json_each(?)) AND a.state IN ('launching', 'running')
    AND j.callback IS NULL
"""
"""The attempts of the fences given still active, each with whether it is its job's
current attempt of a running job (so that job succeeds with it), its job's tenant and
whether its run log counts toward it (not a callback job's: store/runlogs.py); but for
those of jobs with a callback (LATER)."""
LATER = """
SELECT a.id FROM attempts AS a JOIN jobs AS j ON j.id = a.job_id
WHERE a.id IN (SELECT value FROM json_each(?)) AND j.callback IS NOT NULL
"""
"""Of the fences given, those of jobs with a callback: their successes are left for the
general settle (completions.attempt_settle), which makes the callback job with the end."""

SUCCEEDED = f"UPDATE attempts SET {statements.success_set('?1', '?2', '?3')} WHERE id = ?4"
"""One attempt's success: at ?1, its exit code ?2 and reason ?3, attempt ?4."""
EVENT = f"INSERT INTO events ({statements.EVENT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, '{{}}')"
"""One run-log line without details."""
RUN_LOG = f"INSERT INTO run_logs ({statements.RUN_LOG_COLUMNS}) VALUES ({', '.join('?' * 9)})"
"""One success's run log."""


def sqlite_settle(
    conn: Connection,
    *,
    launched: Sequence[int],
    won: Sequence[tuple[int, int | None, str | None]],
    now: datetime,
    logs: Mapping[int, launching.RunLog] = _NONE,
    reason: str = "launched",
) -> tuple[list[int], list[tuple[int, int, int]], list[int]]:
    """Record `launched` attempts as running and apply successes (fence, exit code, reason)
    and their run logs (by fence), inside the caller's (write-locked) transaction; a fence
    in both only succeeds. Returns the fences recorded running, for each job that
    succeeded (job id, fence, attempt number), and the fences of successes of jobs with a
    callback, left as they were for the general settle (LATER)."""
    cursor = cursors.of(conn)
    finished = {fence for fence, _, _ in won}
    later = []
    if won:
        later = [f for (f,) in cursor.execute(LATER, (json.dumps(sorted(finished)),)).fetchall()]
    running = [fence for fence in launched if fence not in finished]
    ran = _record_running(cursor, running, now, reason) if running else []
    if not won:
        return ran, [], later
    return ran, _apply_successes(cursor, won, now, logs), later


def _record_running(cursor: Any, fences: Sequence[int], now: datetime, reason: str) -> list[int]:
    """The attempts of `fences` still launching recorded running, each with its run-log
    line; a job on a lease has all of it from now. The fences recorded."""
    at = dialects.sqlite_time(now)
    rows = cursor.execute(RUNNING, (at, json.dumps(fences))).fetchall()
    leased = [
        (dialects.sqlite_time(now + timedelta(seconds=seconds)), fence)
        for fence, _, seconds in rows
        if seconds is not None
    ]
    if leased:
        cursor.executemany("UPDATE attempts SET lease_until = ? WHERE id = ?", leased)
    cursor.executemany(
        EVENT,
        [
            (job_id, fence, "attempt", "launching", "running", reason, at)
            for fence, job_id, _ in rows
        ],
    )
    return [fence for fence, _, _ in rows]


def _apply_successes(
    cursor: Any,
    won: Sequence[tuple[int, int | None, str | None]],
    now: datetime,
    logs: Mapping[int, launching.RunLog],
) -> list[tuple[int, int, int]]:
    """The successes (fence, exit code, reason) of attempts still active applied, their
    jobs ended when it is their current attempt, with run-log lines and run logs; (job id,
    fence, attempt number) of each job that succeeded."""
    at = dialects.sqlite_time(now)
    ends = {fence: (code, why) for fence, code, why in won}
    active = cursor.execute(ACTIVE, (json.dumps(sorted(ends)),)).fetchall()
    cursor.executemany(SUCCEEDED, [(at, *ends[fence], fence) for fence, *_ in active])
    current = [(job_id, fence, n) for fence, job_id, n, _, is_current, *_ in active if is_current]
    cursor.executemany(
        "UPDATE jobs SET state = 'succeeded', updated_at = ? WHERE id = ?",
        [(at, job_id) for job_id, _, _ in current],
    )
    events = [
        (job_id, fence, "attempt", was, "succeeded", statements.ended(*ends[fence]), at)
        for fence, job_id, _, was, *_ in active
    ]
    events += [
        (job_id, fence, "job", "running", "succeeded", statements.succeeded(n), at)
        for job_id, fence, n in current
    ]
    cursor.executemany(EVENT, events)
    if kept := [(row, logs[row[0]]) for row in active if row[0] in logs]:
        cursor.executemany(
            RUN_LOG,
            [
                (f, job, at, *_row(log, counted), tenant)
                for (f, job, *_, tenant, counted), log in kept
            ],
        )
    return current


def _row(log: launching.RunLog, counted: bool) -> tuple[Any, ...]:
    """latency, status, address, streams (as JSON text) and bytes of a run_logs row (0 when
    not `counted`: a callback job's)."""
    fields = runlogs.log_fields(log)
    streams = json.dumps(fields["streams"])
    size = fields["bytes"] if counted else 0
    return (fields["latency"], fields["status"], fields["address"], streams, size)
