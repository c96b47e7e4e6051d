"""The dispatcher's hot path, a tick's claim and settle: two statements on PostgreSQL, a few
prepared ones in one transaction each on SQLite; and a Python worker's claim, the same
statement with its attempts recorded running (PostgreSQL).

Each is one data-modifying statement, run on its own (autocommit): the statement is the
transaction, so a tick costs two round trips to the server, and nothing is half-written
whatever happens to the process or the network. They keep every promise of the general
path (claims.job_claim, completions.attempt_settle): compare-and-set on every row, an
attempt row whose id is the fence, one run-log event per state change (built in SQL),
and the settle's rows locked in fence order before anything is written, as every other
writer of attempts locks them. Values go in as array parameters and come out as tuples:
no per-row dictionaries, no JSON encoded in Python, no result processing beyond building
the model's values.

On PostgreSQL they run on the hot path's own async connections (hotpool.py), on the event
loop; on SQLite on the store's one writer thread, as every other transaction there.

The general path stays for what these do not cover: claims that count pools, and settles
with failures (a failure's decision needs its job, its policy and its history: one more
round trip).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection

from corral import launching, model, python_tasks
from corral.store import claims, dialects, runlogs, workers
from corral.store.tables import UTCDateTime, jobs

if TYPE_CHECKING:
    import psycopg

A, J = model.AttemptState, model.JobState

_NONE: Mapping[int, launching.RunLog] = {}

_JOB_COLUMNS = [c.name for c in jobs.c]  # in the order of model.Job's fields (a test checks)
_STATE = _JOB_COLUMNS.index("state")
# Read as text and parsed once per distinct text (_Reader): a batch repeats the same specs,
# policies and labels.
_JSON_COLUMNS = {c.name for c in jobs.c if dialects.is_json(c.type)}


def _claim_sql(*, also: str = "", started: bool = False) -> str:
    """The claim as one statement. The dispatcher's makes each attempt `launching`; a
    worker's (`started`) records it running at once, as attempts.attempt_record_running
    does (its start, and the run log's launching -> running line with %(ran_reason)s),
    and takes only the due jobs that also meet `also` (SQL)."""
    state = "'running'" if started else "'launching'"
    start_columns = ", started_at, last_seen_at" if started else ""
    limit_values = (
        "%(now)s + make_interval(secs => deadline), %(now)s + make_interval(secs => lease), lease"
    )
    start_values = ",\n        %(now)s, %(now)s" if started else ""
    ran = (
        """
        UNION ALL
        SELECT job_id, id, 'attempt', 'launching', 'running', %(ran_reason)s, '{}'::jsonb, 2
        FROM made"""
        if started
        else ""
    )
    pick = "executor = ANY(%(executors)s::text[])" + also
    return f"""
WITH ready AS MATERIALIZED (
    SELECT id, priority, run_at, false AS waited FROM jobs
    WHERE state = 'queued' AND run_at <= %(now)s AND {pick}
    ORDER BY priority DESC, run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), came AS MATERIALIZED (
    -- Scheduled jobs whose time has come, the longest due first: all are queued, and the
    -- most urgent of them and of `ready` claimed (claims.jobs_promote_due, in one statement).
    SELECT id, priority, run_at, true AS waited FROM jobs
    WHERE state = 'scheduled' AND run_at <= %(now)s AND {pick}
    ORDER BY run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), due AS MATERIALIZED (
    SELECT id, waited FROM (SELECT * FROM ready UNION ALL SELECT * FROM came) AS d
    ORDER BY priority DESC, run_at, id
    LIMIT %(limit)s
), queued AS (
    UPDATE jobs SET state = 'queued', updated_at = %(now)s
    WHERE id = ANY(ARRAY(SELECT id FROM came WHERE id <> ALL(ARRAY(SELECT id FROM due))))
        AND state = 'scheduled'
    RETURNING id
), moved AS (
    -- By primary key, the ids as one array: a lookup per job whatever the planner guesses
    -- of `due`'s size (a prepared statement's generic plan guesses, and a guess of many
    -- rows would scan the table).
    UPDATE jobs AS j
    SET state = 'running', attempt_count = j.attempt_count + 1, updated_at = %(now)s
    WHERE j.id = ANY(ARRAY(SELECT id FROM due)) AND j.state IN ('queued', 'scheduled')
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
        deadline_at, lease_until, lease_seconds{start_columns}
    )
    SELECT id, attempt_count, 'corral-' || id || '-' || attempt_count, executor, {state},
        %(now)s, %(now)s,
        {limit_values}{start_values}
    FROM leased
    ORDER BY id
    RETURNING id, job_id, attempt_no, launch_name, deadline_at, lease_until, lease_seconds
), logged AS (
    -- A job whose time came and that is claimed at once has both lines, in that order.
    INSERT INTO events (job_id, attempt_id, entity, from_state, to_state, reason, at, details)
    SELECT job_id, attempt_id, entity, from_state, to_state, reason, %(now)s, details
    FROM (
        SELECT id AS job_id, NULL::bigint AS attempt_id, 'job' AS entity,
            'scheduled' AS from_state, 'queued' AS to_state, %(came)s AS reason,
            '{{}}'::jsonb AS details, 0 AS step
        FROM queued
        UNION ALL
        SELECT a.job_id, NULL, 'job', 'scheduled', 'queued', %(came)s, '{{}}'::jsonb, 0
        FROM made AS a JOIN due AS d ON d.id = a.job_id AND d.waited
        UNION ALL
        SELECT job_id, id, 'job', 'queued', 'running',
            'claimed: attempt ' || attempt_no || ' launching',
            jsonb_build_object('launch_name', launch_name), 1
        FROM made{ran}
    ) AS e
    ORDER BY job_id, step
)
SELECT {", ".join(f"m.{c}::text" if c in _JSON_COLUMNS else f"m.{c}" for c in _JOB_COLUMNS)},
    a.id, a.launch_name, a.deadline_at, a.lease_until, a.lease_seconds
