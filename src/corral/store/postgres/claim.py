"""PostgreSQL's claim, one statement: the dispatcher's (each attempt `launching`) and a
Python worker's (only the jobs of the tasks it reads, each attempt recorded running).

It keeps every promise of the general claim (claims.job_claim): due jobs taken in fair
shares across tenants (corral.shares; the same choice as store/picks.py makes in Python),
picked under SKIP LOCKED, compare-and-set on every row, an attempt whose id is the fence,
one run-log event per state change, built in SQL. The shares are counted first, from reads
without locks (`places`, `seen`, `shares`); each tenant's jobs are then locked and taken,
as many as its share (`ready`, `came`, `due`), and the turns of those served moved on
(`served`). The statement is written in parts below, one common table expression (or a
few that belong together) each, and put together once at import.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from corral import model, python_tasks, shares
from corral.store import claimed, claims, statements, workers
from corral.store.postgres import run

if TYPE_CHECKING:
    import psycopg


def _due_of(tenant: str, pick: str, most: str) -> str:
    """A tenant's `most` most urgent due queued jobs and `most` longest due scheduled ones
    (unlocked), each with its place among them."""
    return f"""SELECT id, run_at,
        row_number() OVER (ORDER BY priority DESC, run_at, id) - 1 AS place
    FROM (
        (SELECT id, priority, run_at FROM jobs
        WHERE state = 'queued' AND tenant = {tenant} AND run_at <= %(now)s AND {pick}
        ORDER BY {statements.CLAIM_ORDER} LIMIT {most})
        UNION ALL
        (SELECT id, priority, run_at FROM jobs
        WHERE state = 'scheduled' AND tenant = {tenant} AND run_at <= %(now)s AND {pick}
        ORDER BY run_at, id LIMIT {most})
    ) AS u"""


def _places(pick: str) -> str:
    """`waiting` (the tenants with jobs waiting), `many` (more than one), and then the
    `places` of those with a job due: each one's start (its turn, or the clock if later)
    and weight."""
    return f"""{statements.TENANTS_WAITING}, many AS (
    SELECT count(*) > 1 AS yes FROM waiting
), clock AS (
    SELECT coalesce(max(s.clock), 0) AS at
    FROM waiting AS t JOIN tenant_shares AS s ON s.tenant = t.tenant
    WHERE (SELECT yes FROM many)
), places AS MATERIALIZED (
    SELECT t.tenant, greatest(coalesce(s.turn, c.at), c.at) AS start,
        coalesce(w.weight, %(weight)s) AS weight
    FROM waiting AS t CROSS JOIN clock AS c
    LEFT JOIN tenant_shares AS s ON s.tenant = t.tenant
    LEFT JOIN unnest(%(named)s::text[], %(weights)s::float8[]) AS w (tenant, weight)
        ON w.tenant = t.tenant
    WHERE (SELECT yes FROM many) AND (
        EXISTS (SELECT FROM jobs
            WHERE state = 'queued' AND tenant = t.tenant AND run_at <= %(now)s AND {pick})
        OR EXISTS (SELECT FROM jobs
            WHERE state = 'scheduled' AND tenant = t.tenant AND run_at <= %(now)s AND {pick})
    )
)"""


def _seen(pick: str) -> str:
    """`seen`: the due jobs of each tenant in `places` that a claim could take, with their
    places. A tenant can get no job whose turn is past the newest start plus the limit
    over all their weights (were every tenant to have enough, the claim would end there),
    so `reach` says how many of each to read. Only when a tenant has fewer than that
    (`short`: then the others may get more) are up to the limit of each read."""
    return f"""reach AS MATERIALIZED (
    SELECT tenant, least(
        %(limit)s::float8,
        ceil((max(start) OVER () + %(limit)s / sum(weight) OVER () - start) * weight) + 1
    )::int AS most
    FROM places
), seen_few AS MATERIALIZED (
    SELECT r.tenant, d.id, d.run_at, d.place
    FROM reach AS r CROSS JOIN LATERAL ({_due_of("r.tenant", pick, "r.most")}) AS d
    WHERE d.place < r.most
), short AS (
    SELECT EXISTS (
        SELECT 1 FROM reach AS r
        LEFT JOIN (SELECT tenant, count(*) AS n FROM seen_few GROUP BY tenant) AS f
            ON f.tenant = r.tenant
        WHERE r.most < %(limit)s AND coalesce(f.n, 0) < r.most
    ) AS yes
), seen_all AS MATERIALIZED (
    SELECT p.tenant, d.id, d.run_at, d.place
    FROM places AS p CROSS JOIN LATERAL ({_due_of("p.tenant", pick, "%(limit)s")}) AS d
    WHERE (SELECT yes FROM short)
), seen AS (
    SELECT tenant, id, run_at, place FROM seen_few WHERE NOT (SELECT yes FROM short)
    UNION ALL
    SELECT tenant, id, run_at, place FROM seen_all
)"""


_SHARES = """turns AS MATERIALIZED (
    SELECT s.tenant, p.start + s.place / p.weight AS turn
    FROM seen AS s JOIN places AS p ON p.tenant = s.tenant
    ORDER BY turn, s.run_at, s.id
    LIMIT %(limit)s
), shares AS MATERIALIZED (
    SELECT tenant, count(*) AS n FROM turns GROUP BY tenant
    UNION ALL
    SELECT tenant, %(limit)s FROM waiting WHERE NOT (SELECT yes FROM many)
)"""
"""How many jobs each tenant waiting gets, `shares` (corral.shares, in SQL; picks.py in
Python). With one tenant waiting it gets them all and nothing more is read. With more, each
job `seen` gets the turn it would be taken at (from its tenant's place), and they are
counted in turn order to the limit."""


def _due(pick: str) -> str:
    """`ready` (queued jobs) and `came` (scheduled ones whose time has come) of each tenant,
    as many as its share, locked; and of both, each tenant's most urgent, `due`: what the
    claim takes."""
    return f"""ready AS MATERIALIZED (
    SELECT j.id, j.priority, j.run_at, false AS waited, s.tenant, s.n
    FROM shares AS s CROSS JOIN LATERAL (
        SELECT id, priority, run_at FROM jobs
        WHERE state = 'queued' AND tenant = s.tenant AND run_at <= %(now)s AND {pick}
        ORDER BY {statements.CLAIM_ORDER}
        LIMIT s.n
        FOR UPDATE SKIP LOCKED
    ) AS j
), came AS MATERIALIZED (
    -- Scheduled jobs whose time has come, the longest due first: all are queued, and the
    -- most urgent of them and of `ready` claimed (picks.py says the same in Python).
    SELECT j.id, j.priority, j.run_at, true AS waited, s.tenant, s.n
    FROM shares AS s CROSS JOIN LATERAL (
        SELECT id, priority, run_at FROM jobs
        WHERE state = 'scheduled' AND tenant = s.tenant AND run_at <= %(now)s AND {pick}
        ORDER BY run_at, id
        LIMIT s.n
        FOR UPDATE SKIP LOCKED
    ) AS j
), due AS MATERIALIZED (
    SELECT id, waited, tenant FROM (
        SELECT id, waited, tenant, n,
            row_number() OVER (PARTITION BY tenant ORDER BY {statements.CLAIM_ORDER}) AS place
        FROM (SELECT * FROM ready UNION ALL SELECT * FROM came) AS d
    ) AS ranked
    WHERE place <= n
)"""


_MOVED = """queued AS (
    UPDATE jobs SET state = 'queued', updated_at = %(now)s
    WHERE id = ANY(ARRAY(SELECT id FROM came WHERE id <> ALL(ARRAY(SELECT id FROM due))))
        AND (state = 'scheduled') IS TRUE
    RETURNING id
), moved AS (
    -- By primary key, the ids as one array: a lookup per job whatever the planner guesses
    -- of `due`'s size (a prepared statement's generic plan guesses, and a guess of many
    -- rows would scan the table). The states are checked as `IS TRUE`, which no index
    -- answers: on statistics that count few queued jobs, the planner would otherwise walk
    -- every queued job's entry of ix_jobs_state (as `queued` above would ix_jobs_scheduled).
    UPDATE jobs AS j
    SET state = 'running', attempt_count = j.attempt_count + 1, updated_at = %(now)s
    WHERE j.id = ANY(ARRAY(SELECT id FROM due)) AND (j.state IN ('queued', 'scheduled')) IS TRUE
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
)"""
"""The scheduled jobs left out of `due` queued, the due ones moved to running, and each
moved job's limits (claims.attempt_limits, in SQL)."""


