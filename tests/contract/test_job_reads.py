"""The job list and a job's page on both databases: on PostgreSQL they are read on the reads'
own connections (store/hotreads.py), on SQLite through SQLAlchemy (store/jobs.py); each
filter, keyset paging and a page's attempts, events and run logs read the same either way,
and as the filters say."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import pytest

from corral import errors, launching, model, scheduling, store
from corral.store import (
    Finish,
    attempts,
    events,
    hotpool,
    hotreads,
    job_lists,
    jobs,
    runlogs,
    tables,
)
from corral.testing import FrozenClock

A, J = model.AttemptState, model.JobState

LOG = launching.RunLog(
    streams=(
        launching.Stream("request", "POST https://example.com/hook\n", 30),
        launching.Stream("response", "HTTP 200 OK\n\nthanks é", 22, cut=True),
    ),
    latency=0.035,
    status=200,
    address="93.184.216.34",
)


def test_the_reads_name_their_columns_in_the_order_of_the_model() -> None:
    assert [c.name for c in tables.jobs.c] == list(model.Job.__dataclass_fields__)
    # Who sent a blind attempt is recovery's, kept in the store (store/loops.py), last.
    assert [c.name for c in tables.attempts.c] == [*model.Attempt.__dataclass_fields__, "sent_by"]
    assert [c.name for c in tables.events.c] == list(model.Event.__dataclass_fields__)


async def _jobs(db: store.Store, clock: FrozenClock) -> None:
    """30 jobs, a second apart, across queues, tenants, pools, executors, labels and a
    schedule; some claimed (running), some cancelled, some to run later (scheduled)."""
    for i in range(30):
        firing = {scheduling.FIRING: {"schedule": "nightly"}} if i % 6 == 0 else {"n": i}
        later = clock.now() + timedelta(hours=1) if i % 7 == 3 else None
        new = model.NewJob(
            executor="noop" if i % 3 else "other",
            spec={"command": ["true"], "env": {"API_TOKEN": "s3cret"}},
            payload=firing,
            queue=f"q{i % 3}",
            tenant=f"t{i % 2}",
            pool="p" if i % 4 == 0 else None,
            labels={"team": f"team-{i % 3}", **({"release": "r1"} if i % 5 == 0 else {})},
            run_at=later,
        )
        await db.jobs.submit(new=[new], now=clock.now())
        clock.advance(1)
    await db.jobs.claim(now=clock.now(), limit=5, executors=["noop"])
    for job_id in (2, 8, 15):
        await db.jobs.cancel(job_id=job_id, now=clock.now(), reason="by a test")


def _sqlalchemy(db: store.Store, *, limit: int = 100, **given: Any) -> list[model.Job]:
    """The job list as store/jobs.py reads it, whatever the database."""
    with db.database.engine.connect() as conn:
        return job_lists.job_list(conn, model.JobFilter(**given), limit=limit)


FILTERS: list[tuple[dict[str, Any], Callable[[model.Job], bool]]] = [
    ({}, lambda j: True),
    ({"states": ["queued"]}, lambda j: j.state == J.QUEUED),
    ({"states": ["running", "cancelled"]}, lambda j: j.state in (J.RUNNING, J.CANCELLED)),
    (
        {"states": ["scheduled"], "queue": "q0"},
        lambda j: j.state == J.SCHEDULED and j.queue == "q0",
    ),
    ({"queue": "q1"}, lambda j: j.queue == "q1"),
    ({"tenant": "t1"}, lambda j: j.tenant == "t1"),
    ({"pool": "p"}, lambda j: j.pool == "p"),
    ({"executor": "other"}, lambda j: j.executor == "other"),
    ({"labels": {"team": "team-2"}}, lambda j: j.labels.get("team") == "team-2"),
    (
        {"labels": {"team": "team-0", "release": "r1"}},
        lambda j: j.labels.get("team") == "team-0" and j.labels.get("release") == "r1",
    ),
    ({"labels": {"release": "r2"}}, lambda j: False),
    ({"schedule": "nightly"}, lambda j: j.id % 6 == 1),  # the jobs of i % 6 == 0
    (
        {"states": ["queued"], "tenant": "t0", "queue": "q2"},
        lambda j: j.state == J.QUEUED and j.tenant == "t0" and j.queue == "q2",
    ),
]


@pytest.mark.parametrize(("given", "matches"), FILTERS)
async def test_each_filter_of_the_job_list_reads_its_jobs_newest_first(
    db: store.Store,
    clock: FrozenClock,
    given: dict[str, Any],
    matches: Callable[[model.Job], bool],
) -> None:
    start = clock.now()
    await _jobs(db, clock)
    every = _sqlalchemy(db, limit=1000)
    assert [j.id for j in every] == list(range(30, 0, -1))
    expected = [j for j in every if matches(j)]
    assert await db.jobs.list(model.JobFilter(**given)) == expected == _sqlalchemy(db, **given)
    assert await db.jobs.list(model.JobFilter(**given), limit=2) == expected[:2]
    since, until = start + timedelta(seconds=5), start + timedelta(seconds=20)
    timed = [j for j in expected if since <= j.created_at < until]
    assert await db.jobs.list(model.JobFilter(**given, since=since, until=until)) == timed
    assert await db.jobs.list(model.JobFilter(**given, since=since)) == [
        j for j in expected if j.created_at >= since
    ]
    assert await db.jobs.list(model.JobFilter(**given, until=until)) == [
        j for j in expected if j.created_at < until
    ]


async def test_keyset_paging_reads_every_job_once_in_order(
    db: store.Store, clock: FrozenClock
) -> None:
    await _jobs(db, clock)
    for given in ({}, {"states": ["queued"]}, {"labels": {"team": "team-1"}}, {"tenant": "t0"}):
        pages, before = [], None
        while True:
            page = await db.jobs.list(model.JobFilter(**given), limit=4, before=before)
            pages.append(page)
            if len(page) < 4:
                break
            before = page[-1].id
        read = [j for page in pages for j in page]
        assert read == _sqlalchemy(db, **given, limit=1000)
        assert len({j.id for j in read}) == len(read)


async def test_a_job_s_page_reads_its_attempts_events_and_run_logs(
    db: store.Store, clock: FrozenClock
) -> None:
    await db.jobs.submit(
        new=[model.NewJob(executor="noop", spec={"url": "https://x"}, max_attempts=3)],
        now=clock.now(),
    )
    [first] = await db.jobs.claim(now=clock.now(), limit=1, executors=["noop"])
    out = launching.RunLog(streams=(launching.Stream("stderr", "boom\n", 5),), latency=1.5)
    failed = Finish(first.attempt.id, A.FAILED, 1, "exited with code 1", output=out)
    await db.attempts.finish(finishes=[failed], now=clock.now())
    clock.advance(3600)
    [second] = await db.jobs.claim(now=clock.now(), limit=1, executors=["noop"])
    won = Finish(second.attempt.id, A.SUCCEEDED, None, "HTTP 200 OK", output=LOG)
    await db.attempts.settle(launched=[], finishes=[won], now=clock.now())

    job, tried, happened, logs = await db.jobs.record(job_id=first.job.id)
    with db.database.engine.connect() as conn:
        assert job == jobs.job_get(conn, job_id=first.job.id)
        assert tried == attempts.attempt_list(conn, job_id=first.job.id)
        assert happened == events.event_list(conn, job_id=first.job.id)
        assert logs == runlogs.run_logs_of(conn, job_id=first.job.id)
    assert job.state == J.SUCCEEDED
    assert [(a.attempt_no, a.state) for a in tried] == [(1, A.FAILED), (2, A.SUCCEEDED)]
    assert tried[0].failure_class is not None
    assert len(happened) >= 6
    assert all(isinstance(e.details, dict) for e in happened)
    assert list(logs) == [first.attempt.id, second.attempt.id]
    assert logs[second.attempt.id].streams == LOG.streams
    assert logs[second.attempt.id].recorded_at == clock.now()


PAYLOADS = [
    {"big": 2**70, "small": -(2**65), "edge": 2**63 - 1, "u64": 2**64 - 1},
    {"f": 0.1, "tiny": 5e-324, "whole": 2.0},
    {"s": 'é ✓ \u2028 \\ "', "nested": [[1, [2, {"a": None}]], True, False]},
    [1, 2, 3],
    "text",
    None,
]


async def test_json_is_read_as_the_json_module_reads_it(
    db: store.Store, clock: FrozenClock
) -> None:
    # PostgreSQL keeps numbers as numeric: 1e300 comes back as its 301 digits, -0.0 as 0.
    kept_as_numeric = {"e": 1e300, "neg": -0.0}
    new = [model.NewJob(executor="noop", spec={}, payload=p) for p in [*PAYLOADS, kept_as_numeric]]
    await db.jobs.submit(new=new, now=clock.now())
    read = await db.jobs.list()
    assert read == _sqlalchemy(db)
    assert [j.payload for j in reversed(read[1:])] == PAYLOADS
    assert type(read[-1].payload["big"]) is int


@pytest.mark.parametrize(
    "text",
    ['{"n": 12345678901234567890123}', "[NaN, Infinity]", '"\\ud800"', "1e400", '{"a": 1.5}'],
)
def test_a_json_text_is_parsed_as_the_json_module_parses_it(text: str) -> None:
    assert repr(hotreads._parsed(text)) == repr(json.loads(text))


async def test_a_page_of_no_job_is_not_found(db: store.Store) -> None:
    with pytest.raises(errors.NotFound, match="no job with id 404"):
        await db.jobs.record(job_id=404)


@pytest.fixture
async def pg(pg_url: str) -> AsyncIterator[store.Store]:
    from tests.conftest import pg_empty

    pg_empty(pg_url)
    s = store.Store.connect(pg_url)
    yield s
    await s.close()


@pytest.mark.postgres
async def test_the_reads_connections_are_as_many_as_their_limit_however_many_ask(
    pg: store.Store, clock: FrozenClock
) -> None:
    db = pg
    assert db.database.read_pool is not None
    await _jobs(db, clock)
    busy = 0
    most = 0

    async def slow(conn: Any) -> int:
        nonlocal busy, most
        busy += 1
        most = max(most, busy)
        await conn.execute("SELECT pg_sleep(0.05)")
        busy -= 1
        return int(conn.info.backend_pid)

    pids = await asyncio.gather(*(db.database.read_pool.run(slow) for _ in range(40)))
    assert most == store.database.READS_AT_ONCE
    assert len(set(pids)) == store.database.READS_AT_ONCE  # kept idle between turns, never reopened
    lists = await asyncio.gather(
        *(db.jobs.list(model.JobFilter(states=["queued"])) for _ in range(40))
    )
    assert all(found == lists[0] for found in lists)


@pytest.mark.postgres
async def test_a_call_that_waits_past_its_time_for_a_turn_is_given_up(pg_url: str) -> None:
    s = store.Store.connect(pg_url)
    assert s.database.read_pool is not None
    params = s.database.read_pool.params
    await s.close()
    pool = hotpool.HotPool(params, idle=1, most=1)
    release = asyncio.Event()

    async def holds(conn: Any) -> None:
        await release.wait()

    held = asyncio.ensure_future(pool.run(holds))
    await asyncio.sleep(0.05)
    with pytest.raises(hotpool.GivenUp):
        await pool.run(holds, within=0.1)
    release.set()
    await held
    assert await pool.run(lambda conn: asyncio.sleep(0, result=1)) == 1
    await pool.close()