FROM moved AS m JOIN made AS a ON a.job_id = m.id
ORDER BY m.priority DESC, m.run_at, m.id
"""


CLAIM = _claim_sql()

# A worker's jobs: the (task, version) pairs it reads as "task:version" texts, of its queues
# (all when none). Inside a CASE, which the planner cannot estimate: it counts on half the
# due jobs matching and walks the queued jobs' index in claim order, stopping at the limit.
# Given the JSON fields' equalities as they are, it counts on almost none matching and
# sorts every queued job first (15 ms a claim with 20,000 queued, against 0.1 ms).
WORKER_CLAIM = _claim_sql(
    also="""
        AND CASE WHEN (spec ->> 'task') || ':' || ((spec ->> 'version')::int)
                = ANY(%(reads)s::text[])
            AND (cardinality(%(queues)s::text[]) = 0 OR queue = ANY(%(queues)s::text[]))
        THEN true ELSE false END""",
    started=True,
)


async def pg_claim(
    conn: psycopg.AsyncConnection[Any],
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
        "came": claims.TIME_CAME,
    }
    return _claimed(await _execute(conn, CLAIM, params), now)


async def pg_worker_claim(
    conn: psycopg.AsyncConnection[Any],
    *,
    worker_id: str,
    reads: Sequence[tuple[str, Sequence[int]]],
    queues: Sequence[str],
    now: datetime,
    limit: int,
    limits: claims.DefaultLimits,
) -> list[model.Claimed]:
    """A worker's claim (workers.worker_claim) in one statement: up to `limit` due jobs of
    the (task, versions) it `reads`, of its `queues` (all when empty), each attempt
    recorded running."""
    params = {
        "now": now,
        "executors": [python_tasks.PYTHON],
        "limit": limit,
        "limited": True,
        "deadline": limits.attempt_deadline.total_seconds(),
        "lease": limits.lease_timeout.total_seconds(),
        "reads": [f"{task}:{version}" for task, versions in reads for version in versions],
        "queues": list(queues),
        "ran_reason": workers.started_by(worker_id),
        "came": claims.TIME_CAME,
    }
    return _claimed(await _execute(conn, WORKER_CLAIM, params), now, started=True)


def _claimed(
    rows: Sequence[Sequence[Any]], now: datetime, started: bool = False
) -> list[model.Claimed]:
    """The claim's rows (each job's columns, then its attempt's) as claims."""
    n = len(_JOB_COLUMNS)
    read = _Reader(times=False)  # psycopg reads times itself
    out = []
    for row in rows:
        job = read.job(row[:n])
        fence, launch_name, deadline_at, lease_until, lease_seconds = row[n:]
        attempt = _launching(
            job, fence, launch_name, now, deadline_at, lease_until, lease_seconds, started
        )
        out.append(model.Claimed(job, attempt))
    return out


