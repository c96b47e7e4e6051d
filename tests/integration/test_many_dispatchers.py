"""Several dispatcher processes on one PostgreSQL never claim the same job."""

from __future__ import annotations

import asyncio
import multiprocessing
from collections import Counter
from pathlib import Path

import pytest

from corral import model, store
from corral.clock import SystemClock
from tests.conftest import pg_empty
from tests.support import dispatch_worker

JOBS, DISPATCHERS = 2000, 4


@pytest.mark.postgres
@pytest.mark.slow
def test_four_dispatcher_processes_run_every_job_exactly_once(pg_url: str, tmp_path: Path) -> None:
    pg_empty(pg_url)
    asyncio.run(_submit(pg_url))
    ctx = multiprocessing.get_context("spawn")
    ledgers = [tmp_path / f"dispatcher-{i}.txt" for i in range(DISPATCHERS)]
    start = ctx.Barrier(DISPATCHERS)  # all import corral first, then all dispatch together
    procs = [
        ctx.Process(target=dispatch_worker.run, args=(pg_url, str(ledger), 50, start))
        for ledger in ledgers
    ]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(timeout=150)
            assert p.exitcode == 0, f"dispatcher process exited {p.exitcode}"
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join()
    launched = [ledger.read_text().split() for ledger in ledgers]
    names = Counter(name for names in launched for name in names)
    assert sum(names.values()) == JOBS, "every job launched once"
    assert max(names.values()) == 1, "no launch name in two dispatchers"
    assert sum(1 for names in launched if names) >= 2, "the work was actually shared"
    counts, attempts = asyncio.run(_tally(pg_url))
    assert counts == {"succeeded": JOBS}
    assert attempts == {1: JOBS}, "every job exactly one attempt"


async def _submit(url: str) -> None:
    db = store.Store.connect(url)
    jobs = [model.NewJob(executor="noop", spec={}) for _ in range(JOBS)]
    await db.jobs.submit(new=jobs, now=SystemClock().now())
    await db.close()


async def _tally(url: str) -> tuple[dict[str, int], dict[int, int]]:
    db = store.Store.connect(url)
    counts = await db.jobs.count_by_state()
    jobs = await db.jobs.list(limit=JOBS + 10)
    await db.close()
    return counts, dict(Counter(j.attempt_count for j in jobs))
