"""Three `corral scheduler` processes on PostgreSQL, SIGKILLed at random moments and
started again: every nominal time of every schedule in the window fires exactly once, with
its lateness recorded. No leader: the firings' unique key is the fence."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from corral import client, config, scheduler, scheduling, store
from corral.clock import SystemClock
from tests.support.crash import Site, seeded, stop
from tests.support.noop import NoopExecutor

SCHEDULES = 20
KILLS = 10


async def _make(url: str) -> datetime:
    db = store.Store.connect(url)
    clock = SystemClock()
    c = client.Client(
        store=db, executors={"process": NoopExecutor()}, settings=config.Settings(), clock=clock
    )
    for n in range(SCHEDULES):
        # Catch-up all: a pass the machine delayed past the next second fires both times.
        await c.schedule_create(
            f"s{n}", every="1s", catchup="all", spec={"command": ["true"]}, executor="process"
        )
    await db.close()
    return clock.now()


async def _read(
    url: str,
) -> tuple[list[scheduling.Schedule], dict[int, list[scheduling.Firing]], int]:
    db = store.Store.connect(url)
    found = await db.schedules.list()
    fired = {s.id: await db.schedules.firings(schedule_id=s.id, limit=100_000) for s in found}
    jobs = len(await db.jobs.list(limit=1_000_000))
    await db.close()
    return found, fired, jobs


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.timeout(300)
def test_three_schedulers_killed_at_random_fire_each_nominal_time_once(
    tmp_path: Path, pg_url: str
) -> None:
    from tests.conftest import pg_empty

    pg_empty(pg_url)
    rnd = seeded()
    site = Site(tmp_path, pg_url)
    made_at = asyncio.run(_make(pg_url))
    procs: list[subprocess.Popen[str]] = [site.start("scheduler") for _ in range(3)]
    for _ in range(KILLS):
        time.sleep(rnd.uniform(0.3, 2.0))
        victim = rnd.randrange(len(procs))
        procs[victim].kill()  # SIGKILL: mid-transaction, mid-sleep, mid-start
        procs[victim].wait()
        procs[victim] = site.start("scheduler")
    time.sleep(3)  # the last one started fires too
    stopped_at = SystemClock().now()
    for p in procs:
        stop(p)
    schedules, fired, jobs = asyncio.run(_read(pg_url))
    assert len(schedules) == SCHEDULES
    total = 0
    for s in schedules:
        rows = fired[s.id]
        counts = Counter(f.nominal_at for f in rows)
        assert max(counts.values()) == 1
        times = sorted(counts)
        # Every nominal time from the first to the last, one second apart: none skipped.
        assert times[0] <= made_at + timedelta(seconds=2)
        assert times[-1] >= stopped_at - timedelta(seconds=5), (times[-1], stopped_at)
        expected = [times[0] + timedelta(seconds=k) for k in range(len(times))]
        assert times == expected, "a nominal time in the window was never recorded"
        assert {f.outcome for f in rows} == {scheduling.FiringOutcome.FIRED}, Counter(
            f.outcome for f in rows
        )
        # Recorded, each with its lateness: negative when fired ahead (scheduler.AHEAD).
        ahead = -scheduler.AHEAD.total_seconds()
        assert all(f.job_id is not None and f.lateness_seconds >= ahead for f in rows)
        assert len({f.job_id for f in rows}) == len(rows)
        total += len(rows)
    assert jobs == total, "a job without its firing, or a firing with two jobs"
    print(f"scheduler chaos: {total} firings of {SCHEDULES} schedules, {KILLS} kills")
