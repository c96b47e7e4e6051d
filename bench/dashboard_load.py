"""The store bench/dashboard.py reads: schedules, their firings and jobs, one-off HTTP jobs,
their attempts and run logs, loaded into a migrated PostgreSQL database in a few statements.

What a hosted cron with `schedules` schedules looks like after a while, as the scheduler and
the executors would have written it (store/firings.py, scheduling.firing_payload,
executors/http_outcome.py), made with INSERT ... SELECT over generate_series so that a
million jobs load in minutes:

  * `schedules` schedules over ten tenants (`tenant-0`..`tenant-9`), cron in a zone or every
    N seconds (a minute to a day), three in five sending an HTTP request (GET or POST, some
    with an Authorization header, one in four with a secret `token` in the URL's query), the
    others a command; one in twenty paused;
  * ONE schedule, `tenant-3`'s `heartbeat` (every minute, an HTTP GET whose URL carries a
    `key`), with `firings` nominal times up to now: each fired with its job, but about one
    in a hundred missed and one in a thousand skipped (no job);
  * the other schedules' firings, as many each, their newest at the last nominal time of
    their rule, 45 in 100 of the jobs in all;
  * the rest, one-off jobs created one every few seconds up to now (as bench/api.py's, with
    its states, queues, teams and releases): half HTTP requests to varied URLs (one in seven
    with a secret `api_key`), half commands;
  * a firing's job as the scheduler makes it: the template's executor, spec, queue and
    labels, its payload's scheduling.FIRING object naming the schedule and the interval,
    its idempotency key scheduling.firing_key's, created at its nominal time plus the
    firing's lateness; a firing row for each nominal time, the schedule's last job and last
    nominal time, its next due time;
  * every job that ran has its attempts (three for one that failed or was quarantined,
    thirty seconds apart), and each finished attempt of an HTTP job its run log (status,
    latency, address, the request and response as the run log keeps them);
  * `events` events, as many for each job, the last one into the job's state at its end
    (the overview's charts count those).

Job ids follow the creation times across all of them, as they do in a store that has been
running. Nothing here is timed but the whole (`load_s`, beside the migration); the tables
are analysed at the end.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg

from bench import api
from corral import model

BIG = "heartbeat"
"""The schedule with `firings` firings."""
BIG_TENANT = "tenant-3"
BIG_PERIOD = 60
SCHEDULED_SHARE = 0.45
"""Of the jobs, the share that the schedules other than BIG fired."""
KINDS = ("sync", "report", "backup", "ping", "digest", "cleanup", "invoice", "export")
"""The first word of a schedule's name (and its command's)."""

RULES: list[tuple[str | None, str, int | None, int]] = [
    (None, "UTC", 60, 60),
    (None, "UTC", 300, 300),
    ("*/5 * * * *", "Europe/Paris", None, 300),
    ("*/5 * * * *", "America/New_York", None, 300),
    ("*/15 * * * *", "Europe/Berlin", None, 900),
    (None, "UTC", 900, 900),
    ("0 * * * *", "UTC", None, 3600),
    ("0 * * * *", "Asia/Tokyo", None, 3600),
    (None, "UTC", 3600, 3600),
    ("0 * * * *", "Australia/Sydney", None, 3600),
    ("0 */6 * * *", "UTC", None, 21600),
    (None, "UTC", 21600, 21600),
    ("0 */6 * * *", "UTC", None, 21600),
    ("0 0 * * *", "UTC", None, 86400),
    ("0 0 * * *", "UTC", None, 86400),
    (None, "UTC", 86400, 86400),
]
"""A schedule's rule (cron, zone, every seconds, the seconds between its nominal times), by
(id * 7) % 16: nominal times fall on multiples of the period (a zone's whole-hour offset
keeps that for rules of an hour or less; the longer cron rules are in UTC)."""

FIRING_STATES = [("succeeded", 920), ("failed", 60), ("quarantined", 10), ("cancelled", 10)]
"""The states of firings' jobs (per mille) but each schedule's newest, one in four of which
still runs."""


def big_skipped(k: str) -> str:
    """SQL: whether the BIG schedule's k-th newest nominal time was missed or skipped."""
    return f"({k} % 97 = 50 OR {k} % 997 = 300)"