def _made(started: bool) -> str:
    """`made`: each moved job's new attempt (`started`: running from now)."""
    state = "'running'" if started else "'launching'"
    start_columns = ", started_at, last_seen_at" if started else ""
    start_values = ",\n        %(now)s, %(now)s" if started else ""
    return f"""made AS (
    INSERT INTO attempts ({statements.ATTEMPT_COLUMNS}{start_columns})
    SELECT id, attempt_count, 'corral-' || id || '-' || attempt_count, executor, {state},
        %(now)s, %(now)s,
        %(now)s + make_interval(secs => deadline), %(now)s + make_interval(secs => lease),
        lease{start_values}
    FROM leased
    ORDER BY id
    RETURNING id, job_id, attempt_no, launch_name, deadline_at, lease_until, lease_seconds
)"""


def _logged(started: bool) -> str:
    """`logged`: the run log's lines, a job whose time came and that is claimed at once
    having both, in that order; a worker's claim adds the attempt's launching -> running
    (with %(ran_reason)s), as attempts.attempt_record_running writes it."""
    ran = (
        """
        UNION ALL
        SELECT job_id, id, 'attempt', 'launching', 'running', %(ran_reason)s, '{}'::jsonb, 2
        FROM made"""
        if started
        else ""
    )
    return f"""logged AS (
    INSERT INTO events ({statements.EVENT_COLUMNS})
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
        SELECT job_id, id, 'job', 'queued', 'running', {statements.claimed_sql("attempt_no")},
            jsonb_build_object('launch_name', launch_name), 1
        FROM made{ran}
    ) AS e
    ORDER BY job_id, step
)"""


