"""The store's contract, run against a real SQLite file and the real PostgreSQL server."""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, event

from corral import access, errors, model, policy, retry, store
from corral.store import Finish, migrate
from corral.store.indexes import compared_on
from corral.store.indexes import metadata as schema
from corral.testing import FrozenClock
from tests.support.jobs import submit

J, A, FC = model.JobState, model.AttemptState, model.FailureClass


def new(**kw: object) -> model.NewJob:
    return model.NewJob(executor=str(kw.pop("executor", "noop")), spec={}, **kw)  # type: ignore[arg-type]


async def claim(db: store.Store, clock: FrozenClock, limit: int = 100) -> list[model.Claimed]:
    return await db.jobs.claim(now=clock.now(), limit=limit, executors=["noop"])


async def test_submit_stores_queued_jobs_with_a_submitted_event(
    db: store.Store, clock: FrozenClock
) -> None:
    [job_id] = await submit(
        db, clock, new(payload={"x": 1}, labels={"team": "data"}, queue="q", priority=5)
    )
    job = await db.jobs.get(job_id=job_id)
    assert (job.state, job.queue, job.priority, job.payload, job.labels) == (
        J.QUEUED,
        "q",
        5,
        {"x": 1},
        {"team": "data"},
    )
    assert job.run_at == clock.now()
    [event] = await db.events.list(job_id=job_id)
    assert (event.entity, event.from_state, event.to_state, event.reason) == (
        "job",
        None,
        "queued",
        "submitted",
    )


async def test_idempotency_key_returns_the_existing_job_per_tenant(
    db: store.Store, clock: FrozenClock
) -> None:
    first = await db.jobs.submit(new=[new(idempotency_key="k1")], now=clock.now())
    again = await db.jobs.submit(
        new=[new(idempotency_key="k1"), new(idempotency_key="k1")], now=clock.now()
    )
    other_tenant = await db.jobs.submit(
        new=[new(idempotency_key="k1", tenant="t2")], now=clock.now()
    )
    assert first[0][1] is True
    assert again == [(first[0][0], False), (first[0][0], False)]
    assert other_tenant[0][0] != first[0][0]
    assert other_tenant[0][1] is True
    assert len(await db.events.list(job_id=first[0][0])) == 1


async def test_claim_takes_due_jobs_by_priority_then_run_at(
    db: store.Store, clock: FrozenClock
) -> None:
    later = clock.now() - timedelta(seconds=1)
    earlier = clock.now() - timedelta(seconds=10)
    ids = await submit(
        db,
        clock,
        new(priority=0, run_at=earlier),
        new(priority=5, run_at=later),
        new(priority=0, run_at=later),
        new(priority=9, run_at=clock.now() + timedelta(seconds=60)),  # not due
        new(executor="other"),  # not an executor this dispatcher runs
    )
    claimed = await claim(db, clock, limit=2)
    assert [c.job.id for c in claimed] == [ids[1], ids[0]]
    assert [c.job.id for c in await claim(db, clock)] == [ids[2]]
    assert await claim(db, clock) == []
    assert (await db.jobs.get(job_id=ids[3])).state == "scheduled"
    clock.advance(61)
    assert [c.job.id for c in await claim(db, clock)] == [ids[3]]  # its time came


async def test_claim_creates_launching_attempts_with_growing_fences(
    db: store.Store, clock: FrozenClock
) -> None:
    ids = await submit(db, clock, new(), new(), new())
    claimed = await claim(db, clock)
    fences = [c.attempt.id for c in claimed]
    assert fences == sorted(fences)
    assert len(set(fences)) == 3
    for c in claimed:
        assert c.job.state == J.RUNNING
        assert c.job.attempt_count == 1
        assert c.attempt.state == A.LAUNCHING
        assert c.attempt.launch_name == model.launch_name(c.job.id, 1)
    events = await db.events.list(job_id=ids[0])
    assert [(e.from_state, e.to_state, e.attempt_id) for e in events][-1] == (
        "queued",
        "running",
        fences[0],
    )


