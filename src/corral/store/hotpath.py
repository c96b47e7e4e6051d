"""The dispatcher's two statements a tick on PostgreSQL: the claim and the settle.

Each is one data-modifying statement, run on its own (autocommit): the statement is the
transaction, so a tick costs two round trips to the server, and nothing is half-written
whatever happens to the process or the network. They keep every promise of the general
path (claims.job_claim, completions.attempt_settle): compare-and-set on every row, an
attempt row whose id is the fence, one run-log event per state change (built in SQL),
and the settle's rows locked in fence order before anything is written, as every other
writer of attempts locks them. Values go in as array parameters and come out as tuples:
no per-row dictionaries, no JSON encoded in Python, no result processing beyond building
the model's values.

The general path stays for what these do not cover: claims that count pools, settles with
failures (a failure's decision needs its job, its policy and its history: one more round
trip), and SQLite (one writer at a time, where a transaction costs no round trip).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from corral import model
from corral.store.tables import jobs

A, J = model.AttemptState, model.JobState

_JOB_COLUMNS = [c.name for c in jobs.c]  # in the order of model.Job's fields (a test checks)
_STATE = _JOB_COLUMNS.index("state")

CLAIM = f"""
WITH due AS MATERIALIZED (
    SELECT id FROM jobs
    WHERE state = 'queued' AND run_at <= %(now)s AND executor = ANY(%(executors)s::text[])
    ORDER BY priority DESC, run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE jobs AS j
    SET state = 'running', attempt_count = j.attempt_count + 1, updated_at = %(now)s
    FROM due
    WHERE j.id = due.id AND j.state = 'queued'
    RETURNING j.*
), leased AS (
    SELECT m.id, m.attempt_count, m.executor,
        CASE WHEN %(limited)s THEN coalesce(
            (m.policy -> 'limits' ->> 'attempt_deadline')::float8, %(deadline)s
        ) END AS deadline,
        CASE WHEN %(limited)s AND coalesce((m.policy ->> 'heartbeat')::boolean, false) THEN
            coalesce((m.policy -> 'limits' ->> 'lease_timeout')::float8, %(lease)s)
        END AS lease
    FROM moved AS m
), made AS (
    INSERT INTO attempts (
        job_id, attempt_no, launch_name, executor, state, created_at, updated_at,
        deadline_at, lease_until, lease_seconds
    )
    SELECT id, attempt_count, 'corral-' || id || '-' || attempt_count, executor, 'launching',
        %(now)s, %(now)s,
        %(now)s + make_interval(secs => deadline), %(now)s + make_interval(secs => lease), lease
    FROM leased
    ORDER BY id
    RETURNING id, job_id, attempt_no, launch_name, deadline_at, lease_until, lease_seconds
), logged AS (
    INSERT INTO events (job_id, attempt_id, entity, from_state, to_state, reason, at, details)
    SELECT job_id, id, 'job', 'queued', 'running',
        'claimed: attempt ' || attempt_no || ' launching', %(now)s,
        jsonb_build_object('launch_name', launch_name)
    FROM made
)
SELECT {", ".join(f"m.{c}" for c in _JOB_COLUMNS)},
    a.id, a.launch_name, a.deadline_at, a.lease_until, a.lease_seconds
