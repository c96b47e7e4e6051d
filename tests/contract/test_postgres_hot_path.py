"""The hot path on PostgreSQL: a tick is two statements, each its own transaction, and a
connection that broke in the pool is replaced without the caller seeing it."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine, event, text

from corral import config, dispatcher, errors, model, python_tasks, store
from corral.store import hotpool, tables
from corral.store.postgres import claim, settle
from corral.testing import FrozenClock
from tests.support.noop import NoopExecutor

J, A = model.JobState, model.AttemptState


@pytest.fixture
def pg(pg_url: str) -> Iterator[store.Store]:
    from tests.conftest import pg_empty

    pg_empty(pg_url)
    s = store.Store.connect(pg_url)
    yield s
    asyncio.run(s.close())


def test_the_claim_reads_jobs_in_the_order_of_the_model() -> None:
    assert [c.name for c in tables.jobs.c] == list(model.Job.__dataclass_fields__)


class Statements:
    """Every statement sent on the store's connections, the hot path's own included, with
    BEGIN where the driver sends one first (psycopg does, unless in autocommit)."""

    def __init__(self, db: store.Store, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sent: list[str] = []
        event.listen(db.database.engine, "before_cursor_execute", self._statement)
        execute = psycopg.AsyncCursor.execute

        async def sent(cursor: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            self._sent(cursor.connection, str(query))
            return await execute(cursor, query, *args, **kwargs)

        monkeypatch.setattr(psycopg.AsyncCursor, "execute", sent)

    def _statement(self, conn: Any, cursor: Any, sql: str, *args: Any) -> None:
        self._sent(conn.connection.dbapi_connection, sql)

    def _sent(self, raw: Any, sql: str) -> None:
        if not raw.autocommit and raw.info.transaction_status == 0:  # idle: BEGIN goes first
            self.sent.append("BEGIN")
        self.sent.append(sql.split(None, 1)[0])


@pytest.mark.postgres
async def test_a_tick_whose_launches_all_succeed_is_two_statements(
    pg: store.Store, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    await pg.jobs.submit(
        new=[model.NewJob(executor="noop", spec={}) for _ in range(50)], now=clock.now()
    )
    d = dispatcher.Dispatcher(
        store=pg,
        executors={"noop": NoopExecutor()},
        clock=clock,
        settings=config.Settings(claim_batch_limit=50),
    )
    seen = Statements(pg, monkeypatch)
    tick = await d.run_once()
    assert tick.claimed == 50
    assert seen.sent == ["WITH", "WITH"], seen.sent  # the claim and the settle, nothing else
    jobs = await pg.jobs.list(model.JobFilter(states=[J.RUNNING]))
    assert len(jobs) == 50  # (run_once alone reads no completions: run() does)
    attempts = [a for j in jobs for a in await pg.attempts.list(job_id=j.id)]
    assert {a.state for a in attempts} == {A.RUNNING}


@pytest.mark.postgres
async def test_the_settle_applies_successes_and_records_the_rest_in_one_statement(
    pg: store.Store, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    await pg.jobs.submit(
        new=[model.NewJob(executor="noop", spec={}) for _ in range(4)], now=clock.now()
    )
    a, b, c, d = await pg.jobs.claim(now=clock.now(), limit=4, executors=["noop"])
    await pg.jobs.cancel(job_id=d.job.id, now=clock.now(), reason="test")
    seen = Statements(pg, monkeypatch)
    ran, outcomes = await pg.attempts.settle(
        launched=[a.attempt.id, b.attempt.id, c.attempt.id, d.attempt.id],
        finishes=[
            store.Finish(b.attempt.id, A.SUCCEEDED, 0, None),
            store.Finish(c.attempt.id, A.SUCCEEDED, None, "done by hand"),
            store.Finish(d.attempt.id, A.SUCCEEDED, 0, None),  # cancelled: a no-op
        ],
        now=clock.now(),
    )
    assert seen.sent == ["WITH"]
    assert ran == [a.attempt.id]
    assert {(o.job_id, o.fence, o.job_state) for o in outcomes} == {
        (b.job.id, b.attempt.id, J.SUCCEEDED),
        (c.job.id, c.attempt.id, J.SUCCEEDED),
    }
    # The run log replays: each change once, the attempt's before its job's.
    events = [
        (e.entity, e.from_state, e.to_state, e.reason)
        for e in await pg.events.list(job_id=c.job.id)
    ]
    assert events[-2:] == [
        ("attempt", "launching", "succeeded", "done by hand"),
        ("job", "running", "succeeded", "attempt 1 succeeded"),
    ]
    events = [(e.entity, e.to_state, e.reason) for e in await pg.events.list(job_id=b.job.id)]
    assert events[-2:] == [
        ("attempt", "succeeded", "exit 0"),
        ("job", "succeeded", "attempt 1 succeeded"),
    ]
    assert [e.to_state for e in await pg.events.list(job_id=d.job.id)][-1] == "cancelled"
    # Applied once: the same settle again changes nothing.
    ran, outcomes = await pg.attempts.settle(
        launched=[a.attempt.id],
        finishes=[store.Finish(b.attempt.id, A.SUCCEEDED, 0, None)],
        now=clock.now(),
    )
    assert (ran, outcomes) == ([], [])


def _task_job(task: str, version: int, queue: str = "default") -> model.NewJob:
    return model.NewJob(
        executor=python_tasks.PYTHON,
        spec={"task": task, "version": version},
        payload=python_tasks.envelope(task, version, {}),
        queue=queue,
        policy={"heartbeat": True},
    )


async def _worker_claim(
    db: store.Store, clock: FrozenClock, general: bool, **kwargs: Any
) -> list[model.Claimed]:
    """A worker's claim, through the general path (a pool cap sends it there) or not."""
    return await db.workers.claim(
        worker_id="w1",
        now=clock.now(),
        limits=store.DefaultLimits(timedelta(seconds=240), timedelta(seconds=60)),
        pools={"elsewhere": 5} if general else None,
        **{"reads": [("send", [1, 2])], "queues": (), "limit": 10, **kwargs},
    )