async def test_each_claimed_attempt_gets_the_limits_of_its_own_policy(
    db: store.Store, clock: FrozenClock
) -> None:
    """One claim of jobs with different policies, some the same: each attempt's deadline
    and lease are its own job's (the default limits where its policy sets none)."""
    short = {"limits": {"attempt_deadline": 20.0}}  # as a submit stores them: seconds
    leased = {"heartbeat": True, "limits": {"attempt_deadline": 40.0, "lease_timeout": 7.0}}
    ids = await submit(db, clock, new(policy=short), new(), new(policy=leased), new(policy=short))
    defaults = store.DefaultLimits(timedelta(hours=1), timedelta(minutes=5))
    claimed = await db.jobs.claim(now=clock.now(), limit=10, executors=["noop"], limits=defaults)
    got = {c.job.id: c.attempt for c in claimed}
    now = clock.now()
    assert [(got[i].deadline_at, got[i].lease_until, got[i].lease_seconds) for i in ids] == [
        (now + timedelta(seconds=20), None, None),
        (now + timedelta(hours=1), None, None),
        (now + timedelta(seconds=40), now + timedelta(seconds=7), 7.0),
        (now + timedelta(seconds=20), None, None),
    ]
    stored = {a.id: a for i in ids for a in await db.attempts.list(job_id=i)}
    assert {(a.deadline_at, a.lease_until) for a in stored.values()} == {
        (a.deadline_at, a.lease_until) for a in got.values()
    }


async def test_transition_is_compare_and_set_and_a_lost_race_is_a_no_op(
    db: store.Store, clock: FrozenClock
) -> None:
    [job_id] = await submit(db, clock, new())
    args = {
        "entity": "job",
        "ids": [job_id],
        "expected": "queued",
        "to": "cancelled",
        "now": clock.now(),
        "reason": "r",
    }
    assert await db.events.transition(**args) == [job_id]
    assert await db.events.transition(**args) == []
    events = await db.events.list(job_id=job_id)
    assert [e.to_state for e in events] == ["queued", "cancelled"]


async def test_illegal_transition_names_both_states(db: store.Store, clock: FrozenClock) -> None:
    [job_id] = await submit(db, clock, new())
    with pytest.raises(errors.IllegalTransition, match="'succeeded' to 'queued'"):
        await db.events.transition(
            entity="job",
            ids=[job_id],
            expected="succeeded",
            to="queued",
            now=clock.now(),
            reason="r",
        )


async def test_attempt_writes_are_fenced(db: store.Store, clock: FrozenClock) -> None:
    await submit(db, clock, new(), new())
    a, b = await claim(db, clock)
    # A write for fence b cannot touch attempt a, and one already applied cannot apply again.
    assert await db.attempts.record_running(fences=[b.attempt.id], now=clock.now()) == [
        b.attempt.id
    ]
    assert await db.attempts.record_running(fences=[b.attempt.id], now=clock.now()) == []
    [att_a, _] = [x for c in (a, b) for x in await db.attempts.list(job_id=c.job.id)]
    assert att_a.state == A.LAUNCHING


async def test_success_completes_job_once(db: store.Store, clock: FrozenClock) -> None:
    [job_id] = await submit(db, clock, new())
    [c] = await claim(db, clock)
    await db.attempts.record_running(fences=[c.attempt.id], now=clock.now())
    done = Finish(c.attempt.id, A.SUCCEEDED, 0, None)
    [outcome] = await db.attempts.finish(finishes=[done, done], now=clock.now())
    assert (outcome.job_id, outcome.attempt_state, outcome.job_state) == (
        job_id,
        A.SUCCEEDED,
        J.SUCCEEDED,
    )
    assert await db.attempts.finish(finishes=[done], now=clock.now()) == []
    events = await db.events.list(job_id=job_id)
    assert [(e.entity, e.to_state) for e in events] == [
        ("job", "queued"),
        ("job", "running"),
        ("attempt", "running"),
        ("attempt", "succeeded"),
        ("job", "succeeded"),
    ]