_SERVED = """served AS (
    -- Each tenant served moved on by its jobs over its weight from where it stands (its
    -- turn as the row is now, so two claims at once both count, or the clock if later),
    -- and the clock on to the turn reached (store/shares.places_move, in SQL).
    INSERT INTO tenant_shares AS s (tenant, turn, clock)
    SELECT d.tenant, (SELECT at FROM clock) + count(*) / p.weight, (SELECT max(turn) FROM turns)
    FROM due AS d JOIN places AS p ON p.tenant = d.tenant
    GROUP BY d.tenant, p.weight
    ORDER BY d.tenant  -- rows locked in one order by every claim: no deadlock between two
    ON CONFLICT (tenant) DO UPDATE SET
        turn = greatest(s.turn, (SELECT at FROM clock)) + excluded.turn - (SELECT at FROM clock),
        clock = greatest(s.clock, excluded.clock)
)"""


_JOB = ", ".join(
    f"m.{c}::text" if c in claimed.JSON_COLUMNS else f"m.{c}" for c in claimed.JOB_COLUMNS
)
_RETURNED = f"""SELECT {_JOB},
    a.id, a.launch_name, a.deadline_at, a.lease_until, a.lease_seconds
FROM moved AS m JOIN made AS a ON a.job_id = m.id
ORDER BY m.priority DESC, m.run_at, m.id"""
"""Each claimed job's columns (JSON as text), then its attempt's, most urgent first."""


def claim_sql(*, also: str = "", started: bool = False) -> str:
    """The claim as one statement: the due jobs of %(executors)s that also meet `also`
    (SQL) moved to running, each with a new attempt (`started`: recorded running at once,
    as a worker's claim does) and its run-log lines."""
    # A flow's jobs are the flow claim's (store/flow_claims.py): none of them is picked here.
    pick = "executor = ANY(%(executors)s::text[]) AND flow IS NULL" + also
    parts = [
        _places(pick),
        _seen(pick),
        _SHARES,
        _due(pick),
        _MOVED,
        _made(started),
        _logged(started),
        _SERVED,
    ]
    return "\nWITH RECURSIVE " + ", ".join(parts) + "\n" + _RETURNED + "\n"


CLAIM = claim_sql()
"""The dispatcher's claim."""

# A worker's jobs: the (task, version) pairs it reads as "task:version" texts, of its queues
# (all when none). Inside a CASE, which the planner cannot estimate: it counts on half the
# due jobs matching and walks the queued jobs' index in claim order, stopping at the limit.
# Given the JSON fields' equalities as they are, it counts on almost none matching and
# sorts every queued job first (15 ms a claim with 20,000 queued, against 0.1 ms).
WORKER_CLAIM = claim_sql(
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
    weights: shares.Weights,
) -> list[model.Claimed]:
    """Claim up to `limit` due jobs in one statement, shared by `weights` (see
    claims.job_claim for what a claim is). `deadline` and `lease`: the default limits in
    seconds; both None sets no limits."""
    params = {
        **_weighed(weights),
        "now": now,
        "executors": list(executors),
        "limit": limit,
        "limited": deadline is not None,
        "deadline": deadline,
        "lease": lease,
        "came": claims.TIME_CAME,
    }
    return _claimed(await run.rows(conn, CLAIM, params), now)


async def pg_worker_claim(
    conn: psycopg.AsyncConnection[Any],
    *,
    worker_id: str,
    reads: Sequence[tuple[str, Sequence[int]]],
    queues: Sequence[str],
    now: datetime,
    limit: int,
    limits: claims.DefaultLimits,
    weights: shares.Weights,
) -> list[model.Claimed]:
    """A worker's claim (workers.worker_claim) in one statement: up to `limit` due jobs of
    the (task, versions) it `reads`, of its `queues` (all when empty), each attempt
    recorded running."""
    params = {
        **_weighed(weights),
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
    return _claimed(await run.rows(conn, WORKER_CLAIM, params), now, started=True)


def _weighed(weights: shares.Weights) -> dict[str, Any]:
    """The claim's parameters of the tenants' weights."""
    return {
        "weight": weights.default,
        "named": list(weights.named),
        "weights": list(weights.named.values()),
    }


def _claimed(
    rows: Sequence[Sequence[Any]], now: datetime, started: bool = False
) -> list[model.Claimed]:
    """The claim's rows (each job's columns, then its attempt's) as claims."""
    n = len(claimed.JOB_COLUMNS)
    read = claimed.Reader(times=False)  # psycopg reads times itself
    out = []
    for row in rows:
        job = read.job(row[:n])
        fence, launch_name, deadline_at, lease_until, lease_seconds = row[n:]
        limits = (deadline_at, lease_until, lease_seconds)
        attempt = claimed.launching(job, fence, launch_name, now, limits, started)
        out.append(model.Claimed(job, attempt))
    return out