def sizes(jobs: int, schedules: int, firings: int) -> tuple[int, int, int]:
    """(the BIG schedule's jobs, each other schedule's firings, the one-off jobs) for a load
    of `jobs` jobs; ValueError when they do not fit."""
    big = firings - sum(1 for k in range(firings) if k % 97 == 50 or k % 997 == 300)
    each = int(jobs * SCHEDULED_SHARE) // (schedules - 1) if schedules > 1 else 0
    one_off = jobs - big - each * (schedules - 1)
    if schedules < 1 or firings < 1 or one_off < 1:
        raise ValueError(
            f"{jobs} jobs hold no {firings} firings of one schedule beside"
            f" {SCHEDULED_SHARE:.0%} of them for {schedules - 1} other schedules"
        )
    return big, each, one_off


def _case(column: str, shares: list[tuple[str, int]]) -> str:
    parts, upto = [], 0
    for state, share in shares:
        upto += share
        parts.append(f"WHEN {column} < {upto} THEN '{state}'")
    return f"CASE {' '.join(parts)} END"


def _iso(at: str) -> str:
    """SQL: model.iso of a whole-second time."""
    return f"""to_char(({at}) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')"""


def _latency(job: str, n: str) -> str:
    """SQL: the seconds attempt `n` of job `job` took (50 ms to 1 s, one job in 101 four
    seconds more)."""
    return (
        f"(0.05 + (({job} * 31 + {n} * 17) % 950) / 1000.0"
        f" + CASE WHEN {job} % 101 = 0 THEN 4 ELSE 0 END)"
    )


def _attempt_start(n: str) -> str:
    """SQL: when attempt `n` of job `j` started (retries thirty seconds apart)."""
    return f"(j.created_at + interval '0.1 s' + ({n} - 1) * interval '30 s')"


PLAN_SQL = """
    CREATE TEMP TABLE plan_schedules AS
    SELECT s AS id, r.cron, r.tz, r.every, r.period,
        (floor({now} / r.period) * r.period)::bigint AS latest,
        CASE WHEN s = 1 THEN {firings} ELSE {each} END AS fires
    FROM generate_series(1, {schedules}) AS s
    JOIN (VALUES {rules}) AS r (i, cron, tz, every, period)
      ON r.i = CASE WHEN s = 1 THEN -1 ELSE (s * 7) % {count} END
"""

