"""Python tasks through `corral worker` processes against the dispatcher's own rate, and a
parked backlog drained when a worker that reads it registers.

    .venv/bin/python bench/workers.py [--jobs 20000] [--workers 2] [--concurrency 16]
                                      [--backlog 10000] [--batch 100] [--pg-url URL]

Every scenario runs on a fresh PostgreSQL database, migrated by corral and dropped after.
The app (APP below, written to a temporary folder) has one task, `noop` version 1: an
async function that returns at once.

  * workers: `--workers` real `corral worker bench_app:app --concurrency N` processes (the
    venv's `corral`, default settings, logging at WARNING) start and register with nothing
    queued; then `--jobs` jobs of the task, checked by the client against the schema the
    workers registered (Client.task_checked, validate), are stored by Client.submit_many
    in one transaction, so all become claimable at once; the workers run them all. Their
    rate is the jobs over the span from the first attempt made to the last one ended, as
    the attempts' own times say (the workers write them); each worker's share comes from
    the events that name the worker that started an attempt, their CPU from /proc.
  * dispatcher: as many jobs through bench/throughput.py's dispatcher phase (the real
    Dispatcher, claim batch `--batch`, an executor that finishes at launch), in a process
    of its own, on a database of its own on the same server; its rate over the same span,
    read the same way (throughput.py's wall-clock figure beside it). The ratio is
    workers / dispatcher, of the two spans' rates; the target is at least 0.5.
  * parked backlog: `--backlog` jobs of the task are submitted while no worker has
    registered, so each is parked at submit. Then, on two such databases:
      - in-process: store.worker_register for a worker that reads the task, timed (the
        registration and the unparking of every job it reads are one transaction);
      - one real `corral worker` process: from its registration (its row's started_at) to
        the first poll (every 10 ms, a count on a connection of its own) that finds none
        of the backlog parked; also from the process's start, and until all have run.
    The target: none parked within 2 s of the registration.
JSON on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import api, throughput
from corral import config, python_tasks, runtime, store, timeouts
from corral.clock import SystemClock
from corral.worker.app import App, load_app

TARGET_RATIO = 0.5
"""The target: workers' jobs/s at least this share of the dispatcher's."""
TARGET_UNPARK_S = 2.0
"""The target: a parked backlog out of `parked` within this long of the registration."""
CORRAL = Path(sys.executable).with_name("corral")
"""The venv's `corral` (else `python -m corral`, the same program)."""

APP = '''"""The benchmark's app: one task that does nothing."""

from pydantic import BaseModel

import corral

app = corral.App("bench", version="1.0.0")


class Nothing(BaseModel):
    n: int = 0


@app.task("noop", version=1)
async def noop(payload: Nothing) -> None:
    return None
'''


# --- the app and its workers --------------------------------------------------------------------


@contextmanager
def app_folder() -> Iterator[Path]:
    """A temporary folder holding the app's module (bench_app.py), and the workers' logs."""
    with tempfile.TemporaryDirectory(prefix="corral-bench-workers-") as scratch:
        folder = Path(scratch)
        (folder / "bench_app.py").write_text(APP)
        yield folder


def the_app(folder: Path) -> App:
    """The app, imported in this process (for its reads, as a worker registers them)."""
    sys.path.insert(0, str(folder))
    return load_app("bench_app:app")


class Workers:
    """`corral worker` processes of the app, on one database."""

    def __init__(self, url: str, folder: Path, count: int, concurrency: int) -> None:
        env = {
            **os.environ,
            "CORRAL_DATABASE_URL": url,
            "CORRAL_LOG_LEVEL": "WARNING",
            "PYTHONPATH": str(folder),
        }
        self.logs = [folder / f"worker-{i}.log" for i in range(count)]
        self.procs = []
        for log in self.logs:
            with log.open("ab") as out:
                self.procs.append(
                    subprocess.Popen(
                        [*command(), "worker", "bench_app:app", "--concurrency", str(concurrency)],
                        env=env,
                        stdout=out,
                        stderr=out,
                        cwd=folder,
                    )
                )

    def check(self) -> None:
        """RuntimeError with its log's end if a worker has exited."""
        for proc, log in zip(self.procs, self.logs, strict=True):
            if proc.poll() is not None:
                tail = log.read_text()[-2000:]
                raise RuntimeError(f"a worker exited with {proc.returncode}:\n{tail}")

    def cpu_s(self) -> float:
        return sum(api.cpu_s(p.pid) for p in self.procs)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                api.stop(proc)