async def test_completion_while_still_launching_applies(
    db: store.Store, clock: FrozenClock
) -> None:
    await submit(db, clock, new())
    [c] = await claim(db, clock)
    [outcome] = await db.attempts.finish(
        finishes=[Finish(c.attempt.id, A.SUCCEEDED, 0, None)], now=clock.now()
    )
    assert outcome.job_state == J.SUCCEEDED
    assert await db.attempts.record_running(fences=[c.attempt.id], now=clock.now()) == []


async def test_failure_retries_then_fails_and_a_stale_completion_changes_nothing(
    db: store.Store, clock: FrozenClock
) -> None:
    [job_id] = await submit(db, clock, new(max_attempts=2))
    [first] = await claim(db, clock)
    [o1] = await db.attempts.finish(
        finishes=[Finish(first.attempt.id, A.FAILED, 3, "boom", FC.TRANSIENT)], now=clock.now()
    )
    assert o1.job_state == J.QUEUED
    [second] = await claim(db, clock)
    assert second.attempt.attempt_no == 2
    assert second.attempt.id > first.attempt.id
    # The first attempt's completion arrives again: it is stale and must not touch the job.
    assert (
        await db.attempts.finish(
            finishes=[Finish(first.attempt.id, A.SUCCEEDED, 0, None)], now=clock.now()
        )
        == []
    )
    assert (await db.jobs.get(job_id=job_id)).state == J.RUNNING
    [o2] = await db.attempts.finish(
        finishes=[Finish(second.attempt.id, A.FAILED, 3, "boom", FC.TRANSIENT)], now=clock.now()
    )
    assert o2.job_state == J.FAILED
    attempts = await db.attempts.list(job_id=job_id)
    assert [(a.state, a.exit_code, a.reason) for a in attempts] == [
        ("failed", 3, "boom"),
        ("failed", 3, "boom"),
    ]


async def test_cancel_queued_and_running_jobs(db: store.Store, clock: FrozenClock) -> None:
    queued, running = await submit(db, clock, new(), new())
    await db.events.transition(
        entity="job", ids=[queued], expected="queued", to="parked", now=clock.now(), reason="t"
    )
    [c] = await claim(db, clock)
    assert c.job.id == running
    assert await db.jobs.cancel(job_id=queued, now=clock.now(), reason="by test") is None
    attempt = await db.jobs.cancel(job_id=running, now=clock.now(), reason="by test")
    assert attempt is not None
    assert attempt.id == c.attempt.id
    assert [a.state for a in await db.attempts.list(job_id=running)] == [A.CANCELLED]
    # The cancelled attempt's late completion is a no-op.
    assert (
        await db.attempts.finish(
            finishes=[Finish(c.attempt.id, A.SUCCEEDED, 0, None)], now=clock.now()
        )
        == []
    )
    assert (await db.jobs.get(job_id=running)).state == J.CANCELLED
    done = (await submit(db, clock, new()))[0]
    [d] = await claim(db, clock)
    await db.attempts.finish(finishes=[Finish(d.attempt.id, A.SUCCEEDED, 0, None)], now=clock.now())
    with pytest.raises(errors.InvalidInput, match=r"already ended \(succeeded\)"):
        await db.jobs.cancel(job_id=done, now=clock.now(), reason="too late")
    with pytest.raises(errors.NotFound):
        await db.jobs.cancel(job_id=999_999, now=clock.now(), reason="none")


async def test_active_attempts_page_by_fence(db: store.Store, clock: FrozenClock) -> None:
    await submit(db, clock, *[new() for _ in range(5)])
    claimed = await claim(db, clock)
    page1 = await db.attempts.list_active(executor="noop", limit=3)
    page2 = await db.attempts.list_active(executor="noop", limit=3, after=page1[-1].id)
    assert [a.id for a in page1 + page2] == [c.attempt.id for c in claimed]