SCHEDULES_SQL = """
    INSERT INTO schedules (id, tenant, name, cron, tz, every_seconds, anchor, template,
        catchup, catchup_window_seconds, catchup_max, overlap, jitter_seconds, until,
        paused_at, next_due, last_nominal, last_job_id, missed_total, created_at, updated_at,
        tenant_made)
    SELECT p.id, t.tenant, t.name, p.cron, p.tz, p.every, t.born,
        jsonb_build_object('pool', NULL, 'spec', s.spec, 'queue', 'queue-' || (p.id % 20),
            'labels', jsonb_build_object('team', 'team-' || (p.id % 50),
                'env', CASE WHEN p.id % 4 = 0 THEN 'staging' ELSE 'prod' END),
            'policy', '{{}}'::jsonb, 'tenant', t.tenant, 'payload', NULL,
            'executor', t.executor, 'priority', 0, 'code_version', NULL, 'max_attempts', 3),
        'none', 604800, 100, CASE WHEN p.id % 5 = 1 THEN 'forbid' ELSE 'allow' END, 0, NULL,
        CASE WHEN p.id % 20 = 7 THEN to_timestamp({now}) - interval '1 day' END,
        to_timestamp(p.latest + p.period), to_timestamp(p.latest), NULL, 0, t.born,
        to_timestamp({now}), p.id % 2 = 0
    FROM plan_schedules AS p,
      LATERAL (SELECT CASE WHEN p.id = 1 THEN '{big_tenant}' ELSE 'tenant-' || (p.id % 10) END
          AS tenant,
        CASE WHEN p.id = 1 THEN '{big}' ELSE (ARRAY[{kinds}])[p.id % {kind_count} + 1] || '-'
          || lpad(p.id::text, greatest(5, length(p.id::text)), '0') END AS name,
        CASE WHEN p.id = 1 OR (p.id / 10) % 5 < 3 THEN 'http' ELSE 'process' END AS executor,
        to_timestamp(p.latest - p.fires * p.period) AS born) AS t,
      LATERAL (SELECT CASE WHEN p.id = 1 THEN 'GET'
          WHEN p.id % 3 = 0 THEN 'POST' ELSE 'GET' END AS method,
        CASE WHEN p.id = 1
          THEN 'https://status.{big_tenant}.example/heartbeat?key=' || md5('{big}')
          ELSE 'https://hooks.customer-' || (p.id % 500) || '.example/' || split_part(t.name, '-', 1)
            || '/' || p.id || CASE WHEN p.id % 4 = 0
              THEN '?region=eu&token=tok_' || left(md5(p.id::text), 20) ELSE '' END
        END AS url) AS h,
      LATERAL (SELECT CASE WHEN t.executor = 'http' THEN
          jsonb_build_object('url', h.url, 'method', h.method, 'expect', '["2xx"]'::jsonb,
            'headers', CASE WHEN p.id % 5 = 0
              THEN jsonb_build_object('Authorization', 'Bearer ' || left(md5('h' || p.id), 24))
              ELSE '{{}}'::jsonb END)
          || CASE WHEN h.method = 'POST'
            THEN jsonb_build_object('json', jsonb_build_object('source', 'corral'))
            ELSE '{{}}'::jsonb END
        ELSE jsonb_build_object('command',
          jsonb_build_array('/usr/local/bin/' || split_part(t.name, '-', 1), '--tenant', t.tenant))
        END AS spec) AS s
"""

PLAN_JOBS_SQL = """
    CREATE TEMP TABLE plan_jobs AS
    SELECT row_number() OVER (ORDER BY created, sid, k) AS id, sid, k, at, created FROM (
        SELECT p.id AS sid, k, n.at, n.at + make_interval(secs => 0.02
            + ((p.id * 7919 + k * 104729) % 480) / 1000.0
            + CASE WHEN p.id = 1 AND k % 211 = 0 THEN 12 ELSE 0 END) AS created
        FROM plan_schedules AS p, generate_series(0::bigint, p.fires - 1) AS k,
            LATERAL (SELECT to_timestamp(p.latest - k * p.period) AS at) AS n
        WHERE p.id > 1 OR NOT {skipped}
        UNION ALL
        SELECT 0, g, t.at, t.at FROM generate_series(1::bigint, {one_off}) AS g,
            LATERAL (SELECT to_timestamp({now}) - make_interval(secs => ({one_off} - g) * {spacing})
                AS at) AS t
    ) AS x
    ORDER BY 1
"""