def command() -> list[str]:
    return [str(CORRAL)] if CORRAL.exists() else [sys.executable, "-m", "corral"]


def wait_for(
    probe: Callable[[], bool], workers: Workers, what: str, timeout: float, every: float = 0.1
) -> None:
    until = time.monotonic() + timeout
    while not probe():
        workers.check()
        if time.monotonic() > until:
            raise RuntimeError(f"{what}: not after {timeout:.0f} s")
        time.sleep(every)


def scalar(conn: Any, sql: str) -> Any:
    return conn.execute(sql).fetchone()[0]


# --- submitting ----------------------------------------------------------------------------------


async def submit(url: str, count: int) -> None:
    """`count` jobs of the app's task, checked by the client as a submit is, stored by
    Client.submit_many in one transaction. With no worker registered, the version is
    given (the client then takes it as it is) and the jobs park at submit."""
    settings = config.Settings(database_url=url)
    async with runtime.connect(settings, platforms=False) as c:
        one = c.validate(await c.task_checked(c.new_job(task="noop", task_version=1, payload={})))
        jobs = [
            dataclasses.replace(one, payload=python_tasks.envelope("noop", 1, {"n": i}))
            for i in range(count)
        ]
        await c.submit_many(jobs, batch=max(1, count))


def span_rate(url: str) -> dict[str, Any]:
    """Jobs/s over the span from the first attempt made to the last one ended."""
    with throughput.raw_connect(url, autocommit=True) as conn:
        count, first, last, succeeded = conn.execute(
            "SELECT count(*), min(created_at), max(finished_at),"
            " count(*) FILTER (WHERE state = 'succeeded') FROM attempts"
        ).fetchone()
    span = (last - first).total_seconds()
    return {"attempts": count, "succeeded": succeeded, "span_s": span, "jobs_per_s": count / span}


# --- workers against the dispatcher ------------------------------------------------------------