SETTLE = """
WITH locked AS MATERIALIZED (
    -- The attempts in fence order, each with what the settle does to it: one array element
    -- each, in the order of `fences`, so every row is found by its primary key.
    SELECT a.id, a.job_id, a.attempt_no, a.state, f.won, f.code, f.reason
    FROM unnest(%(fences)s::bigint[], %(wins)s::bool[], %(codes)s::int[], %(reasons)s::text[])
        AS f(fence, won, code, reason)
    JOIN attempts AS a ON a.id = f.fence
    ORDER BY a.id
    FOR UPDATE OF a
), ran AS (
    -- The compare-and-set is on `locked`: it holds each row's lock and its newest state, so
    -- nothing changes the row until this statement ends. The updates filter by that state,
    -- never by the row as this statement's snapshot saw it: a writer that committed while
    -- the settle waited for the lock has changed that (a success would be dropped).
    UPDATE attempts AS a
    SET state = 'running', updated_at = %(now)s, started_at = %(now)s, last_seen_at = %(now)s,
        lease_until = CASE WHEN a.lease_seconds IS NULL THEN a.lease_until
            ELSE %(now)s + make_interval(secs => a.lease_seconds) END
    WHERE a.id = ANY(ARRAY(SELECT id FROM locked WHERE NOT won AND state = 'launching'))
    RETURNING a.id, a.job_id
), won AS (
    UPDATE attempts AS a
    SET state = 'succeeded', updated_at = %(now)s, exit_code = l.code, reason = l.reason,
        finished_at = %(now)s, last_seen_at = %(now)s, failure_class = NULL, fingerprint = NULL
    FROM locked AS l
    WHERE a.id = ANY(ARRAY(SELECT id FROM locked WHERE won AND state IN ('launching', 'running')))
        AND l.id = a.id
    RETURNING a.id, a.job_id, a.attempt_no, l.state AS was, l.code, l.reason
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
), kept AS (
    -- The run logs of the attempts that ended here, once each (each ends once).
    INSERT INTO run_logs (attempt_id, job_id, recorded_at, latency, status, address, streams)
    SELECT w.id, w.job_id, %(now)s, l.latency, l.status, l.address, l.streams
    FROM jsonb_to_recordset(%(logs)s) AS l(
        fence bigint, latency float8, status int, address text, streams jsonb
    )
    JOIN won AS w ON w.id = l.fence
)
SELECT 0, id, 0, 0 FROM ran
UNION ALL
SELECT 1, job_id, fence, attempt_no FROM ended
"""


async def pg_settle(
    conn: psycopg.AsyncConnection[Any],
    *,
    launched: Sequence[int],
    won: Sequence[tuple[int, int | None, str | None]],
    now: datetime,
    logs: Mapping[int, launching.RunLog] = _NONE,
    reason: str = "launched",
) -> tuple[list[int], list[tuple[int, int, int]]]:
    """Record `launched` attempts as running and apply successes (fence, exit code, reason)
    and their run logs (by fence) in one statement; a fence in both only succeeds. Returns
    the fences recorded running and, for each job that succeeded, (job id, fence, attempt
    number)."""
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
    for kind, job_or_fence, fence, attempt_no in await _execute(conn, SETTLE, params):
        if kind == 0:
            ran.append(job_or_fence)
        else:
            done.append((job_or_fence, fence, attempt_no))
    return ran, done