JOBS_SQL = """
    INSERT INTO jobs (id, tenant, queue, pool, priority, executor, spec, payload, state,
        run_at, idempotency_key, max_attempts, attempt_count, labels, created_at, updated_at,
        policy, tenant_made)
    SELECT p.id, w.tenant, w.queue, NULL, w.priority, w.executor, w.spec, w.payload, st.state,
        w.run_at, w.key, 3,
        CASE WHEN st.state IN ('queued', 'scheduled', 'parked') THEN 0
            WHEN st.state IN ('failed', 'quarantined') THEN 3 ELSE 1 END,
        w.labels, p.created, p.created, '{{}}'::jsonb, w.made
    FROM plan_jobs AS p
    LEFT JOIN schedules AS s ON s.id = p.sid
    LEFT JOIN plan_schedules AS ps ON ps.id = p.sid,
    LATERAL (SELECT CASE WHEN p.sid = 0 THEN {one_off_state}
        WHEN p.k = 0 AND p.sid % 4 = 0 THEN 'running'
        ELSE {firing_state} END AS state) AS st,
    LATERAL (SELECT
        CASE WHEN p.sid = 0 THEN 'tenant-' || ((p.k * 7) % 1009 % {tenants}) ELSE s.tenant END
          AS tenant,
        CASE WHEN p.sid = 0
          THEN 'queue-' || floor({queues} * power(((p.k * 7907) % 997) / 997.0, 2))::int
          ELSE s.template->>'queue' END AS queue,
        CASE WHEN p.sid = 0 THEN (p.k % 3)::int ELSE 0 END AS priority,
        CASE WHEN p.sid > 0 THEN s.template->>'executor'
          WHEN p.k % 2 = 0 THEN 'http' ELSE 'process' END AS executor,
        CASE WHEN p.sid > 0 THEN s.template->'spec'
          WHEN p.k % 2 = 1 THEN '{{"command": ["true"]}}'::jsonb
          ELSE jsonb_build_object('method', CASE WHEN p.k % 8 = 0 THEN 'POST' ELSE 'GET' END,
            'url', 'https://api.shop-' || ((p.k * 13) % 997) || '.example/v1/orders/'
              || (p.k % 100000) || CASE WHEN p.k % 7 = 0
                THEN '?api_key=sk_' || left(md5(p.k::text), 16) ELSE '' END,
            'headers', '{{}}'::jsonb, 'expect', '["2xx"]'::jsonb) END AS spec,
        CASE WHEN p.sid > 0 THEN jsonb_build_object('corral', jsonb_build_object(
            'schedule', s.name, 'nominal_time', {nominal}, 'interval_start', {nominal},
            'interval_end', {interval_end})) END AS payload,
        CASE WHEN p.sid > 0 THEN p.at
          WHEN st.state = 'scheduled' THEN p.at + interval '1 day' ELSE p.at END AS run_at,
        CASE WHEN p.sid > 0 THEN 'schedule:' || p.sid || ':'
          || to_char(p.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') END AS key,
        CASE WHEN p.sid > 0 THEN s.template->'labels'
          ELSE jsonb_build_object('team', 'team-' || ((p.k * 31) % 1013 % {teams}),
            'env', CASE WHEN p.k % 1019 % 4 = 0 THEN 'staging' ELSE 'prod' END)
            || CASE WHEN p.k % 20 = 0
              THEN jsonb_build_object('release', 'r' || ((p.k / 20) % {releases}))
              ELSE '{{}}'::jsonb END END AS labels,
        coalesce(s.tenant_made, false) AS made) AS w
    ORDER BY p.id
"""

ATTEMPTS_SQL = """
    INSERT INTO attempts (job_id, attempt_no, launch_name, executor, state, created_at,
        updated_at, started_at, finished_at, exit_code, reason)
    SELECT j.id, n, 'corral-' || j.id || '-' || n, j.executor, a.state, a.started,
        coalesce(a.finished, a.started), a.started, a.finished,
        CASE WHEN j.executor = 'http' OR a.state = 'running' THEN NULL
            WHEN a.state = 'succeeded' THEN 0 ELSE 1 END,
        CASE WHEN a.state = 'failed' THEN 'the request was answered with an unexpected status'
            WHEN a.state = 'cancelled' THEN 'cancelled' END
    FROM jobs AS j
    CROSS JOIN LATERAL generate_series(1, j.attempt_count) AS n,
    LATERAL (SELECT CASE WHEN n < j.attempt_count THEN 'failed'
            ELSE CASE j.state WHEN 'succeeded' THEN 'succeeded' WHEN 'running' THEN 'running'
                WHEN 'cancelled' THEN 'cancelled' ELSE 'failed' END END AS state,
        {start} AS started) AS b,
    LATERAL (SELECT b.state, b.started, CASE WHEN b.state = 'running' THEN NULL
        ELSE b.started + make_interval(secs => {latency}) END AS finished) AS a
    WHERE j.attempt_count > 0
"""

JOB_ENDS_SQL = """
    UPDATE jobs AS j SET updated_at = coalesce(a.finished_at, a.started_at)
    FROM attempts AS a
    WHERE a.job_id = j.id AND a.attempt_no = j.attempt_count
"""

