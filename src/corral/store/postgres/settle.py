"""PostgreSQL's settle, one statement: a tick's launched attempts recorded running and its
successes applied, with their jobs, run-log lines and run logs.

It keeps every promise of the general settle (completions.attempt_settle): the rows locked
in fence order before anything is written, as every other writer of attempts locks them;
compare-and-set on every row; a job succeeds only with its current attempt. Values go in
as array parameters, one element per fence, so every row is found by its primary key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from corral import launching
from corral.store import runlogs, statements
from corral.store.postgres import run

if TYPE_CHECKING:
    import psycopg

_NONE: Mapping[int, launching.RunLog] = {}

_LOCKED = """locked AS MATERIALIZED (
    -- The attempts in fence order, each with what the settle does to it: one array element
    -- each, in the order of `fences`, so every row is found by its primary key. A success
    -- of a job with a callback is left for the general settle (`later`), which makes the
    -- callback job with the job's end.
    SELECT a.id, a.job_id, a.attempt_no, a.state, f.won AND j.callback IS NULL AS won,
        f.won AND j.callback IS NOT NULL AS later, f.code, f.reason
    FROM unnest(%(fences)s::bigint[], %(wins)s::bool[], %(codes)s::int[], %(reasons)s::text[])
        AS f(fence, won, code, reason)
    JOIN attempts AS a ON a.id = f.fence
    JOIN jobs AS j ON j.id = a.job_id
    ORDER BY a.id
    FOR UPDATE OF a
)"""

_RAN_AND_WON = f"""ran AS (
    -- The compare-and-set is on `locked`: it holds each row's lock and its newest state, so
    -- nothing changes the row until this statement ends. The updates filter by that state,
    -- never by the row as this statement's snapshot saw it: a writer that committed while
    -- the settle waited for the lock has changed that (a success would be dropped).
    UPDATE attempts AS a
    SET state = 'running', updated_at = %(now)s, started_at = %(now)s, last_seen_at = %(now)s,
        lease_until = CASE WHEN a.lease_seconds IS NULL THEN a.lease_until
            ELSE %(now)s + make_interval(secs => a.lease_seconds) END
    WHERE a.id = ANY(
        ARRAY(SELECT id FROM locked WHERE NOT won AND NOT later AND state = 'launching')
    )
    RETURNING a.id, a.job_id
), won AS (
    UPDATE attempts AS a
    SET {statements.success_set("%(now)s", "l.code", "l.reason")}
    FROM locked AS l
    WHERE a.id = ANY(ARRAY(SELECT id FROM locked WHERE won AND state IN ('launching', 'running')))
        AND l.id = a.id
    RETURNING a.id, a.job_id, a.attempt_no, l.state AS was, l.code, l.reason
)"""
"""The launched attempts still launching recorded running (a lease restarts from now),
and the successes applied."""

_DONE = """done AS (
    -- By primary key, the ids as one array, and the job's current attempt by its unique
    -- (job_id, attempt_no): lookups whatever the planner guesses of these CTEs' sizes.
    UPDATE jobs AS j
    SET state = 'succeeded', updated_at = %(now)s
    WHERE j.id = ANY(ARRAY(SELECT job_id FROM won)) AND j.state = 'running'
        AND EXISTS (
            SELECT FROM attempts AS a
            WHERE a.job_id = j.id AND a.attempt_no = j.attempt_count
                AND a.id = ANY(ARRAY(SELECT id FROM won))
        )
    RETURNING j.id, j.attempt_count
), ended AS (
    SELECT d.id AS job_id, a.id AS fence, d.attempt_count AS attempt_no
    FROM done AS d JOIN attempts AS a ON a.job_id = d.id AND a.attempt_no = d.attempt_count
)"""
"""The jobs whose current attempt succeeded end succeeded."""

_LOGGED = f"""logged AS (
    INSERT INTO events ({statements.EVENT_COLUMNS})
    SELECT job_id, id, 'attempt', 'launching', 'running', %(ran_reason)s, %(now)s, '{{}}'::jsonb
    FROM ran
    UNION ALL
    SELECT job_id, id, 'attempt', was, 'succeeded', {statements.ended_sql("code", "reason")},
        %(now)s, '{{}}'::jsonb
    FROM won
    UNION ALL
    SELECT job_id, fence, 'job', 'running', 'succeeded', {statements.succeeded_sql("attempt_no")},
        %(now)s, '{{}}'::jsonb
    FROM ended
), kept AS (
    -- The run logs of the attempts that ended here, once each (each ends once).
    -- Each with its job's tenant, by the job's primary key; a callback job's of 0 bytes,
    -- as its tenant's run_log_bytes counts it (store/runlogs.py).
    INSERT INTO run_logs ({statements.RUN_LOG_COLUMNS})
    SELECT w.id, w.job_id, %(now)s, l.latency, l.status, l.address, l.streams,
        CASE WHEN j.callback_of IS NULL THEN l.bytes ELSE 0 END, j.tenant
    FROM jsonb_to_recordset(%(logs)s) AS l(
        fence bigint, latency float8, status int, address text, streams jsonb, bytes bigint
    )
    JOIN won AS w ON w.id = l.fence
    JOIN jobs AS j ON j.id = w.job_id
)"""
"""The run log's lines of every change, and the run logs of the successes."""

SETTLE = f"""
WITH {_LOCKED}, {_RAN_AND_WON}, {_DONE}, {_LOGGED}
SELECT 0, id, 0, 0 FROM ran
UNION ALL
SELECT 1, job_id, fence, attempt_no FROM ended
UNION ALL
SELECT 2, id, 0, 0 FROM locked WHERE later
"""
"""The settle: (0, fence) of each attempt recorded running, (1, job id, fence, attempt
number) of each job that succeeded, and (2, fence) of each success left for the general
settle."""


async def pg_settle(
    conn: psycopg.AsyncConnection[Any],
    *,
    launched: Sequence[int],
    won: Sequence[tuple[int, int | None, str | None]],
    now: datetime,
    logs: Mapping[int, launching.RunLog] = _NONE,
    reason: str = "launched",
) -> tuple[list[int], list[tuple[int, int, int]], list[int]]:
    """Record `launched` attempts as running and apply successes (fence, exit code, reason)
    and their run logs (by fence) in one statement; a fence in both only succeeds. Returns
    the fences recorded running, for each job that succeeded (job id, fence, attempt
    number), and the fences of the successes of jobs with a callback, left as they were
    for the general settle (completions.attempt_settle)."""
    from psycopg.types.json import Jsonb

    ends = {fence: (code, why) for fence, code, why in won}
    fences = sorted({*launched, *ends})
    nothing = (None, None)
    params = {
        "now": now,
        "fences": fences,
        "wins": [fence in ends for fence in fences],
        "codes": [ends.get(fence, nothing)[0] for fence in fences],
        "reasons": [ends.get(fence, nothing)[1] for fence in fences],
        "ran_reason": reason,
        "logs": Jsonb([{"fence": f, **runlogs.log_fields(log)} for f, log in logs.items()]),
    }
    ran: list[int] = []
    done: list[tuple[int, int, int]] = []
    later: list[int] = []
    for kind, job_or_fence, fence, attempt_no in await run.rows(conn, SETTLE, params):
        if kind == 0:
            ran.append(job_or_fence)
        elif kind == 1:
            done.append((job_or_fence, fence, attempt_no))
        else:
            later.append(job_or_fence)
    return ran, done, later