def workers_phase(pg: str, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    db = throughput.Database("postgres", pg)
    try:
        conn = throughput.raw_connect(db.url, autocommit=True)
        workers = Workers(db.url, folder, args.workers, args.concurrency)
        try:
            registered = "SELECT count(*) FROM workers WHERE state = 'running'"
            wait_for(lambda: scalar(conn, registered) == args.workers, workers, "registered", 120)
            asyncio.run(submit(db.url, args.jobs))  # the workers may start on them at once
            cpu0 = workers.cpu_s()
            pending = "SELECT count(*) FROM jobs WHERE state IN ('queued', 'running')"
            wait_for(lambda: scalar(conn, pending) == 0, workers, "all jobs ran", 1200)
            cpu = workers.cpu_s() - cpu0
        finally:
            workers.stop()
        shares = conn.execute(
            "SELECT count(*) FROM events WHERE entity = 'attempt' AND to_state = 'running'"
            " AND reason LIKE 'started by worker %' GROUP BY reason ORDER BY 1 DESC"
        ).fetchall()
        conn.close()
        rate = span_rate(db.url)
    finally:
        db.drop()
    assert rate["succeeded"] == args.jobs, rate
    return {
        **rate,
        "jobs_by_worker": [n for (n,) in shares],
        "workers_cpu_us_per_job": 1e6 * cpu / args.jobs,
    }


def dispatcher_phase(pg: str, args: argparse.Namespace) -> dict[str, Any]:
    db = throughput.Database("postgres", pg)
    try:
        phase = throughput.run_corral_phase(db, args.jobs, args.batch)
        rate = span_rate(db.url)
    finally:
        db.drop()
    return {
        **rate,
        "wall_jobs_per_s": phase["dispatch_complete_jobs_per_s"],
        "dispatcher_cpu_us_per_job": phase["dispatch_cpu_us_per_job"],
    }


# --- the parked backlog --------------------------------------------------------------------------


def parked_db(pg: str, backlog: int) -> throughput.Database:
    """A fresh database with `backlog` jobs of the task parked at submit."""
    db = throughput.Database("postgres", pg)
    asyncio.run(submit(db.url, backlog))
    with throughput.raw_connect(db.url, autocommit=True) as conn:
        parked = scalar(conn, "SELECT count(*) FROM jobs WHERE state = 'parked'")
    assert parked == backlog, f"{parked} of {backlog} parked at submit"
    throughput.analyze(db.url)
    return db


async def register_in_process(url: str, app: App) -> float:
    """store.worker_register for a worker that reads the app's tasks: seconds it took."""
    db = store.Store.connect(url)
    clock = SystemClock()
    now = clock.now()
    worker = python_tasks.Worker(
        id="bench-in-process",
        app=app.name,
        app_version=app.version or "",
        host=socket.gethostname(),
        pid=os.getpid(),
        queues=(),
        concurrency=16,
        state=python_tasks.WorkerState.RUNNING,
        started_at=now,
        last_seen_at=now,
        stopped_at=None,
        reads=tuple(app.reads()),
    )
    since = now - timeouts.Timeouts().lease_timeout
    try:
        t0 = time.perf_counter()
        await db.workers.register(worker=worker, now=now, since=since)
        return time.perf_counter() - t0
    finally:
        await db.close()


def backlog_in_process(pg: str, app: App, backlog: int) -> dict[str, Any]:
    db = parked_db(pg, backlog)
    try:
        seconds = asyncio.run(register_in_process(db.url, app))
        with throughput.raw_connect(db.url, autocommit=True) as conn:
            parked = scalar(conn, "SELECT count(*) FROM jobs WHERE state = 'parked'")
    finally:
        db.drop()
    assert parked == 0, f"{parked} still parked"
    return {"register_s": seconds}


def backlog_worker(pg: str, folder: Path, backlog: int, concurrency: int) -> dict[str, Any]:
    db = parked_db(pg, backlog)
    try:
        conn = throughput.raw_connect(db.url, autocommit=True)
        started = time.monotonic()
        workers = Workers(db.url, folder, 1, concurrency)
        try:
            parked = "SELECT count(*) FROM jobs WHERE state = 'parked'"
            wait_for(lambda: scalar(conn, parked) == 0, workers, "unparked", 120, every=0.01)
            unparked_at, unparked_mono = datetime.now(UTC), time.monotonic()
            done = "SELECT count(*) FROM jobs WHERE state = 'succeeded'"
            wait_for(lambda: scalar(conn, done) == backlog, workers, "all ran", 1200, every=0.05)
            all_ran_at = datetime.now(UTC)
        finally:
            workers.stop()
        registered = scalar(conn, "SELECT started_at FROM workers")
        conn.close()
    finally:
        db.drop()
    return {
        "from_registration_to_none_parked_s": (unparked_at - registered).total_seconds(),
        "from_process_start_to_none_parked_s": unparked_mono - started,
        "from_registration_to_all_ran_s": (all_ran_at - registered).total_seconds(),
    }


# --- main ----------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs each side runs")
    parser.add_argument("--workers", type=int, default=2, help="`corral worker` processes")
    parser.add_argument("--concurrency", type=int, default=16, help="each worker's --concurrency")
    parser.add_argument("--backlog", type=int, default=10_000, help="parked jobs")
    parser.add_argument("--batch", type=int, default=100, help="the dispatcher's claim batch")
    parser.add_argument("--pg-url", default=throughput.DEFAULT_PG)
    args = parser.parse_args()
    report: dict[str, Any] = {
        "jobs": args.jobs,
        "workers": args.workers,
        "concurrency": args.concurrency,
        "claim_batch": args.batch,
        "backlog": args.backlog,
    }
    with app_folder() as folder:
        print("dispatcher ...", file=sys.stderr)
        dispatched = dispatcher_phase(args.pg_url, args)
        print("workers ...", file=sys.stderr)
        worked = workers_phase(args.pg_url, folder, args)
        ratio = worked["jobs_per_s"] / dispatched["jobs_per_s"]
        report["throughput"] = {
            "workers": worked,
            "dispatcher": dispatched,
            "ratio_workers_vs_dispatcher": ratio,
            "meets_target": ratio >= TARGET_RATIO,
        }
        print("parked backlog ...", file=sys.stderr)
        in_process = backlog_in_process(args.pg_url, the_app(folder), args.backlog)
        worker = backlog_worker(args.pg_url, folder, args.backlog, args.concurrency)
        report["parked_backlog"] = {
            "in_process": in_process,
            "worker_process": worker,
            "meets_target": worker["from_registration_to_none_parked_s"] <= TARGET_UNPARK_S,
        }
    report["targets"] = {"ratio_workers_vs_dispatcher": TARGET_RATIO, "unpark_s": TARGET_UNPARK_S}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