async def test_concurrent_claimers_never_share_a_job(db: store.Store, clock: FrozenClock) -> None:
    await db.jobs.submit(new=[new() for _ in range(300)], now=clock.now())
    others = [
        store.Store.connect(str(db.database.engine.url.render_as_string(hide_password=False)))
        for _ in range(3)
    ]
    try:
        results = await asyncio.gather(*(_claim_all(s, clock) for s in [db, *others]))
    finally:
        for s in others:
            await s.close()
    ids = [job_id for r in results for job_id in r]
    assert len(ids) == 300
    assert len(set(ids)) == 300


async def _claim_all(db: store.Store, clock: FrozenClock) -> list[int]:
    got: list[int] = []
    while batch := await claim(db, clock, limit=7):
        got += [c.job.id for c in batch]
    return got


async def test_claim_uses_the_claim_index(db: store.Store, clock: FrozenClock) -> None:
    await db.jobs.submit(new=[new() for _ in range(2000)], now=clock.now())
    await db.jobs.submit(new=[new(executor="other") for _ in range(2000)], now=clock.now())
    await db.database.analyze()
    plan = "\n".join(await db.jobs.claim_plan(now=clock.now(), limit=100, executors=["noop"]))
    assert "ix_jobs_queued_tenant" in plan, plan


def test_migrations_build_the_same_schema_as_the_tables(db_url: str) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    engine = create_engine(db_url)
    with engine.connect() as conn:
        assert migrate.current(conn) == migrate.head()
        diff = compare_metadata(
            MigrationContext.configure(
                conn, opts={"compare_type": True, "include_object": compared_on(conn.dialect.name)}
            ),
            schema,
        )
    engine.dispose()
    assert diff == []


async def test_cancelling_twice_is_a_no_op(db: store.Store, clock: FrozenClock) -> None:
    [job_id] = await submit(db, clock, new())
    assert await db.jobs.cancel(job_id=job_id, now=clock.now(), reason="once") is None
    assert await db.jobs.cancel(job_id=job_id, now=clock.now(), reason="twice") is None
    assert [e.to_state for e in await db.events.list(job_id=job_id)] == ["queued", "cancelled"]


async def test_a_schema_from_a_newer_corral_is_named(db: store.Store, db_url: str) -> None:
    engine = create_engine(db_url)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = '9999'")
    try:
        with pytest.raises(errors.SchemaOutOfDate, match="newer corral"):
            await db.database.check_schema()
    finally:  # the PostgreSQL database is shared by the session
        with engine.begin() as conn:
            conn.exec_driver_sql(f"UPDATE alembic_version SET version_num = '{migrate.head()}'")
        engine.dispose()


async def test_retries_in_one_batch_each_get_their_own_backoff(
    db: store.Store, clock: FrozenClock
) -> None:
    ids = await submit(db, clock, new(), new(), new(max_attempts=1))
    claimed = {c.job.id: c for c in await claim(db, clock)}
    delays = iter([3.0, 7.0, 11.0])

    class Fixed(retry.Backoff):
        def for_policy(self, attempt_no: int, policy: policy.JobPolicy) -> float:
            return next(delays)

    outcomes = await db.attempts.finish(
        finishes=[Finish(claimed[i].attempt.id, A.FAILED, 1, "boom") for i in ids],
        now=clock.now(),
        retry=retry.Retry(backoff=Fixed(1, 1)),
    )
    assert sorted(o.job_state for o in outcomes) == [J.FAILED, J.QUEUED, J.QUEUED]
    waits = sorted(
        [((await db.jobs.get(job_id=i)).run_at - clock.now()).total_seconds() for i in ids[:2]]
    )
    assert waits in ([3.0, 7.0], [3.0, 11.0], [7.0, 11.0])  # each its own delay, one UPDATE
    assert await claim(db, clock) == [], "nothing is due before its backoff"
    clock.advance(12)
    assert sorted(c.job.id for c in await claim(db, clock)) == sorted(ids[:2])


