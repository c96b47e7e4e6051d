"""Corral against its peers on one PostgreSQL server, in one run: PgQueuer and the raw loop.

    .venv/bin/pip install -e '.[bench]'      # PgQueuer (and asyncpg) are bench-only
    .venv/bin/python bench/peers.py [--jobs 20000] [--rounds 3] [--batch 100] [--pg-url URL]
                                    [--pgqueuer-drivers psycopg,asyncpg] [--tenants 10]

Each round runs every phase once, in an order rotated by one place each round, each on a
fresh database that is analyzed right before its timed part:
  * corral: dispatch+complete of N no-op jobs through the real Dispatcher with claim batch
    `--batch` (throughput.corral_phase, in its own process). Submitting is not timed. With
    it, the dispatcher process's CPU time (time.process_time over the timed part, all its
    threads) per job, and its round trips to the server per dispatcher tick: every round
    trip psycopg makes in that process during the timed part except the probe's
    (statements, COPY as two, the BEGIN/COMMIT/ROLLBACK psycopg sends, pipeline syncs;
    throughput.RoundTrips), the completion writer's between ticks included, divided by
    the ticks the dispatcher reported (on_tick), empty ticks included.
  * corral_tenants: the same, the N jobs queued by `--tenants` tenants of unequal backlogs
    (the i-th queues i parts) and weights (throughput.TENANT_WEIGHTS): its rate against
    corral's, and each tenant's share of the jobs claimed while all still had some
    waiting, against the share its weight gives it (ratio 1: exactly its weight's).
  * raw and raw_same_writes: the FOR UPDATE SKIP LOCKED claim-and-mark-done loop on one
    connection with the same batch, bare and writing corral's attempt rows and events
    (throughput.raw_phase and raw_same_writes_phase).
  * PgQueuer: N jobs enqueued in one statement (not timed), then timed until its queue
    table is empty (every completion written) while QueueManager.run(batch_size=b) works
    them with a no-op entrypoint: batch 10 and batch 100 with one consumer, batch 10 with
    five consumers (five QueueManagers, each on its own connection, in one process and one
    event loop); each configuration in its own process, on PgQueuer's psycopg (async)
    driver, and again on its asyncpg driver when listed in --pgqueuer-drivers. "default"
    is the batch QueueManager.run takes when given none, read from its signature: when
    that is one of the batches above, it is that measurement, not another run.
Corral and PgQueuer are both stopped from outside by a probe on a connection of its own,
every 0.1 s; both run on asyncio's default event loop.

Reported per round and as medians over rounds (the median of the per-round ratios, not a
ratio of medians): jobs/s of each phase; corral/pgqueuer_best (the best of the three
psycopg configurations that round), corral/pgqueuer_best_any_driver when asyncpg ran too,
corral/raw and corral/raw_same_writes; corral's CPU us/job and round trips per tick;
each PgQueuer configuration's CPU us/job. Progress goes to stderr, one JSON document to
stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import inspect
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
from sqlalchemy.engine import make_url

from bench import throughput

try:
    import pgqueuer
    from pgqueuer import Queries, QueueManager
except ImportError:  # pragma: no cover - the message says what to do
    sys.exit("bench/peers.py needs PgQueuer: .venv/bin/pip install -e '.[bench]'")

PROBE_INTERVAL_S = 0.1
"""How often corral's and PgQueuer's phases look whether their queue is empty yet."""


@dataclasses.dataclass(frozen=True)
class PgqConfig:
    """One way of running PgQueuer: batch size, consumers, driver."""

    batch: int
    consumers: int
    driver: str

    @property
    def name(self) -> str:
        driver = "" if self.driver == "psycopg" else f"_{self.driver}"
        consumers = "" if self.consumers == 1 else f"_x{self.consumers}"
        return f"pgqueuer{driver}_batch{self.batch}{consumers}"


PGQ_SHAPES = ((10, 1), (100, 1), (10, 5))
"""(batch, consumers) of the PgQueuer configurations, on every driver."""


def pgqueuer_default_batch() -> int:
    """The batch size QueueManager.run uses when it is given none."""
    default = inspect.signature(QueueManager.run).parameters["batch_size"].default
    assert isinstance(default, int)
    return default


# --- PgQueuer ------------------------------------------------------------------------------------


def pgqueuer_phase(dsn: str, jobs: int, config: PgqConfig, out: Any) -> None:
    """Enqueue `jobs` no-op jobs, then work them all off with `config` (in its own process)."""
    out.put(asyncio.run(_pgqueuer_phase(dsn, jobs, config)))


async def _pgq_connect(driver: str, dsn: str) -> tuple[Any, Queries]:
    """A connection of `driver` and PgQueuer's Queries over it."""
    if driver == "psycopg":
        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        return conn, Queries.from_psycopg_connection(conn)
    import asyncpg

    conn = await asyncpg.connect(dsn)
    return conn, Queries.from_asyncpg_connection(conn)