async def _execute(
    conn: psycopg.AsyncConnection[Any], sql: str, params: dict[str, Any]
) -> list[tuple[Any, ...]]:
    """Run one statement (psycopg prepares it once it repeats) and read its rows as the
    driver's tuples, as they are."""
    cursor = await conn.execute(sql, params)
    return await cursor.fetchall()


# --- SQLite ---------------------------------------------------------------------------------
#
# One writer at a time (each transaction begins IMMEDIATE), so a transaction costs no round
# trip and reads inside it are exact: the claim and the settle are a few prepared statements
# each, executemany over plain tuples, with the run log's rows built in SQL where they can be.

_SQLITE_CLAIM = f"""
UPDATE jobs SET state = 'running', attempt_count = attempt_count + 1, updated_at = ?
WHERE id IN (
    SELECT id FROM jobs
    WHERE state = 'queued' AND run_at <= ? AND executor IN (SELECT value FROM json_each(?))
    ORDER BY priority DESC, run_at, id
    LIMIT ?
)
RETURNING {", ".join(_JOB_COLUMNS)}
"""
# Scheduled jobs whose time has come, the longest due first: a claim queues them first.
_SQLITE_DUE = """
SELECT id FROM jobs
WHERE state = 'scheduled' AND run_at <= ? AND executor IN (SELECT value FROM json_each(?))
ORDER BY run_at, id
LIMIT ?
"""
_SQLITE_ATTEMPT = """
INSERT INTO attempts (
    job_id, attempt_no, launch_name, executor, state, created_at, updated_at,
    deadline_at, lease_until, lease_seconds
) VALUES (?, ?, ?, ?, 'launching', ?, ?, ?, ?, ?)
"""
_SQLITE_CLAIMED = """
INSERT INTO events (job_id, attempt_id, entity, from_state, to_state, reason, at, details)
SELECT job_id, id, 'job', 'queued', 'running', 'claimed: attempt ' || attempt_no || ' launching',
    ?, json_object('launch_name', launch_name)
FROM attempts WHERE id > ?
"""


def sqlite_claim(
    conn: Connection,
    *,
    now: datetime,
    limit: int,
    executors: Sequence[str],
    deadline: float | None,
    lease: float | None,
) -> list[model.Claimed]:
    """Claim up to `limit` due jobs (see claims.job_claim for what a claim is), inside the
    caller's (write-locked) transaction. `deadline` and `lease`: the default limits in
    seconds; both None sets no limits."""
    cursor = _sqlite_cursor(conn)
    at, kinds = dialects.sqlite_time(now), json.dumps(list(executors))
    if due := [job_id for (job_id,) in cursor.execute(_SQLITE_DUE, (at, kinds, limit))]:
        claims.jobs_promote(conn, ids=due, now=now)
    rows = cursor.execute(_SQLITE_CLAIM, (at, at, kinds, limit)).fetchall()
    if not rows:
        return []
    read = _Reader()
    claimed_jobs = sorted((read.job(row) for row in rows), key=claims.urgency)
    limits = _Limits(now, deadline, lease)
    made = [
        (job, model.launch_name(job.id, job.attempt_count), *limits.of(job)) for job in claimed_jobs
    ]
    before = cursor.execute("SELECT coalesce(max(id), 0) FROM attempts").fetchone()[0]
    stamp = functools.lru_cache(maxsize=None)(dialects.sqlite_time)  # a few distinct times
    cursor.executemany(
        _SQLITE_ATTEMPT,
        [
            (
                job.id,
                job.attempt_count,
                name,
                job.executor,
                at,
                at,
                stamp(deadline_at),
                stamp(lease_until),
                seconds,
            )
            for job, name, deadline_at, lease_until, seconds in made
        ],
    )
    fences = dict(cursor.execute("SELECT job_id, id FROM attempts WHERE id > ?", (before,)))
    cursor.execute(_SQLITE_CLAIMED, (at, before))
    out = []
    for job, name, deadline_at, lease_until, seconds in made:
        attempt = _launching(job, fences[job.id], name, now, deadline_at, lease_until, seconds)
        out.append(model.Claimed(job, attempt))
    return out


