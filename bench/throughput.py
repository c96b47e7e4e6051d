"""Throughput and claim latency of corral's store and dispatcher, against a raw baseline.

    .venv/bin/python bench/throughput.py [--jobs 20000] [--batch 100] [--db sqlite,postgres]
                                         [--big 1000000] [--samples 1000] [--pg-url URL]

For each database it measures, in one run:
  * submit jobs/s (batches of 1,000) and dispatch+complete jobs/s for N no-op jobs through
    the real Dispatcher (claim -> launch -> record running -> completion, every attempt row
    and event written) with an executor that finishes at launch;
  * with it, the dispatcher process's CPU time per job and its round trips to the server
    per dispatcher tick (RoundTrips says what is counted);
  * the physical limit: a raw loop on the same driver and the same jobs table that claims
    with the same batch size (UPDATE ... WHERE id IN (SELECT ... LIMIT n [FOR UPDATE SKIP
    LOCKED]) RETURNING) and marks the rows done, each step its own transaction, writing no
    attempts and no events; and corral/raw as a ratio;
  * the floor for any implementation that keeps corral's promises: the raw loop writing the
    same attempt rows and events in the same transactions (raw_same_writes), with the ratios
    raw_same_writes/raw (the cost of the promises) and corral/raw_same_writes (corral's own
    overhead);
  * p50/p99 claim latency (the claim transaction, rolled back so the queue stays the same
    size; `--samples` of each) with 10k queued, with `--big` queued, and with `--big`
    finished jobs in the table;
  * the dispatcher's peak RSS (each dispatch phase runs in its own process), also with
    `--big` jobs queued while 10k of them run;
Every measured phase starts on a fresh database and right after an ANALYZE, so all phases
plan their queries from the same statistics. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import os
import queue
import resource
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from tests.support.noop import NoopExecutor

from corral import config, dispatcher, launching, model, shares, store, tenancy, timeouts
from corral.clock import SystemClock
from corral.store import hotpath

DEFAULT_PG = os.environ.get(
    "CORRAL_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


# --- databases ---------------------------------------------------------------------------------


class Database:
    """A fresh database for one scenario, migrated unless `migrated=False`, dropped afterwards."""

    def __init__(self, kind: str, pg_admin: str, *, migrated: bool = True) -> None:
        self.kind, self.pg_admin = kind, pg_admin
        if kind == "sqlite":
            self.dir = tempfile.mkdtemp(prefix="corral-bench-")
            self.url = f"sqlite:///{self.dir}/bench.db"
        else:
            self.name = f"corral_bench_{uuid.uuid4().hex[:8]}"
            self._admin(f'CREATE DATABASE "{self.name}"')
            self.url = (
                make_url(pg_admin).set(database=self.name).render_as_string(hide_password=False)
            )
        if migrated:
            db = store.Store.connect(self.url)
            asyncio.run(db.database.migrate())
            asyncio.run(db.close())

    def _admin(self, sql: str) -> None:
        engine = create_engine(self.pg_admin, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(text(sql))
        engine.dispose()

    def drop(self) -> None:
        if self.kind == "sqlite":
            for f in Path(self.dir).iterdir():
                f.unlink()
            os.rmdir(self.dir)
        else:
            self._admin(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    @property
    def dsn(self) -> str:
        """The libpq URL of a PostgreSQL database (no SQLAlchemy driver name)."""
        return libpq_url(self.url)

    def raw_connect(self) -> Any:
        """A plain driver connection (sqlite3 / psycopg) set up as corral sets up its own."""
        return raw_connect(self.url)


def libpq_url(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def raw_connect(url: str, *, autocommit: bool = False) -> Any:
    """A plain driver connection to `url`; a SQLite one always autocommits (BEGIN is explicit)."""
    if url.startswith("sqlite"):
        path = url.removeprefix("sqlite:///")
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        for pragma in ("journal_mode=WAL", "busy_timeout=30000", "synchronous=FULL"):
            conn.execute(f"PRAGMA {pragma}")
        return conn
    return psycopg.connect(libpq_url(url), autocommit=autocommit)


def analyze(url: str) -> None:
    """ANALYZE the whole database, so the next phase plans from fresh statistics."""
    conn = raw_connect(url, autocommit=True)
    try:
        conn.execute("ANALYZE")
    finally:
        conn.close()


def seed(db: Database, *, state: str, count: int) -> None:
    """Insert `count` jobs in `state` quickly (one INSERT ... SELECT)."""
    cols = (
        "tenant, queue, pool, priority, executor, spec, payload, state, run_at, idempotency_key,"
        " max_attempts, attempt_count, labels, created_at, updated_at"
    )
    if db.kind == "sqlite":
        sql = (
            f"WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {count}) "
            f"INSERT INTO jobs ({cols}) SELECT 'default', 'default', NULL, 0, 'noop', '{{}}', NULL, "
            f"'{state}', '2020-01-01 00:00:00.000000', NULL, 3, 0, '{{}}', '2020-01-01 00:00:00.000000', "
            f"'2020-01-01 00:00:00.000000' FROM n"
        )
    else:
        sql = (
            f"INSERT INTO jobs ({cols}) SELECT 'default', 'default', NULL, 0, 'noop', '{{}}'::jsonb, NULL, "
            f"'{state}', '2020-01-01', NULL, 3, 0, '{{}}'::jsonb, '2020-01-01', '2020-01-01' "
            f"FROM generate_series(1, {count})"
        )
    engine = store.dialects.engine_create(db.url)
    with engine.begin() as conn:
        store.dialects.statements_unbounded(conn)  # a bulk load may outlast statement_timeout
        conn.exec_driver_sql(sql)
        conn.exec_driver_sql("ANALYZE")
    engine.dispose()


# --- corral ------------------------------------------------------------------------------------


class RoundTrips:
    """Round trips to PostgreSQL through psycopg in this process, counted by kind.

    psycopg is patched at class level, so every psycopg connection in the process counts:
    SQLAlchemy's and any the store opens or drives itself (COPY on the raw DBAPI connection,
    say), except the connections passed to `ignore` (the benchmark's own probe). Counted:
      * statement: each Cursor/AsyncCursor.execute outside pipeline mode (SQLAlchemy's
        pre-ping SELECT 1 included; Connection.execute goes through a cursor);
      * copy: each Cursor/AsyncCursor.copy, as two (the COPY, then its end);
      * transaction: each command psycopg sends by itself outside pipeline mode: the BEGIN
        before a transaction's first statement, COMMIT, ROLLBACK;
      * pipeline_sync: each sync of a pipeline (executemany runs in one), the statements
        queued in it costing no round trip of their own.
    A COMMIT or ROLLBACK of a connection with no transaction open sends nothing and counts
    nothing. `hooks` names what was patched, since the last two kinds patch psycopg's
    internals (looked up, not assumed: a psycopg without them counts the first two only).
    """

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.hooks: list[str] = []
        self._ignored: set[int] = set()
        self._lock = threading.Lock()

    def install(self) -> RoundTrips:
        for cls in (psycopg.Cursor, psycopg.AsyncCursor):
            self._patch(cls, "execute", "statement", lambda cur: cur.connection)
            self._patch(cls, "copy", "copy", lambda cur: cur.connection, weight=2)
        conn_base = _defining(psycopg.Connection, "_exec_command")
        if conn_base is not None:
            self._patch(conn_base, "_exec_command", "transaction", lambda conn: conn)
        for name in ("_sync_gen", "_exit_gen"):
            pipeline_base = _defining(psycopg.Pipeline, name)
            if pipeline_base is not None:
                self._patch(
                    pipeline_base, name, "pipeline_sync", lambda p: p._conn, in_pipeline=True
                )
        return self

    def ignore(self, conn: Any) -> None:
        self._ignored.add(id(conn))

    def total(self) -> int:
        return sum(self.counts.values())

    def _patch(
        self,
        cls: type,
        name: str,
        kind: str,
        conn_of: Callable[[Any], Any],
        *,
        weight: int = 1,
        in_pipeline: bool = False,
    ) -> None:
        original = vars(cls)[name]

        def counted(obj: Any, *args: Any, **kwargs: Any) -> Any:
            conn = conn_of(obj)
            queued = getattr(conn, "_pipeline", None) is not None and not in_pipeline
            if not queued and id(conn) not in self._ignored:
                with self._lock:
                    self.counts[kind] += weight
            return original(obj, *args, **kwargs)

        setattr(cls, name, counted)
        self.hooks.append(f"{cls.__module__}.{cls.__qualname__}.{name}")


def _defining(cls: type, name: str) -> type | None:
    """The class in `cls`'s MRO that defines `name`, if any."""
    return next((c for c in cls.__mro__ if name in vars(c)), None)


def corral_phase(url: str, jobs: int, batch: int, tenants: int, out: Any) -> None:
    """Submit `jobs` no-op jobs (of `tenants` tenants: see tenant_backlogs), then dispatch
    and complete them all (runs in its own process)."""
    out.put(asyncio.run(_corral_phase(url, jobs, batch, tenants)))


def run_corral_phase(db: Database, jobs: int, batch: int, tenants: int = 1) -> dict[str, Any]:
    """corral_phase in a fresh process: its CPU time and RSS are the dispatcher's alone."""
    result: dict[str, Any] = in_own_process(corral_phase, db.url, jobs, batch, tenants)
    return result


TENANT_WEIGHTS = (1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 4.0)
"""The weights of the tenants of a phase with many (the first ones' as many as it has)."""


def tenant_backlogs(jobs: int, tenants: int) -> dict[str, tuple[int, float]]:
    """Each tenant's backlog and weight when `jobs` are shared by `tenants` unequally: the
    i-th (from 1) queues i parts of them, the last what is left."""
    parts = tenants * (tenants + 1) // 2
    names = [f"tenant-{i:02d}" for i in range(1, tenants + 1)]
    backlogs = [jobs * i // parts for i in range(1, tenants)]
    backlogs.append(jobs - sum(backlogs))
    weights = TENANT_WEIGHTS[:tenants] if tenants > 1 else (1.0,)
    return {n: (b, w) for n, b, w in zip(names, backlogs, weights, strict=True)}


def in_own_process(phase: Callable[..., None], *args: Any) -> Any:
    """Run `phase(*args, out)` in a freshly spawned process; what it put on `out`."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=phase, args=(*args, out))
    proc.start()
    while True:
        try:
            result = out.get(timeout=1)
            break
        except queue.Empty:
            if not proc.is_alive():  # it died before putting anything: do not wait for good
                raise RuntimeError(f"{phase.__name__} exited with {proc.exitcode}") from None
    proc.join()
    return result


async def _corral_phase(url: str, jobs: int, batch: int, tenants: int = 1) -> dict[str, Any]:
    round_trips = RoundTrips().install()
    clock = SystemClock()
    db = store.Store.connect(url)
    analyze(url)
    backlogs = tenant_backlogs(jobs, tenants)
    owners = [name for name, (n, _) in backlogs.items() for _ in range(n)]
    t0 = time.perf_counter()
    for start in range(0, jobs, 1000):
        chunk = [
            model.NewJob(executor="noop", spec={}, tenant=tenant)
            for tenant in owners[start : start + 1000]
        ]
        await db.jobs.submit(new=chunk, now=clock.now())
    submit_s = time.perf_counter() - t0
    analyze(url)
    weights = {name: w for name, (_, w) in backlogs.items()} if tenants > 1 else None
    dispatched = await _dispatch_all(db, url, jobs, batch, round_trips, weights)
    await db.close()
    shares = {"tenant_shares": claimed_shares(url, backlogs)} if tenants > 1 else {}
    return {
        "submit_jobs_per_s": jobs / submit_s,
        **dispatched,
        **shares,
        "dispatcher_max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def claimed_shares(url: str, backlogs: dict[str, tuple[int, float]]) -> dict[str, Any]:
    """Each tenant's share of the jobs claimed while every tenant still had some waiting
    (claims in the order of their fences, up to the claim of the first tenant's last
    job), against the share its weight gives it."""
    with raw_connect(url, autocommit=True) as conn:
        order = [
            tenant
            for (tenant,) in conn.execute(
                "SELECT j.tenant FROM attempts AS a JOIN jobs AS j ON j.id = a.job_id ORDER BY a.id"
            )
        ]
    left = {name: n for name, (n, _) in backlogs.items()}
    window: Counter[str] = Counter()
    for tenant in order:
        window[tenant] += 1
        left[tenant] -= 1
        if left[tenant] == 0:
            break
    total, weights = sum(window.values()), sum(w for _, w in backlogs.values())
    return {
        "window_jobs": total,
        "by_tenant": {
            name: {
                "backlog": n,
                "weight": w,
                "share": window[name] / total,
                "share_by_weight": w / weights,
                "ratio_share_vs_weight": (window[name] / total) / (w / weights),
            }
            for name, (n, w) in backlogs.items()
        },
    }


async def _dispatch_all(
    db: store.Store,
    url: str,
    jobs: int,
    batch: int,
    round_trips: RoundTrips,
    weights: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Run a Dispatcher until no job is queued or running (the tenants shared by
    `weights`): its rate, CPU and round trips."""
    clock = SystemClock()
    settings = config.Settings(
        tenants={name: tenancy.TenantSettings(weight=w) for name, w in (weights or {}).items()},
        claim_batch_limit=batch,
        timeouts=timeouts.Timeouts(dispatch_interval=0.05, tick_deadline=0.04, tick_margin=0.01),
    )
    executor = NoopExecutor()
    d = dispatcher.Dispatcher(
        store=db, executors={"noop": executor}, clock=clock, settings=settings
    )
    ticks = 0

    def tick() -> None:
        nonlocal ticks
        ticks += 1

    # The probe has a connection of its own, left out of the count: it is not corral's.
    probe = raw_connect(url, autocommit=True)
    round_trips.ignore(probe)
    pending = "SELECT 1 FROM jobs WHERE state IN ('queued', 'running') LIMIT 1"  # an index probe
    stop = asyncio.Event()
    gc.freeze()  # as `corral serve` does once started (cli/loops.py)
    round_trips.counts.clear()
    cpu0, t0 = time.process_time(), time.perf_counter()
    runner = asyncio.create_task(d.run(stop, on_tick=tick))
    while await asyncio.to_thread(lambda: probe.execute(pending).fetchone()):
        await asyncio.sleep(0.1)
    dispatch_s, dispatch_cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
    trips, by_kind = round_trips.total(), dict(round_trips.counts)
    stop.set()
    await runner
    probe.close()
    assert executor.launched == jobs
    on_server = db.database.dialect == "postgresql"  # a SQLite file has no round trips to count
    return {
        "dispatch_complete_jobs_per_s": jobs / dispatch_s,
        "dispatch_cpu_us_per_job": 1e6 * dispatch_cpu_s / jobs,
        "dispatcher_ticks": ticks,
        "round_trips": trips if on_server else None,
        "round_trips_by_kind": by_kind if on_server else None,
        "round_trips_per_tick": trips / ticks if on_server and ticks else None,
        "round_trips_per_job": trips / jobs if on_server else None,
        "round_trip_hooks": round_trips.hooks if on_server else None,
    }


class _Holding(NoopExecutor):
    """Launches and never finishes: its attempts stay running, as long jobs do."""

    async def launch(self, launch: launching.Launch) -> None:
        self.launch_calls += 1
        self.launches[launch.name] = launch

    async def observe(self, names: Sequence[str]) -> dict[str, launching.Observation]:
        return {}


def rss_phase(url: str, held: int, batch: int, out: Any) -> None:
    """A dispatcher over a big queue until `held` attempts run (in its own process)."""
    out.put(asyncio.run(_rss_phase(url, held, batch)))


async def _rss_phase(url: str, held: int, batch: int) -> dict[str, Any]:
    db = store.Store.connect(url)
    settings = config.Settings(
        claim_batch_limit=batch,
        timeouts=timeouts.Timeouts(dispatch_interval=0.05, tick_deadline=0.04, tick_margin=0.01),
    )
    executor = _Holding()
    d = dispatcher.Dispatcher(
        store=db, executors={"noop": executor}, clock=SystemClock(), settings=settings
    )
    stop = asyncio.Event()
    runner = asyncio.create_task(d.run(stop))
    while executor.launched < held:
        await asyncio.sleep(0.1)
    stop.set()
    await runner
    await db.close()
    return {
        "running": executor.launched,
        "dispatcher_max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def rss_scenario(kind: str, pg: str, batch: int, big: int, held: int = 10_000) -> dict[str, Any]:
    """The dispatcher's peak RSS with `big` jobs queued while `held` of them run."""
    db = Database(kind, pg)
    try:
        seed(db, state="queued", count=big)
        result: dict[str, Any] = in_own_process(rss_phase, db.url, held, batch)
    finally:
        db.drop()
    return {"queued": big, **result}


# --- raw baseline --------------------------------------------------------------------------------


def raw_phase(db: Database, jobs: int, batch: int) -> float:
    """The same claim and completion as bare SQL on the same driver and the same jobs table
    (same indexes), without attempts or events: jobs/s."""
    seed(db, state="queued", count=jobs)
    conn = db.raw_connect()
    lock = "" if db.kind == "sqlite" else "FOR UPDATE SKIP LOCKED"
    ph = "?" if db.kind == "sqlite" else "%s"
    claim = (
        f"UPDATE jobs SET state = 'running' WHERE id IN (SELECT id FROM jobs WHERE state = 'queued'"
        f" AND run_at <= CURRENT_TIMESTAMP ORDER BY state, priority DESC, run_at, id LIMIT {batch} {lock})"
        f" RETURNING id"
    )
    done = 0
    t0 = time.perf_counter()
    while ids := _raw_tx(conn, db.kind, lambda c: [r[0] for r in c.execute(claim).fetchall()]):
        marks = ", ".join(ph for _ in ids)
        mark_done = f"UPDATE jobs SET state = 'succeeded' WHERE id IN ({marks})"
        _raw_tx(conn, db.kind, lambda c, sql=mark_done, ids=ids: c.execute(sql, ids))
        done += len(ids)
    elapsed = time.perf_counter() - t0
    conn.close()
    assert done == jobs
    return jobs / elapsed


def raw_same_writes_phase(db: Database, jobs: int, batch: int) -> float:
    """The raw loop again, but writing what corral's durability promises write per batch:
    an attempt row per job (inserted, then ended), one event per state change (three per
    job), in the same two transactions per batch. The floor for any implementation that
    keeps those promises; corral's gap to it is its own overhead. jobs/s."""
    seed(db, state="queued", count=jobs)
    conn = db.raw_connect()
    sql = _RawSql(db.kind, batch)
    done = 0
    t0 = time.perf_counter()
    while ids := _raw_tx(conn, db.kind, sql.claim_with_attempts):
        _raw_tx(conn, db.kind, lambda c, ids=ids: sql.settle(c, ids))
        done += len(ids)
    elapsed = time.perf_counter() - t0
    conn.close()
    assert done == jobs
    return jobs / elapsed


class _RawSql:
    """Hand-written SQL for raw_same_writes_phase, one method per transaction body."""

    def __init__(self, kind: str, batch: int) -> None:
        self.kind = kind
        self.ph = "?" if kind == "sqlite" else "%s"
        lock = "" if kind == "sqlite" else "FOR UPDATE SKIP LOCKED"
        self.claim = (
            "UPDATE jobs SET state = 'running', attempt_count = attempt_count + 1 WHERE id IN"
            " (SELECT id FROM jobs WHERE state = 'queued' AND run_at <= CURRENT_TIMESTAMP"
            f" ORDER BY state, priority DESC, run_at, id LIMIT {batch} {lock}) RETURNING id"
        )
        self.now = "2026-01-01 00:00:00.000000"

    def _events(self, cur: Any, rows: list[tuple[Any, ...]]) -> None:
        p = self.ph
        cur.executemany(
            "INSERT INTO events (job_id, attempt_id, entity, from_state, to_state, reason, at, details)"
            f" VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p}, {p})",
            rows,
        )

    def claim_with_attempts(self, cur: Any) -> list[tuple[int, int]]:
        ids = [r[0] for r in cur.execute(self.claim).fetchall()]
        if not ids:
            return []
        p = self.ph
        values = ", ".join(f"({p}, 1, {p}, 'noop', 'launching', {p}, {p})" for _ in ids)
        params = [v for i in ids for v in (i, f"corral-{i}-1", self.now, self.now)]
        fences = cur.execute(
            "INSERT INTO attempts (job_id, attempt_no, launch_name, executor, state, created_at,"
            f" updated_at) VALUES {values} RETURNING job_id, id",
            params,
        ).fetchall()
        self._events(
            cur, [(j, a, "job", "queued", "running", "claimed", self.now, "{}") for j, a in fences]
        )
        return [(j, a) for j, a in fences]

    def settle(self, cur: Any, pairs: list[tuple[int, int]]) -> None:
        p = self.ph
        marks = ", ".join(p for _ in pairs)
        cur.execute(
            f"UPDATE attempts SET state = 'succeeded', exit_code = 0 WHERE id IN ({marks})",
            [a for _, a in pairs],
        )
        cur.execute(
            f"UPDATE jobs SET state = 'succeeded' WHERE id IN ({marks})", [j for j, _ in pairs]
        )
        self._events(
            cur,
            [
                (j, a, e, f, t, "done", self.now, "{}")
                for j, a in pairs
                for e, f, t in (
                    ("attempt", "launching", "succeeded"),
                    ("job", "running", "succeeded"),
                )
            ],
        )


def _raw_tx(conn: Any, kind: str, body: Any) -> Any:
    cur = conn.cursor()
    if kind == "sqlite":
        cur.execute("BEGIN IMMEDIATE")
        result = body(cur)
        cur.execute("COMMIT")
        return result
    result = body(cur)
    conn.commit()
    return result


# --- claim latency -------------------------------------------------------------------------------


def claim_latency(db: Database, batch: int, samples: int = 1000) -> dict[str, float]:
    """p50/p99 of the claim the dispatcher makes (store/postgres/claim.py: one statement on
    PostgreSQL, on a connection as the hot path's), in a transaction rolled back each time,
    so the queue is unchanged."""
    engine = store.dialects.engine_create(db.url)
    if db.kind == "sqlite":
        timings = _sqlite_claim_timings(engine, batch, samples + 10)
    else:
        params = store.dialects.hot_params(engine)
        timings = asyncio.run(_pg_claim_timings(params, batch, samples + 10))
    engine.dispose()
    timings = sorted(timings[10:])  # the first few warm caches up
    return {
        "p50_ms": 1000 * statistics.median(timings),
        "p99_ms": 1000 * timings[int(0.99 * len(timings)) - 1],
    }


def _claim_args(batch: int) -> dict[str, Any]:
    """What the latency scenarios' claims ask for, on either database's hot path."""
    return {
        "limit": batch,
        "executors": ["noop"],
        "deadline": 3600.0,
        "lease": 60.0,
        "weights": shares.Weights(),
    }


def _sqlite_claim_timings(engine: Any, batch: int, samples: int) -> list[float]:
    now, timings = SystemClock().now(), []
    with engine.connect() as conn:
        for _ in range(samples):
            t0 = time.perf_counter()
            tx = conn.begin()
            claimed = hotpath.SQLITE.claim(conn, now=now, **_claim_args(batch))
            tx.rollback()
            timings.append(time.perf_counter() - t0)
            assert len(claimed) == batch
    return timings


async def _pg_claim_timings(params: dict[str, Any], batch: int, samples: int) -> list[float]:
    now, timings = SystemClock().now(), []
    async with await psycopg.AsyncConnection.connect(**params) as conn:
        for _ in range(samples):
            t0 = time.perf_counter()
            claimed = await hotpath.POSTGRESQL.claim(conn, now=now, **_claim_args(batch))
            await conn.rollback()
            timings.append(time.perf_counter() - t0)
            assert len(claimed) == batch
    return timings


def latency_scenarios(
    kind: str, pg: str, batch: int, big: int, samples: int = 1000
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, queued, finished in (
        ("10k_queued", 10_000, 0),
        (f"{big}_queued", big, 0),
        (f"{big}_finished_10k_queued", 10_000, big),
    ):
        db = Database(kind, pg)
        try:
            if finished:
                seed(db, state="succeeded", count=finished)
            seed(db, state="queued", count=queued)
            out[label] = claim_latency(db, batch, samples)
        finally:
            db.drop()
    base = out["10k_queued"]["p99_ms"]
    out["p99_ratio_big_queued_vs_10k"] = out[f"{big}_queued"]["p99_ms"] / base
    out["p99_ratio_big_finished_vs_10k"] = out[f"{big}_finished_10k_queued"]["p99_ms"] / base
    return out


# --- main ------------------------------------------------------------------------------------------


def run_database(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {}
    db = Database(kind, args.pg_url)
    try:
        result["corral"] = run_corral_phase(db, args.jobs, args.batch)
    finally:
        db.drop()
    for name, phase in (("raw", raw_phase), ("raw_same_writes", raw_same_writes_phase)):
        raw_db = Database(kind, args.pg_url)
        try:
            result[f"{name}_jobs_per_s"] = phase(raw_db, args.jobs, args.batch)
        finally:
            raw_db.drop()
    corral_rate = result["corral"]["dispatch_complete_jobs_per_s"]
    result["ratio_corral_vs_raw"] = corral_rate / result["raw_jobs_per_s"]
    result["ratio_raw_same_writes_vs_raw"] = (
        result["raw_same_writes_jobs_per_s"] / result["raw_jobs_per_s"]
    )
    result["ratio_corral_vs_raw_same_writes"] = corral_rate / result["raw_same_writes_jobs_per_s"]
    result["claim_latency"] = latency_scenarios(
        kind, args.pg_url, args.batch, args.big, args.samples
    )
    held = min(10_000, args.big // 2)  # a small --big (a smoke run) holds half of it
    result["rss_big_queue"] = rss_scenario(kind, args.pg_url, args.batch, args.big, held)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument(
        "--big", type=int, default=1_000_000, help="Rows for the large-table latency cases."
    )
    parser.add_argument(
        "--samples", type=int, default=1000, help="Timed claims of each latency case."
    )
    parser.add_argument("--db", default="sqlite,postgres")
    parser.add_argument("--pg-url", default=DEFAULT_PG)
    args = parser.parse_args()
    report: dict[str, Any] = {"jobs": args.jobs, "claim_batch": args.batch, "big": args.big}
    for kind in args.db.split(","):
        print(f"benchmarking {kind} ...", file=sys.stderr)
        report[kind] = run_database(kind, args)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
