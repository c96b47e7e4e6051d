"""What the first page of each job-list filter reads, over a large store (EXPLAIN ANALYZE).

    .venv/bin/python bench/job_search.py [--jobs 1000000] [--schedules 10000] [--pg-url URL]

On a fresh PostgreSQL database, migrated by corral and dropped afterwards, `--jobs` jobs are
loaded with INSERT ... SELECT over generate_series (not timed): six in ten HTTP jobs (their
URLs over 500 hosts and 40 paths; one in ten carries a token in its query), the rest
commands; four in five the jobs of firings of `--schedules` schedules (each a tenant's, of
ten tenants), states spread as bench/api.py spreads them, an attempt and a run log (HTTP
status, latency) for each job that ran. Then, for each filter of the job list (the API's
and the dashboard's: a tenant's session, every tenant's), the store's own statements for
the first page of 50 (taken as it runs them, bench/api.py's Capture) are run under EXPLAIN
(ANALYZE, BUFFERS) on a connection with the store's reads' own settings.

JSON on stdout, for each filter: how many jobs the page holds, the rows the statements' scans
read (the rows each scan node returned, and those it read and threw away: Rows Removed by
Filter and by Index Recheck, and a bitmap's heap rows), the buffers touched, the execution
ms, and the indexes used.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import make_url

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import api
from corral import model, store
from corral.store import dialects

PAGE = 50
TENANTS = 10
HOSTS = 500
PATHS = 40
TENANT = "tenant-3"


def load(url: str, jobs: int, schedules: int) -> None:
    """Fill the migrated database at `url` (see the module's doc)."""
    jobs_sql = f"""
        INSERT INTO jobs (id, tenant, queue, pool, priority, executor, spec, payload, state,
            run_at, idempotency_key, max_attempts, attempt_count, labels, created_at,
            updated_at)
        SELECT i, 'tenant-' || (k.sched % {TENANTS}), 'default', NULL, 0,
            CASE WHEN h.http THEN 'http' ELSE 'process' END,
            CASE WHEN h.http THEN jsonb_build_object('method', 'POST', 'url',
                'https://hook-' || h.host || '.example.com/v1/'
                || (ARRAY['orders', 'invoices', 'users', 'reports'])[1 + h.path % 4]
                || '/' || h.path
                || CASE WHEN h.token THEN '?token=tok' || md5(i::text) ELSE '?region=eu' END)
            ELSE '{{"command": ["true"]}}'::jsonb END,
            CASE WHEN h.fired THEN jsonb_build_object('corral',
                jsonb_build_object('schedule', 'sched-' || k.sched)) END,
            s.state,
            t.created + CASE WHEN s.state = 'scheduled' THEN interval '1 day' ELSE '0' END,
            NULL, 3, CASE WHEN s.state IN ('queued', 'scheduled') THEN 0 ELSE 1 END,
            jsonb_build_object('team', 'team-' || (i % 50)), t.created, t.created
        FROM generate_series(1::bigint, {jobs}) AS i,
            LATERAL (SELECT (i * 7919) % {schedules} AS sched) AS k,
            LATERAL (SELECT abs(hashint8(i)) % 10 < 6 AS http,
                abs(hashint8(i * 3)) % {HOSTS} AS host, abs(hashint8(i * 5)) % {PATHS} AS path,
                abs(hashint8(i * 7)) % 10 = 0 AS token, abs(hashint8(i * 11)) % 5 < 4 AS fired
            ) AS h,
            LATERAL (SELECT {api._state_case("((i * 7919) % 1000)")} AS state) AS s,
            LATERAL (SELECT now() - make_interval(secs => {jobs} - i) AS created) AS t
    """
    attempts_sql = """
        INSERT INTO attempts (job_id, attempt_no, launch_name, executor, state, created_at,
            updated_at, started_at, finished_at, exit_code)
        SELECT id, 1, 'corral-' || id || '-1', executor,
            CASE state WHEN 'succeeded' THEN 'succeeded' WHEN 'running' THEN 'running'
                WHEN 'cancelled' THEN 'cancelled' ELSE 'failed' END,
            created_at, updated_at, created_at, CASE WHEN state = 'running' THEN NULL
                ELSE created_at + interval '1 second' END,
            CASE WHEN executor = 'http' OR state = 'running' THEN NULL
                WHEN state = 'succeeded' THEN 0 ELSE 1 END
        FROM jobs WHERE attempt_count > 0 ORDER BY id
    """
    logs_sql = """
        INSERT INTO run_logs (attempt_id, job_id, recorded_at, latency, status, streams, tenant)
        SELECT a.id, a.job_id, a.finished_at, 0.05 + (a.job_id % 100) / 1000.0,
            CASE a.state WHEN 'succeeded' THEN 200 ELSE 503 END, '[]'::jsonb, j.tenant
        FROM attempts AS a JOIN jobs AS j ON j.id = a.job_id
        WHERE a.executor = 'http' AND a.finished_at IS NOT NULL
    """
    with psycopg.connect(api.libpq_url(url), autocommit=True) as conn:
        conn.execute("SET maintenance_work_mem = '256MB'")
        for sql in (jobs_sql, attempts_sql, logs_sql):
            conn.execute(sql)
        conn.execute(f"SELECT setval(pg_get_serial_sequence('jobs', 'id'), {max(1, jobs)})")
        for table in ("jobs", "attempts", "run_logs"):
            conn.execute(f"VACUUM ANALYZE {table}")


def filters() -> dict[str, dict[str, Any]]:
    """Each filter measured: its name, and the JobFilter's fields (a tenant's session
    unless `tenant` is None: every tenant's)."""
    one = {"tenant": TENANT}
    return {
        "tenant": one,
        "every tenant": {"tenant": None},
        "state queued": {**one, "states": ["queued"]},
        "state failed": {**one, "states": ["failed"]},
        "schedule": {**one, "schedule": "sched-13"},  # a tenant-3 schedule's 100 jobs
        "schedule and state failed": {**one, "schedule": "sched-13", "states": ["failed"]},
        "label": {**one, "labels": {"team": "team-7"}},
        "url, most HTTP jobs (example.com)": {**one, "url": "example.com"},
        "url, a fourth of HTTP jobs (/orders/)": {**one, "url": "/orders/"},
        "url, one host (hook-417.)": {**one, "url": "hook-417."},
        "url, one host and path (hook-417.example.com/v1/users/3?)": {
            **one,
            "url": "hook-417.example.com/v1/users/3?",
        },
        "url, no job (nowhere.test)": {**one, "url": "nowhere.test"},
        "url, inside a token only (tok1)": {**one, "url": "tok1"},
        "url, every tenant (hook-417.)": {"tenant": None, "url": "hook-417."},
    }


def scanned(node: dict[str, Any]) -> int:
    """The rows a plan's scans read: returned, and read and thrown away."""
    rows = 0
    if "Scan" in node["Node Type"] and node["Node Type"] != "Bitmap Index Scan":
        loops = node.get("Actual Loops", 1)
        rows += int(node.get("Actual Rows", 0) * loops)
        rows += int(node.get("Rows Removed by Filter", 0))
        rows += int(node.get("Rows Removed by Index Recheck", 0))
    return rows + sum(scanned(child) for child in node.get("Plans", []))


def indexes(node: dict[str, Any]) -> list[str]:
    found = [node["Index Name"]] if "Index Name" in node else []
    return found + [i for child in node.get("Plans", []) for i in indexes(child)]


async def measure(url: str) -> dict[str, Any]:
    """Each filter's first page: its statements run under EXPLAIN ANALYZE."""
    db = store.Store.connect(url)
    capture = api.Capture(db)
    params = dialects.hot_params(db.database.engine)
    out: dict[str, Any] = {}
    try:
        async with await psycopg.AsyncConnection.connect(**params, autocommit=True) as conn:
            for name, fields in filters().items():
                given = model.JobFilter(**fields)
                capture.seen = []
                page = await db.jobs.page(given, limit=PAGE)
                out[name] = {"jobs": len(page.jobs), "rows_read": 0, "buffers": 0, "ms": 0.0}
                for sql, values in capture.seen:
                    if not sql.lstrip().upper().startswith("SELECT"):
                        continue
                    cur = await conn.execute(
                        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, values, prepare=False
                    )
                    [[plan]] = await cur.fetchall()
                    top = plan[0]["Plan"]
                    out[name]["rows_read"] += scanned(top)
                    out[name]["buffers"] += top.get("Shared Hit Blocks", 0) + top.get(
                        "Shared Read Blocks", 0
                    )
                    out[name]["ms"] = round(out[name]["ms"] + plan[0]["Execution Time"], 2)
                    out[name].setdefault("indexes", []).extend(indexes(top))
    finally:
        await db.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--pg-url", default=api.DEFAULT_PG)
    parser.add_argument(
        "--loaded", default="", help="Measure this database, loaded by an earlier run (--keep)."
    )
    parser.add_argument("--keep", action="store_true", help="Keep the database: its URL on stderr.")
    args = parser.parse_args()
    report: dict[str, Any] = {"jobs": args.jobs, "schedules": args.schedules, "page": PAGE}
    if args.loaded:
        report["filters"] = asyncio.run(measure(args.loaded))
    else:
        name = f"corral_bench_search_{uuid.uuid4().hex[:8]}"
        api.admin(args.pg_url, f'CREATE DATABASE "{name}"')
        url = make_url(args.pg_url).set(database=name).render_as_string(hide_password=False)
        try:
            db = store.Store.connect(url)
            asyncio.run(db.database.migrate())
            asyncio.run(db.close())
            load(url, args.jobs, args.schedules)
            report["filters"] = asyncio.run(measure(url))
        finally:
            if args.keep:
                print(f"kept: {url}", file=sys.stderr)
            else:
                api.admin(args.pg_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