def sqlite_settle(
    conn: Connection,
    *,
    launched: Sequence[int],
    won: Sequence[tuple[int, int | None, str | None]],
    now: datetime,
    logs: Mapping[int, launching.RunLog] = _NONE,
    reason: str = "launched",
) -> tuple[list[int], list[tuple[int, int, int]]]:
    """Record `launched` attempts as running and apply successes (fence, exit code, reason)
    and their run logs (by fence), inside the caller's (write-locked) transaction; a fence
    in both only succeeds. Returns
    the fences recorded running and, for each job that succeeded, (job id, fence, attempt
    number)."""
    cursor = _sqlite_cursor(conn)
    at = dialects.sqlite_time(now)
    finished = {fence for fence, _, _ in won}
    running = [fence for fence in launched if fence not in finished]
    ran: list[int] = []
    if running:
        rows = cursor.execute(
            "UPDATE attempts SET state = 'running', updated_at = ?1, started_at = ?1,"
            " last_seen_at = ?1 WHERE id IN (SELECT value FROM json_each(?2))"
            " AND state = 'launching' RETURNING id, job_id, lease_seconds",
            (at, json.dumps(running)),
        ).fetchall()
        ran = [fence for fence, _, _ in rows]
        leased = [
            (dialects.sqlite_time(now + timedelta(seconds=seconds)), fence)
            for fence, _, seconds in rows
            if seconds is not None
        ]
        if leased:  # a job on a lease has all of it from now
            cursor.executemany("UPDATE attempts SET lease_until = ? WHERE id = ?", leased)
        cursor.executemany(
            "INSERT INTO events (job_id, attempt_id, entity, from_state, to_state, reason, at,"
            " details) VALUES (?, ?, 'attempt', 'launching', 'running', ?, ?, '{}')",
            [(job_id, fence, reason, at) for fence, job_id, _ in rows],
        )
    if not won:
        return ran, []
    ends = {fence: (code, why) for fence, code, why in won}
    active = cursor.execute(
        "SELECT a.id, a.job_id, a.attempt_no, a.state, j.state = 'running'"
        " AND j.attempt_count = a.attempt_no FROM attempts AS a JOIN jobs AS j ON j.id = a.job_id"
        " WHERE a.id IN (SELECT value FROM json_each(?)) AND a.state IN ('launching', 'running')",
        (json.dumps(sorted(ends)),),
    ).fetchall()
    cursor.executemany(
        "UPDATE attempts SET state = 'succeeded', updated_at = ?1, exit_code = ?2, reason = ?3,"
        " finished_at = ?1, last_seen_at = ?1, failure_class = NULL, fingerprint = NULL"
        " WHERE id = ?4",
        [(at, *ends[fence], fence) for fence, *_ in active],
    )
    current = [(job_id, fence, n) for fence, job_id, n, _, is_current in active if is_current]
    cursor.executemany(
        "UPDATE jobs SET state = 'succeeded', updated_at = ? WHERE id = ?",
        [(at, job_id) for job_id, _, _ in current],
    )
    events = [
        (job_id, fence, "attempt", was, "succeeded", _ended(*ends[fence]), at)
        for fence, job_id, _, was, _ in active
    ]
    events += [
        (job_id, fence, "job", "running", "succeeded", f"attempt {n} succeeded", at)
        for job_id, fence, n in current
    ]
    cursor.executemany(
        "INSERT INTO events (job_id, attempt_id, entity, from_state, to_state, reason, at,"
        " details) VALUES (?, ?, ?, ?, ?, ?, ?, '{}')",
        events,
    )
    if kept := [(fence, job_id, logs[fence]) for fence, job_id, *_ in active if fence in logs]:
        cursor.executemany(
            "INSERT INTO run_logs (attempt_id, job_id, recorded_at, latency, status, address,"
            " streams) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(fence, job_id, at, *_row(log)) for fence, job_id, log in kept],
        )
    return ran, current