async def _pgqueuer_phase(dsn: str, jobs: int, config: PgqConfig) -> dict[str, Any]:
    conn, queries = await _pgq_connect(config.driver, dsn)
    await queries.install()
    await queries.enqueue(["noop"] * jobs, [None] * jobs, [0] * jobs)
    await conn.close()
    throughput.analyze(dsn)
    worked = 0

    async def noop(job: pgqueuer.Job) -> None:
        nonlocal worked
        worked += 1

    consumers = []
    for _ in range(config.consumers):
        conn, queries = await _pgq_connect(config.driver, dsn)
        manager = QueueManager(queries)
        manager.entrypoint("noop")(noop)
        consumers.append((conn, manager))
    table = queries.qbe.settings.queue_table
    probe = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    cpu0, t0 = time.process_time(), time.perf_counter()
    runs = [asyncio.create_task(m.run(batch_size=config.batch)) for _, m in consumers]
    while await (await probe.execute(f"SELECT 1 FROM {table} LIMIT 1")).fetchone():
        if failed := [r for r in runs if r.done()]:
            failed[0].result()  # a manager that stopped early: raise what stopped it
            raise RuntimeError("a QueueManager stopped before its queue was empty")
        await asyncio.sleep(PROBE_INTERVAL_S)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    for _, manager in consumers:
        manager.shutdown.set()
    await asyncio.gather(*runs)
    done = await (
        await probe.execute(
            f"SELECT count(*) FROM {queries.qbe.settings.queue_table_log}"
            " WHERE status = 'successful'"
        )
    ).fetchone()
    await probe.close()
    for conn, _ in consumers:
        await conn.close()
    if worked != jobs or done is None or done[0] != jobs:
        raise RuntimeError(f"PgQueuer worked {worked} and logged {done} of {jobs} jobs")
    return {"jobs_per_s": jobs / elapsed, "cpu_us_per_job": 1e6 * cpu / jobs}


# --- one round -----------------------------------------------------------------------------------


def run_phase(name: str, args: argparse.Namespace, configs: dict[str, PgqConfig]) -> Any:
    """One measured phase on a fresh database of its own, dropped afterwards."""
    db = throughput.Database("postgres", args.pg_url, migrated=name not in configs)
    try:
        if name == "corral":
            return throughput.run_corral_phase(db, args.jobs, args.batch)
        if name == "corral_tenants":
            return throughput.run_corral_phase(db, args.jobs, args.batch, args.tenants)
        if name == "raw":
            return throughput.raw_phase(db, args.jobs, args.batch)
        if name == "raw_same_writes":
            return throughput.raw_same_writes_phase(db, args.jobs, args.batch)
        return throughput.in_own_process(pgqueuer_phase, db.dsn, args.jobs, configs[name])
    finally:
        db.drop()


def run_round(
    number: int, args: argparse.Namespace, configs: dict[str, PgqConfig]
) -> dict[str, Any]:
    phases = ["corral", "corral_tenants", "raw", "raw_same_writes", *configs]
    shift = (number - 1) % len(phases)
    order = phases[shift:] + phases[:shift]
    results: dict[str, Any] = {}
    for name in order:
        began = time.perf_counter()
        results[name] = run_phase(name, args, configs)
        _progress(
            f"round {number}/{args.rounds} {name}: {_rate(results[name]):,.0f} jobs/s"
            f" ({time.perf_counter() - began:.0f} s)"
        )
    return summarize_round(number, order, results, configs)


def _rate(result: Any) -> float:
    """jobs/s out of what a phase returned (the raw loops return just that)."""
    if isinstance(result, float):
        return result
    rate = result.get("jobs_per_s", result.get("dispatch_complete_jobs_per_s"))
    assert isinstance(rate, float)
    return rate


def summarize_round(
    number: int, order: list[str], results: dict[str, Any], configs: dict[str, PgqConfig]
) -> dict[str, Any]:
    corral = results["corral"]
    rates = {name: _rate(results[name]) for name in order}
    on_psycopg = [n for n, c in configs.items() if c.driver == "psycopg"]
    best = max(on_psycopg, key=rates.__getitem__)
    best_any = max(configs, key=rates.__getitem__)
    default = _default_name(configs)
    summary: dict[str, Any] = {
        "round": number,
        "order": order,
        "jobs_per_s": rates,
        "pgqueuer_best": best,
        "pgqueuer_best_jobs_per_s": rates[best],
        "pgqueuer_default_jobs_per_s": rates[default],
        "ratio_corral_vs_pgqueuer_best": rates["corral"] / rates[best],
        "ratio_corral_vs_pgqueuer_default": rates["corral"] / rates[default],
        "ratio_corral_vs_raw": rates["corral"] / rates["raw"],
        "ratio_corral_vs_raw_same_writes": rates["corral"] / rates["raw_same_writes"],
        "ratio_raw_same_writes_vs_raw": rates["raw_same_writes"] / rates["raw"],
        "ratio_corral_tenants_vs_corral": rates["corral_tenants"] / rates["corral"],
        "corral_tenant_shares": results["corral_tenants"]["tenant_shares"],
    }
    if len(on_psycopg) != len(configs):
        summary["pgqueuer_best_any_driver"] = best_any
        summary["pgqueuer_best_any_driver_jobs_per_s"] = rates[best_any]
        summary["ratio_corral_vs_pgqueuer_best_any_driver"] = rates["corral"] / rates[best_any]
    summary |= {
        "corral_cpu_us_per_job": corral["dispatch_cpu_us_per_job"],
        "corral_round_trips_per_tick": corral["round_trips_per_tick"],
        "corral_round_trips_per_job": corral["round_trips_per_job"],
        "corral_ticks": corral["dispatcher_ticks"],
        "corral_round_trips": corral["round_trips"],
        "corral_round_trips_by_kind": corral["round_trips_by_kind"],
        "corral_dispatcher_max_rss_mb": corral["dispatcher_max_rss_mb"],
        "pgqueuer_cpu_us_per_job": {n: results[n]["cpu_us_per_job"] for n in configs},
    }
    return summary