async def test_the_poll_and_recovery_read_live_attempts_from_their_index(
    tmp_path: Path, clock: FrozenClock
) -> None:
    """SQLite uses a partial index only for a query whose WHERE has the index's terms as
    written: the dispatcher's poll and recovery's scan say them so, and read the live
    attempts from ix_attempts_live, not the whole table."""
    url = f"sqlite:///{tmp_path / 'live.db'}"
    db = store.Store.connect(url)
    await db.database.migrate()
    await submit(db, clock, *(new() for _ in range(5)))
    await claim(db, clock)
    sent: list[tuple[str, Any]] = []

    def seen(conn: Any, cursor: Any, sql: str, params: Any, *args: Any) -> None:
        if "FROM attempts" in sql and sql.lstrip().startswith("SELECT"):
            sent.append((sql, params))

    event.listen(db.database.engine, "before_cursor_execute", seen)
    assert len(await db.attempts.list_active(executor="noop", limit=10)) == 5
    await db.attempts.list_for_recovery(
        now=clock.now(),
        launch_grace=timedelta(seconds=5),
        lease_timeout=timedelta(minutes=5),
        attempt_deadline=timedelta(hours=1),
        limit=10,
    )
    await db.close()
    assert len(sent) == 2
    raw = sqlite3.connect(tmp_path / "live.db")
    for sql, params in sent:
        plan = " ".join(str(row[-1]) for row in raw.execute(f"EXPLAIN QUERY PLAN {sql}", params))
        assert "ix_attempts_live" in plan, (sql, plan)
    raw.close()


async def test_a_tenant_s_max_running_is_kept_at_the_claim_with_pools(
    db: store.Store, clock: FrozenClock
) -> None:
    """[tenants.a] max_running = 2 and a pool of 1: a claim takes at most 2 of a's jobs (at
    most 1 in the pool) and all of b's; a's next job goes once one of its own ends."""
    a = [model.NewJob(executor="noop", spec={}, tenant="a", priority=9 - n) for n in range(3)]
    pooled = [model.NewJob(executor="noop", spec={}, tenant="a", pool="p", priority=10)] * 2
    b = [model.NewJob(executor="noop", spec={}, tenant="b") for _ in range(3)]
    await submit(db, clock, *pooled, *a, *b)
    caps = {"tenants": {"a": 2}, "pools": {"p": 1}}
    claimed = await db.jobs.claim(now=clock.now(), limit=100, executors=["noop"], **caps)
    mine = [c for c in claimed if c.job.tenant == "a"]
    assert sorted(c.job.tenant for c in claimed) == ["a", "a", "b", "b", "b"]
    assert [c.job.pool for c in mine] == ["p", None]  # the most urgent of each, one pooled
    assert await db.jobs.claim(now=clock.now(), limit=100, executors=["noop"], **caps) == []
    done = Finish(mine[1].attempt.id, A.SUCCEEDED, 0, None)
    await db.attempts.finish(finishes=[done], now=clock.now())
    [after] = await db.jobs.claim(now=clock.now(), limit=100, executors=["noop"], **caps)
    assert (after.job.tenant, after.job.pool) == ("a", None)


async def test_exactly_one_first_admin_token_however_many_start_at_once(db_url: str) -> None:
    stores = [store.Store.connect(db_url) for _ in range(4)]
    try:
        now = FrozenClock().now()
        made = await asyncio.gather(
            *(
                s.tokens.add_first_admin(name="first admin", secret_sha256=f"{n:064x}", now=now)
                for n, s in enumerate(stores)
            )
        )
        [token] = [t for t in made if t is not None]
        assert (token.tenant, token.role) == (None, access.Role.ADMIN)
        assert (
            await stores[0].tokens.add_first_admin(
                name="first admin", secret_sha256="f" * 64, now=now
            )
            is None
        )
    finally:
        for s in stores:
            await s.close()