RUN_LOGS_SQL = """
    INSERT INTO run_logs (attempt_id, job_id, recorded_at, latency, status, address, streams,
        tenant, bytes)
    SELECT a.id, a.job_id, a.finished_at, extract(epoch FROM a.finished_at - a.started_at),
        r.status, '203.0.113.' || (a.job_id % 250) || ':443',
        jsonb_build_array(
            jsonb_build_object('name', 'request', 'text', r.request,
                'bytes', octet_length(r.request), 'cut', false),
            jsonb_build_object('name', 'response', 'text', r.response,
                'bytes', octet_length(r.response), 'cut', false)),
        j.tenant, octet_length(r.request) + octet_length(r.response)
    FROM attempts AS a JOIN jobs AS j ON j.id = a.job_id,
    LATERAL (SELECT CASE WHEN a.state = 'succeeded'
            THEN CASE WHEN a.id % 10 = 0 THEN 204 ELSE 200 END
            ELSE (ARRAY[500, 502, 503, 504, 429, 404])[a.id % 6 + 1] END AS status) AS c,
    LATERAL (SELECT c.status,
        (j.spec->>'method') || ' ' || split_part(j.spec->>'url', '?', 1)
            || E'\\nuser-agent: corral\\nidempotency-key: corral-' || j.id AS request,
        'HTTP ' || c.status || E'\\ncontent-type: application/json\\n\\n{{"ok": '
            || (c.status < 300)::text || '}}' AS response) AS r
    WHERE j.executor = 'http' AND a.state IN ('succeeded', 'failed')
"""

FIRINGS_SQL = """
    INSERT INTO firings (schedule_id, nominal_at, outcome, job_id, recorded_at,
        lateness_seconds, note)
    SELECT split_part(idempotency_key, ':', 2)::bigint, run_at, 'fired', id, created_at,
        extract(epoch FROM created_at - run_at), NULL
    FROM jobs WHERE idempotency_key LIKE 'schedule:%'
    UNION ALL
    SELECT 1, to_timestamp(p.latest - k * p.period),
        CASE WHEN k % 97 = 50 THEN 'missed' ELSE 'skipped' END, NULL,
        to_timestamp(p.latest - k * p.period) + interval '30 s', 30,
        CASE WHEN k % 97 = 50 THEN NULL ELSE 'paused' END
    FROM plan_schedules AS p, generate_series(0::bigint, p.fires - 1) AS k
    WHERE p.id = 1 AND {skipped}
"""

LAST_JOBS_SQL = """
    UPDATE schedules AS s SET last_job_id = f.job_id,
        missed_total = CASE WHEN s.id = 1 THEN {missed} ELSE 0 END
    FROM (SELECT DISTINCT ON (schedule_id) schedule_id, job_id FROM firings
          WHERE job_id IS NOT NULL ORDER BY schedule_id, nominal_at DESC) AS f
    WHERE s.id = f.schedule_id
"""

EVENTS_SQL = """
    INSERT INTO events (job_id, attempt_id, entity, from_state, to_state, reason, at, details)
    SELECT j.id, NULL, 'job', NULL,
        CASE WHEN e = {per_job} THEN j.state WHEN e = 1 THEN 'queued' ELSE 'running' END,
        'bench', j.created_at + (j.updated_at - j.created_at) * (e::float / {per_job}),
        '{{}}'::jsonb
    FROM jobs AS j, generate_series(1, {per_job}) AS e
"""


def _rules() -> str:
    rows = [(-1, None, "UTC", BIG_PERIOD, BIG_PERIOD), *((i, *r) for i, r in enumerate(RULES))]

    def lit(v: Any) -> str:
        return "NULL" if v is None else str(v) if isinstance(v, int) else f"'{v}'"

    return ", ".join(
        f"({i}, {lit(c)}::text, {lit(tz)}, {lit(e)}::bigint, {p})" for i, c, tz, e, p in rows
    )