FROM moved AS m JOIN made AS a ON a.job_id = m.id
ORDER BY m.priority DESC, m.run_at, m.id
"""


def claim(
    conn: Connection,
    *,
    now: datetime,
    limit: int,
    executors: Sequence[str],
    deadline: float | None,
    lease: float | None,
) -> list[model.Claimed]:
    """Claim up to `limit` due jobs in one statement (see claims.job_claim for what a claim
    is). `deadline` and `lease`: the default limits in seconds; both None sets no limits."""
    params = {
        "now": now,
        "executors": list(executors),
        "limit": limit,
        "limited": deadline is not None,
        "deadline": deadline,
        "lease": lease,
    }
    rows = _execute(conn, CLAIM, params)
    n = len(_JOB_COLUMNS)
    out = []
    for row in rows:
        values = list(row[:n])
        values[_STATE] = J.RUNNING
        job = model.Job(*values)
        fence, launch_name, deadline_at, lease_until, lease_seconds = row[n:]
        attempt = model.Attempt(
            id=fence,
            job_id=job.id,
            attempt_no=job.attempt_count,
            launch_name=launch_name,
            executor=job.executor,
            state=A.LAUNCHING,
            created_at=now,
            updated_at=now,
            started_at=None,
            finished_at=None,
            exit_code=None,
            reason=None,
            last_seen_at=None,
            deadline_at=deadline_at,
            lease_until=lease_until,
            lease_seconds=lease_seconds,
        )
        out.append(model.Claimed(job, attempt))
    return out


SETTLE = """
WITH locked AS MATERIALIZED (
    SELECT id, state, lease_seconds FROM attempts
    WHERE id = ANY(%(fences)s::bigint[])
    ORDER BY id
    FOR UPDATE
), ran AS (
    UPDATE attempts AS a
    SET state = 'running', updated_at = %(now)s, started_at = %(now)s, last_seen_at = %(now)s,
        lease_until = CASE WHEN l.lease_seconds IS NULL THEN a.lease_until
            ELSE %(now)s + make_interval(secs => l.lease_seconds) END
    FROM locked AS l
    WHERE a.id = l.id AND l.state = 'launching' AND a.state = 'launching'
        AND a.id = ANY(%(running)s::bigint[])
    RETURNING a.id, a.job_id
), won AS (
    UPDATE attempts AS a
    SET state = 'succeeded', updated_at = %(now)s, exit_code = f.code, reason = f.reason,
        finished_at = %(now)s, last_seen_at = %(now)s, failure_class = NULL, fingerprint = NULL
    FROM locked AS l,
        unnest(%(won)s::bigint[], %(codes)s::int[], %(reasons)s::text[]) AS f(fence, code, reason)
    WHERE a.id = l.id AND f.fence = l.id AND l.state IN ('launching', 'running')
        AND a.state = l.state
    RETURNING a.id, a.job_id, a.attempt_no, l.state AS was, f.code, f.reason
), done AS (
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
), logged AS (
    INSERT INTO events (job_id, attempt_id, entity, from_state, to_state, reason, at, details)
    SELECT job_id, id, 'attempt', 'launching', 'running', %(ran_reason)s, %(now)s, '{}'::jsonb
    FROM ran
    UNION ALL
    SELECT job_id, id, 'attempt', was, 'succeeded', coalesce(reason, 'exit ' || code, 'succeeded'),
        %(now)s, '{}'::jsonb
    FROM won
    UNION ALL
    SELECT job_id, fence, 'job', 'running', 'succeeded', 'attempt ' || attempt_no || ' succeeded',
        %(now)s, '{}'::jsonb
    FROM ended
)
SELECT 0, id, 0, 0 FROM ran
UNION ALL
SELECT 1, job_id, fence, attempt_no FROM ended
"""


def settle(
    conn: Connection,
    *,
    launched: Sequence[int],
    won: Sequence[tuple[int, int | None, str | None]],
    now: datetime,
    reason: str = "launched",
) -> tuple[list[int], list[tuple[int, int, int]]]:
    """Record `launched` attempts as running and apply successes (fence, exit code, reason)
    in one statement; a fence in both only succeeds. Returns the fences recorded running
    and, for each job that succeeded, (job id, fence, attempt number)."""
    finished = {fence for fence, _, _ in won}
    params = {
        "now": now,
        "fences": sorted({*launched, *finished}),
        "running": [fence for fence in launched if fence not in finished],
        "won": [fence for fence, _, _ in won],
        "codes": [code for _, code, _ in won],
        "reasons": [why for _, _, why in won],
        "ran_reason": reason,
    }
    ran: list[int] = []
    done: list[tuple[int, int, int]] = []
    for kind, job_or_fence, fence, attempt_no in _execute(conn, SETTLE, params):
        if kind == 0:
            ran.append(job_or_fence)
        else:
            done.append((job_or_fence, fence, attempt_no))
    return ran, done


def _execute(conn: Connection, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Run one statement as the driver takes it (psycopg prepares it once it repeats): no
    statement compiling, no result types; SQLAlchemy still sees the errors, so a broken
    connection is noticed and replaced."""
    result = conn.exec_driver_sql(sql, params)
    try:
        return list(result.cursor.fetchall())  # the driver's tuples, as they are
    finally:
        result.close()