def _launching(
    job: model.Job,
    fence: int,
    launch_name: str,
    now: datetime,
    deadline_at: datetime | None,
    lease_until: datetime | None,
    lease_seconds: float | None,
    started: bool = False,
) -> model.Attempt:
    """The attempt a claim just made, as the row it wrote says (`started`: running)."""
    return model.Attempt(
        id=fence,
        job_id=job.id,
        attempt_no=job.attempt_count,
        launch_name=launch_name,
        executor=job.executor,
        state=A.RUNNING if started else A.LAUNCHING,
        created_at=now,
        updated_at=now,
        started_at=now if started else None,
        finished_at=None,
        exit_code=None,
        reason=None,
        last_seen_at=now if started else None,
        deadline_at=deadline_at,
        lease_until=lease_until,
        lease_seconds=lease_seconds,
    )


def _row(log: launching.RunLog) -> tuple[Any, ...]:
    """latency, status, address and streams (as JSON text) of a run_logs row."""
    fields = runlogs.log_fields(log)
    return (fields["latency"], fields["status"], fields["address"], json.dumps(fields["streams"]))


def _ended(code: int | None, reason: str | None) -> str:
    """A success's run-log line, as the general path writes it."""
    return reason or (f"exit {code}" if code is not None else "succeeded")


def _sqlite_cursor(conn: Connection) -> Any:
    return conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]


class _Reader:
    """Rows of claimed jobs with JSON as text (and, from SQLite, times as text) into
    model.Job; a batch repeats the same texts (`{}`, one submit's times), so each is parsed
    once."""

    def __init__(self, *, times: bool = True) -> None:
        self._json: dict[str | None, Any] = {None: None}
        self._times: dict[str, datetime] = {}
        self._time_at = _TIME_AT if times else []

    def job(self, row: Sequence[Any]) -> model.Job:
        values = list(row)
        for i in _JSON_AT:
            values[i] = self._load(values[i])
        for i in self._time_at:
            values[i] = self._time(values[i])
        values[_STATE] = J.RUNNING
        return model.Job(*values)

    def _load(self, text: str | None) -> Any:
        if text not in self._json:
            self._json[text] = json.loads(text)  # type: ignore[arg-type]
        return self._json[text]

    def _time(self, text: str) -> datetime:
        if text not in self._times:
            self._times[text] = datetime.fromisoformat(text).replace(tzinfo=UTC)
        return self._times[text]


_JSON_AT = [i for i, c in enumerate(jobs.c) if dialects.is_json(c.type)]
_TIME_AT = [i for i, c in enumerate(jobs.c) if isinstance(c.type, UTCDateTime)]


class _Limits:
    """claims.attempt_limits for each claimed job, read once per distinct policy."""

    def __init__(self, now: datetime, deadline: float | None, lease: float | None) -> None:
        self.now = now
        self.limits = (
            None
            if deadline is None
            else claims.DefaultLimits(timedelta(seconds=deadline), timedelta(seconds=lease or 0))
        )
        self._seen: dict[int, tuple[Any, tuple[datetime | None, datetime | None, float | None]]]
        self._seen = {}

    def of(self, job: model.Job) -> tuple[datetime | None, datetime | None, float | None]:
        # By the policy object: _Reader gives the jobs of one policy text the same one (and
        # it is kept here beside its limits, so its id is not another's).
        seen = self._seen.get(id(job.policy))
        if seen is None:
            seen = (job.policy, claims.attempt_limits(job.policy, self.now, self.limits))
            self._seen[id(job.policy)] = seen
        return seen[1]