def statements(
    jobs: int, events: int, schedules: int, firings: int, now: datetime
) -> list[tuple[str, str]]:
    """The load's statements, in order, each with what it makes."""
    _, each, one_off = sizes(jobs, schedules, firings)
    at = int(now.timestamp())
    kinds = ", ".join(f"'{k}'" for k in KINDS)
    iso, end = _iso("p.at"), _iso("p.at + make_interval(secs => ps.period)")
    return [
        ("plan of schedules", PLAN_SQL.format(
            now=at, firings=firings, each=each, schedules=schedules, rules=_rules(),
            count=len(RULES))),
        ("schedules", SCHEDULES_SQL.format(
            now=at, big=BIG, big_tenant=BIG_TENANT, kinds=kinds, kind_count=len(KINDS))),
        ("plan of jobs", PLAN_JOBS_SQL.format(
            skipped=big_skipped("k"), now=at, one_off=one_off, spacing=jobs / one_off)),
        ("jobs", JOBS_SQL.format(
            one_off_state=api._state_case("((p.k * 7919) % 1000)"),
            firing_state=_case("((p.sid * 7919 + p.k * 104729) % 1000)", FIRING_STATES),
            tenants=api.TENANTS, queues=api.QUEUES, teams=api.TEAMS, releases=api.RELEASES,
            nominal=iso, interval_end=end)),
        ("attempts", ATTEMPTS_SQL.format(
            start=_attempt_start("n"), latency=_latency("j.id", "n"))),
        ("jobs' ends", JOB_ENDS_SQL.format()),
        ("run logs", RUN_LOGS_SQL.format()),
        ("firings", FIRINGS_SQL.format(skipped=big_skipped("k"))),
        ("schedules' last jobs", LAST_JOBS_SQL.format(missed=(firings + 46) // 97)),
        ("events", EVENTS_SQL.format(per_job=max(1, events // jobs))),
    ]  # fmt: skip


def fill(url: str, *, jobs: int, events: int, schedules: int, firings: int) -> None:
    """Load the migrated database at `url` (see the module's docstring), then analyse it."""
    with psycopg.connect(api.libpq_url(url), autocommit=True) as conn:
        conn.execute("SET maintenance_work_mem = '256MB'")
        conn.execute("SET work_mem = '256MB'")
        for _, sql in statements(jobs, events, schedules, firings, datetime.now(UTC)):
            conn.execute(sql)
        for table, column in (("jobs", "id"), ("schedules", "id")):
            conn.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', '{column}'),"
                f" (SELECT max({column}) FROM {table}))"
            )
        for table in ("jobs", "attempts", "run_logs", "firings", "schedules", "events"):
            conn.execute(f"VACUUM ANALYZE {table}")


def facts(url: str) -> dict[str, Any]:
    """What the pages ask for, read from the loaded store: the BIG schedule and its middle
    nominal time, a schedule of BIG_TENANT, the middle schedule's name (a keyset cursor),
    and how many rows each table holds."""
    with psycopg.connect(api.libpq_url(url), autocommit=True) as conn:

        def one(sql: str) -> Any:
            row = conn.execute(sql).fetchone()
            return None if row is None else row[0]

        middle = one(
            "SELECT nominal_at FROM firings WHERE schedule_id = 1 ORDER BY nominal_at DESC"
            " OFFSET (SELECT count(*) / 2 FROM firings WHERE schedule_id = 1) LIMIT 1"
        )
        return {
            "big": {"tenant": BIG_TENANT, "name": BIG, "middle": model.iso(middle)},
            "schedule_of_tenant": one(
                f"SELECT name FROM schedules WHERE tenant = '{BIG_TENANT}' AND id > 1"
                " ORDER BY id LIMIT 1"
            ),
            "middle_schedule": one(
                "SELECT tenant || '/' || name FROM schedules ORDER BY tenant, name"
                " OFFSET (SELECT count(*) / 2 FROM schedules) LIMIT 1"
            ),
            "rows": {
                t: one(f"SELECT count(*) FROM {t}")
                for t in ("jobs", "attempts", "run_logs", "events", "schedules", "firings")
            },
        }