def _default_name(configs: dict[str, PgqConfig]) -> str:
    default = PgqConfig(pgqueuer_default_batch(), 1, "psycopg")
    return next(n for n, c in configs.items() if c == default)


def medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The median over rounds of every number in the per-round summaries (nested too)."""
    out: dict[str, Any] = {}
    for key, first in rounds[0].items():
        values = [r.get(key) for r in rounds]
        if isinstance(first, dict):
            out[key] = medians([v for v in values if isinstance(v, dict)])
        elif isinstance(first, int | float) and key != "round":
            out[key] = statistics.median(v for v in values if isinstance(v, int | float))
    return out


# --- main ----------------------------------------------------------------------------------------


def pgq_configs(drivers: list[str]) -> dict[str, PgqConfig]:
    shapes = list(PGQ_SHAPES)
    if (pgqueuer_default_batch(), 1) not in shapes:
        shapes.append((pgqueuer_default_batch(), 1))
    configs = [PgqConfig(b, n, d) for d in drivers for b, n in shapes]
    return {c.name: c for c in configs}


def setup(args: argparse.Namespace, configs: dict[str, PgqConfig]) -> dict[str, Any]:
    with psycopg.connect(throughput.libpq_url(args.pg_url)) as conn:
        server = conn.execute("SHOW server_version").fetchone()
    return {
        "jobs": args.jobs,
        "rounds": args.rounds,
        "claim_batch": args.batch,
        "pg_url": make_url(args.pg_url).render_as_string(hide_password=True),
        "postgres_version": server[0] if server else None,
        "python": platform.python_version(),
        "psycopg": psycopg.__version__,
        "cpus": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
        "pgqueuer": {
            "version": pgqueuer.__version__,
            "drivers": sorted({c.driver for c in configs.values()}),
            "pgqueuer_best_is_over": "the psycopg configurations (PsycopgDriver, AsyncConnection)",
            "configs": {n: dataclasses.asdict(c) for n, c in configs.items()},
            "default_batch_size": pgqueuer_default_batch(),
            "default_is": _default_name(configs),
            "five_consumers": "five QueueManagers, each on its own connection, in one process",
            "event_loop": "asyncio default (no uvloop), as corral's",
            "timed_until": "its queue table is empty (every completion written to its log)",
        },
        "corral_round_trips_counted": (
            "every round trip psycopg made in the dispatcher's process while timed, the"
            " probe's excepted: statements, COPY as two, BEGIN/COMMIT/ROLLBACK sent by"
            " psycopg, pipeline syncs; per tick = that / ticks reported by on_tick"
        ),
        "corral_cpu_counted": "time.process_time() of the dispatcher's process while timed / jobs",
    }


def _best_by_round(rounds: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Which PgQueuer configuration was the best in each round (a name has no median)."""
    keys = ("pgqueuer_best", "pgqueuer_best_any_driver")
    return {f"{k}_by_round": [r[k] for r in rounds] for k in keys if k in rounds[0]}


def _progress(message: str) -> None:
    print(f"[peers {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=100, help="corral's and the raw loop's")
    parser.add_argument(
        "--tenants", type=int, default=10, help="corral_tenants: tenants of unequal backlogs"
    )
    parser.add_argument("--pg-url", default=throughput.DEFAULT_PG)
    parser.add_argument(
        "--pgqueuer-drivers",
        default="psycopg,asyncpg",
        help="PgQueuer drivers to run it on; psycopg is required (pgqueuer_best is on it)",
    )
    args = parser.parse_args()
    drivers = args.pgqueuer_drivers.split(",")
    if "psycopg" not in drivers or not set(drivers) <= {"psycopg", "asyncpg"}:
        parser.error("--pgqueuer-drivers: psycopg, optionally with asyncpg")
    configs = pgq_configs(drivers)
    report = setup(args, configs)
    began = time.perf_counter()
    rounds = [run_round(n, args, configs) for n in range(1, args.rounds + 1)]
    report |= {
        "load_average_at_end": os.getloadavg(),
        "duration_s": time.perf_counter() - began,
        "rounds_detail": rounds,
        "median": medians(rounds) | _best_by_round(rounds),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