@pytest.mark.parametrize("general", [False, True], ids=["hot", "general"])
async def test_a_workers_claim_takes_what_it_reads_and_records_it_running(
    db: store.Store, clock: FrozenClock, general: bool
) -> None:
    """On PostgreSQL the hot path's one statement, elsewhere (or with pools) the general
    path: the same jobs taken (the worker's tasks, versions and queues), the same attempt,
    the same run log."""
    await db.jobs.submit(
        new=[
            _task_job("send", 1),
            _task_job("send", 3),  # a version it does not read
            _task_job("other", 1),  # a task it does not read
            _task_job("send", 2, queue="slow"),  # a queue it does not take
            model.NewJob(executor="noop", spec={}),
        ],
        now=clock.now(),
    )
    [claimed] = await _worker_claim(db, clock, general, queues=("default", "fast"))
    assert python_tasks.task_of(claimed.job.spec) == ("send", 1)
    a = claimed.attempt
    assert (a.state, a.started_at, a.last_seen_at) == (A.RUNNING, clock.now(), clock.now())
    assert a.lease_until == clock.now() + timedelta(seconds=60)
    assert [a] == await db.attempts.list(job_id=claimed.job.id)
    events = [
        (e.entity, e.from_state, e.to_state, e.reason)
        for e in await db.events.list(job_id=claimed.job.id)
    ]
    assert events[-2:] == [
        ("job", "queued", "running", "claimed: attempt 1 launching"),
        ("attempt", "launching", "running", "started by worker w1"),
    ]
    [slow] = await _worker_claim(db, clock, general)  # every queue
    assert slow.job.queue == "slow"
    assert await _worker_claim(db, clock, general) == []


@pytest.mark.postgres
async def test_a_workers_claim_is_one_statement(
    pg: store.Store, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    await pg.jobs.submit(new=[_task_job("send", 1) for _ in range(5)], now=clock.now())
    seen = Statements(pg, monkeypatch)
    assert len(await _worker_claim(pg, clock, general=False, limit=3)) == 3
    assert seen.sent == ["WITH"]


@pytest.mark.postgres
async def test_a_connection_broken_in_the_pool_is_replaced_once(
    pg: store.Store, pg_url: str, clock: FrozenClock
) -> None:
    await pg.jobs.submit(new=[model.NewJob(executor="noop", spec={})], now=clock.now())
    pids = {
        await pg.database.tx(lambda conn: conn.exec_driver_sql("SELECT pg_backend_pid()").scalar())
    }
    assert pg.database.hot_pool is not None
    pids.add(await pg.database.hot_pool.run(_backend_pid))
    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:  # the server ends the pooled connection's session
        conn.execute(
            text("SELECT pg_terminate_backend(pid) FROM unnest(:p) AS pid"), {"p": list(pids)}
        )
    admin.dispose()
    [claimed] = await pg.jobs.claim(now=clock.now(), limit=1, executors=["noop"])
    assert claimed.attempt.launch_name == model.launch_name(claimed.job.id, 1)
    ran, _ = await pg.attempts.settle(launched=[claimed.attempt.id], finishes=[], now=clock.now())
    assert ran == [claimed.attempt.id]


async def _backend_pid(conn: psycopg.AsyncConnection[Any]) -> int:
    row = await (await conn.execute("SELECT pg_backend_pid()")).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.postgres
async def test_a_server_that_is_gone_is_unavailable_not_retried_for_good(
    pg: store.Store, pg_url: str, clock: FrozenClock
) -> None:
    """Both tries on a broken connection: StoreUnavailable, and the next call, with the
    server back, works on a fresh connection."""
    assert pg.database.hot_pool is not None
    first = await pg.database.hot_pool.run(_backend_pid)
    real = pg.database.hot_pool.params
    pg.database.hot_pool.params = {
        **real,
        "port": 1,
    }  # nothing listens there: a new connection fails
    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": first})
    admin.dispose()
    with pytest.raises(errors.StoreUnavailable, match="cannot be reached"):
        await pg.jobs.claim(now=clock.now(), limit=1, executors=["noop"])
    pg.database.hot_pool.params = real
    assert await pg.jobs.claim(now=clock.now(), limit=1, executors=["noop"]) == []


def test_the_hot_path_statements_name_states_as_the_partial_indexes_do() -> None:
    assert "state = 'queued'" in claim.CLAIM
    assert "%(state" not in claim.CLAIM + settle.SETTLE


async def test_a_job_on_a_lease_has_all_of_it_from_its_record(
    db: store.Store, clock: FrozenClock
) -> None:
    """Both databases' hot path: the lease set at the claim restarts when `running` is
    written, so the time an attempt waited to launch does not count against it."""
    heartbeat = {"heartbeat": True, "limits": {"lease_timeout": 30}}
    await db.jobs.submit(
        new=[
            model.NewJob(executor="noop", spec={}, policy=heartbeat),
            model.NewJob(executor="noop", spec={}),
        ],
        now=clock.now(),
    )
    limits = store.DefaultLimits(timedelta(seconds=240), timedelta(seconds=60))
    leased, plain = await db.jobs.claim(now=clock.now(), limit=2, executors=["noop"], limits=limits)
    assert leased.attempt.lease_until == clock.now() + timedelta(seconds=30)
    assert plain.attempt.lease_until is None
    assert plain.attempt.deadline_at == clock.now() + timedelta(seconds=240)
    clock.advance(20)
    ran, _ = await db.attempts.settle(
        launched=[leased.attempt.id, plain.attempt.id], finishes=[], now=clock.now()
    )
    assert sorted(ran) == sorted([leased.attempt.id, plain.attempt.id])
    [a] = await db.attempts.list(job_id=leased.job.id)
    assert a.lease_until == clock.now() + timedelta(seconds=30)
    [b] = await db.attempts.list(job_id=plain.job.id)
    assert b.lease_until is None


_PARAMETER_TYPES = {
    "CLAIM": {
        "now": "timestamptz",
        "executors": "text[]",
        "limit": "int",
        "limited": "bool",
        "deadline": "float8",
        "lease": "float8",
        "came": "text",
        "weight": "float8",
        "named": "text[]",
        "weights": "float8[]",
    },
    "WORKER_CLAIM": {
        "now": "timestamptz",
        "executors": "text[]",
        "reads": "text[]",
        "queues": "text[]",
        "limit": "int",
        "limited": "bool",
        "deadline": "float8",
        "lease": "float8",
        "ran_reason": "text",
        "came": "text",
        "weight": "float8",
        "named": "text[]",
        "weights": "float8[]",
    },
    "SETTLE": {
        "now": "timestamptz",
        "fences": "bigint[]",
        "wins": "bool[]",
        "codes": "int[]",
        "reasons": "text[]",
        "ran_reason": "text",
        "logs": "jsonb",
    },
}


_STATEMENTS = {
    "CLAIM": claim.CLAIM,
    "WORKER_CLAIM": claim.WORKER_CLAIM,
    "SETTLE": settle.SETTLE,
}


@pytest.mark.postgres
@pytest.mark.parametrize("name", sorted(_PARAMETER_TYPES))
def test_the_hot_statements_find_rows_by_key_even_planned_on_a_fresh_database(
    pg: store.Store, name: str
) -> None:
    """A prepared statement's generic plan is made once, from the statistics of the moment.
    Made on a database of a few rows, a plan that scans a table stays for as long as the
    connection lives, and costs more with every row the table gains (the settle went from
    5 ms to 24 ms over 20,000 jobs that way). On the hot engine's connections no plan of
    either statement scans a table, whatever the statistics say."""
    types = _PARAMETER_TYPES[name]
    order = list(types)
    sql = re.sub(r"%\((\w+)\)s", lambda m: f"${order.index(m.group(1)) + 1}", _STATEMENTS[name])
    assert pg.database.hot_pool is not None
    with psycopg.connect(
        **pg.database.hot_pool.params, autocommit=True
    ) as conn:  # as the hot path's
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute(f"PREPARE hot({', '.join(types.values())}) AS {sql}")
        nulls = ", ".join(f"NULL::{t}" for t in types.values())
        plan = "\n".join(r[0] for r in conn.execute(f"EXPLAIN EXECUTE hot({nulls})"))
    assert "Index" in plan
    assert "Seq Scan" not in plan, plan


@pytest.mark.postgres
async def test_a_success_applies_when_another_writer_moved_the_attempt_while_it_waited(
    pg: store.Store, pg_url: str, clock: FrozenClock
) -> None:
    """The settle's snapshot is taken before it waits for a row's lock: a writer that
    commits meanwhile (recovery adopting the attempt: launching to running) changes the row
    under it. The success is applied all the same, from the state the lock found."""
    await pg.jobs.submit(new=[model.NewJob(executor="noop", spec={})], now=clock.now())
    [c] = await pg.jobs.claim(now=clock.now(), limit=1, executors=["noop"])
    other = psycopg.connect(pg_url.replace("+psycopg", ""))
    other.execute(
        "UPDATE attempts SET state = 'running', started_at = now() WHERE id = %s",
        (c.attempt.id,),
    )  # holds the row's lock until it commits
    settle = asyncio.create_task(
        pg.attempts.settle(
            launched=[],
            finishes=[store.Finish(c.attempt.id, A.SUCCEEDED, 0, None)],
            now=clock.now(),
        )
    )
    waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
    async with asyncio.timeout(60):
        while other.execute(waiting).fetchone() == (0,):
            await asyncio.sleep(0.05)
    other.commit()
    other.close()
    ran, outcomes = await settle
    assert (ran, [(o.fence, o.job_state) for o in outcomes]) == ([], [(c.attempt.id, J.SUCCEEDED)])
    events = [(e.entity, e.from_state, e.to_state) for e in await pg.events.list(job_id=c.job.id)]
    assert events[-2:] == [("attempt", "running", "succeeded"), ("job", "running", "succeeded")]


@pytest.mark.postgres
async def test_one_broken_connection_drops_the_idle_ones_too(
    pg: store.Store, pg_url: str, clock: FrozenClock
) -> None:
    """What broke one idle connection (a restart, a failover) broke them all: the retry
    opens a new one rather than taking the next dead one, so one call sees it, none fail."""
    assert pg.database.hot_pool is not None
    pool = pg.database.hot_pool
    held = [await pool._connect() for _ in range(3)]
    pids = [conn.info.backend_pid for conn in held]
    for conn in held:
        pool._give_back(conn)
    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text("SELECT pg_terminate_backend(pid) FROM unnest(:p) AS pid"), {"p": pids})
    admin.dispose()
    assert await pg.jobs.claim(now=clock.now(), limit=1, executors=["noop"]) == []
    assert pool._idle
    assert all(c.info.backend_pid not in pids for c in pool._idle)


@pytest.mark.postgres
async def test_a_call_given_up_ends_at_its_time_not_seconds_after(pg: store.Store) -> None:
    """A statement that outlives the call's time: the call ends when the time is up, its
    connection closed under it (with a cancel request, psycopg would wait on the server)."""
    assert pg.database.hot_pool is not None

    async def slow(conn: psycopg.AsyncConnection[Any]) -> None:
        await conn.execute("SELECT pg_sleep(30)")

    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(hotpool.GivenUp):
        await pg.database.hot_pool.run(slow, within=0.5)
    assert loop.time() - began < 10.0  # not the 30s of its statement
    assert await pg.database.hot_pool.run(_backend_pid) > 0  # and the pool works on


@pytest.mark.postgres
async def test_a_closed_store_refuses_hot_calls(pg_url: str, clock: FrozenClock) -> None:
    """After close, a hot-path call fails at once rather than opening a connection that
    nothing would close."""
    db = store.Store.connect(pg_url)
    assert await db.jobs.claim(now=clock.now(), limit=1, executors=["noop"]) == []
    await db.close()
    with pytest.raises(RuntimeError, match="closed"):
        await db.jobs.claim(now=clock.now(), limit=1, executors=["noop"])
