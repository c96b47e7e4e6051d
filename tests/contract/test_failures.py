"""Failure handling on both databases: classes, quarantine, the retry budget, heartbeats,
per-job deadlines and the unknown state."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from corral import client, config, dispatcher, errors, launching, model, reconciler, retry, store
from corral.policy import job_policy
from corral.store import Finish
from corral.testing import FrozenClock
from tests.support import jobs
from tests.support.noop import NoopExecutor
from tests.support.platform import Platform

A, J, FC, P = model.AttemptState, model.JobState, model.FailureClass, launching.Phase
RULE_FAIL_4 = {"on_exit_codes": {"operator": "In", "values": [4]}, "action": "fail"}
RULE_IGNORE_9 = {"on_exit_codes": {"operator": "In", "values": [9]}, "action": "ignore"}


async def submit(
    db: store.Store,
    clock: FrozenClock,
    n: int = 1,
    *,
    policy: dict[str, Any] | None = None,
    **kw: Any,
) -> list[int]:
    stored = job_policy(config.Settings(), policy or {}).stored()
    new = [model.NewJob(executor="noop", spec={}, policy=stored, **kw) for _ in range(n)]
    return await jobs.submit(db, clock, *new)


async def claim(db: store.Store, clock: FrozenClock, n: int = 100) -> list[model.Claimed]:
    limits = store.DefaultLimits(timedelta(seconds=240), timedelta(seconds=60))
    return await db.jobs.claim(now=clock.now(), limit=n, executors=["noop"], limits=limits)


async def fail(
    db: store.Store,
    clock: FrozenClock,
    c: model.Claimed,
    code: int,
    message: str = "boom",
    rules: retry.Retry | None = None,
) -> list[store.Outcome]:
    finish = Finish(c.attempt.id, A.FAILED, code, f"exited with code {code}", None, message)
    return await db.attempts.finish(finishes=[finish], now=clock.now(), retry=rules)


async def test_the_same_unknown_failure_twice_quarantines_the_job(
    db: store.Store, clock: FrozenClock
) -> None:
    [job_id] = await submit(db, clock, max_attempts=5)
    [first] = await claim(db, clock)
    [o] = await fail(db, clock, first, 3, "12:00:01 no such table: users")
    assert o.job_state == J.QUEUED
    [second] = await claim(db, clock)
    [o] = await fail(db, clock, second, 3, "12:00:09 no such table: users")  # same, but the time
    assert o.job_state == J.QUARANTINED
    assert await claim(db, clock) == [], "a quarantined job is never claimed"
    attempts = await db.attempts.list(job_id=job_id)
    assert [(a.failure_class, a.fingerprint == attempts[0].fingerprint) for a in attempts] == [
        (FC.UNKNOWN, True),
        (FC.UNKNOWN, True),
    ]
    last = (await db.events.list(job_id=job_id))[-1]
    assert last.reason.startswith("quarantined: attempt 2 failed the same way 2 times in a row")
    assert last.details["fingerprint"] == attempts[0].fingerprint
    assert (await db.jobs.get(job_id=job_id)).attempt_count == 2, "costs no more attempts"


async def test_different_failures_are_retried_until_attempts_run_out(
    db: store.Store, clock: FrozenClock
) -> None:
    [job_id] = await submit(db, clock, max_attempts=3)
    for n, message in enumerate(("disk full", "timeout talking to db", "disk full"), start=1):
        [c] = await claim(db, clock)
        [o] = await fail(db, clock, c, 1, message)
        assert o.job_state == (J.FAILED if n == 3 else J.QUEUED)
    assert (await db.jobs.get(job_id=job_id)).state == J.FAILED


async def test_a_permanent_exit_code_quarantines_after_one_attempt(
    db: store.Store, clock: FrozenClock
) -> None:
    [job_id] = await submit(db, clock, max_attempts=5, policy={"failure_rules": [RULE_FAIL_4]})
    [c] = await claim(db, clock)
    [o] = await fail(db, clock, c, 4)
    assert o.job_state == J.QUARANTINED
    assert (await db.events.list(job_id=job_id))[-1].reason == (
        "quarantined: attempt 1 failed permanently (rule 1: exit code 4 In [4] -> fail)"
    )


async def test_a_transient_failure_is_never_quarantined_by_repetition(
    db: store.Store, clock: FrozenClock
) -> None:
    [job_id] = await submit(db, clock, max_attempts=3)
    for _ in range(3):
        [c] = await claim(db, clock)
        timed_out = Finish(c.attempt.id, A.FAILED, -15, "deadline exceeded", FC.TRANSIENT)
        await db.attempts.finish(finishes=[timed_out], now=clock.now())
    assert (await db.jobs.get(job_id=job_id)).state == J.FAILED


async def test_an_ignored_failure_does_not_use_up_an_attempt(
    db: store.Store, clock: FrozenClock
) -> None:
    [job_id] = await submit(db, clock, max_attempts=1, policy={"failure_rules": [RULE_IGNORE_9]})
    for n in (1, 2):
        [c] = await claim(db, clock)
        [o] = await fail(db, clock, c, 9, f"evicted {n}")
        assert o.job_state == J.QUEUED
    job = await db.jobs.get(job_id=job_id)
    assert (job.attempt_count, job.max_attempts) == (2, 3)
    assert "does not count toward max_attempts" in (await db.events.list(job_id=job_id))[-1].reason


async def test_a_person_retries_or_discards_a_quarantined_job(
    db: store.Store, clock: FrozenClock
) -> None:
    keep, drop = await submit(db, clock, 2, max_attempts=1, policy={"failure_rules": [RULE_FAIL_4]})
    for c in await claim(db, clock):
        await fail(db, clock, c, 4)
    await db.jobs.unquarantine(job_id=keep, to=J.QUEUED, now=clock.now(), reason="by a person")
    await db.jobs.unquarantine(job_id=drop, to=J.CANCELLED, now=clock.now(), reason="gave up")
    assert [(await db.jobs.get(job_id=i)).state for i in (keep, drop)] == [J.QUEUED, J.CANCELLED]
    job = await db.jobs.get(job_id=keep)
    assert (job.attempt_count, job.max_attempts) == (1, 2), "one more attempt than it had"
    [again] = await claim(db, clock)
    assert (again.job.id, again.attempt.attempt_no) == (keep, 2)
    with pytest.raises(errors.InvalidInput, match="is running, not quarantined"):
        await db.jobs.unquarantine(job_id=keep, to=J.CANCELLED, now=clock.now(), reason="x")


async def test_not_found_is_not_found(db: store.Store, clock: FrozenClock) -> None:
    with pytest.raises(errors.NotFound):
        await db.jobs.unquarantine(job_id=999_999, to=J.QUEUED, now=clock.now(), reason="x")


async def test_retries_beyond_the_budget_are_delayed_with_an_event(
    db: store.Store, clock: FrozenClock
) -> None:
    rules = retry.Retry(budget=retry.Budget(ratio=0.0, floor_per_second=1.0, burst=2))
    retry_all = {
        "failure_rules": [
            {"on_exit_codes": {"operator": "NotIn", "values": [0]}, "action": "retry"}
        ]
    }
    ids = await submit(db, clock, 5, queue="etl", policy=retry_all)
    claimed = await claim(db, clock)
    finishes = [Finish(c.attempt.id, A.FAILED, 1, "exited with code 1") for c in claimed]
    outcomes = await db.attempts.finish(finishes=finishes, now=clock.now(), retry=rules)
    assert {o.job_state for o in outcomes} == {J.QUEUED}
    waits = sorted(
        [((await db.jobs.get(job_id=i)).run_at - clock.now()).total_seconds() for i in ids]
    )
    assert waits == [0, 0, 1, 2, 3], "two tokens in the bucket, then one a second"
    delayed = [i for i in ids if (await db.jobs.get(job_id=i)).run_at > clock.now()]
    for job_id in delayed:
        last = (await db.events.list(job_id=job_id))[-1]
        assert "queue 'etl' retry budget is empty, so it waits for a token" in last.reason
        assert last.details["budget"] == "empty"
        view = client.jobs.JobView(
            await db.jobs.get(job_id=job_id),
            await db.attempts.list(job_id=job_id),
            await db.events.list(job_id=job_id),
        )
        assert client.explain.why(view, clock.now()).startswith("budget empty: queue 'etl'")
    assert len(await claim(db, clock)) == 2
    clock.advance(3)
    assert len(await claim(db, clock)) == 3, "delayed, never dropped"


async def test_a_jobs_own_deadline_is_fixed_at_the_claim(
    db: store.Store, clock: FrozenClock
) -> None:
    limits = {"attempt_deadline": "30s", "lease_timeout": "20s"}
    await submit(db, clock, policy={"limits": limits, "heartbeat": True})
    await submit(db, clock)
    short, default = await claim(db, clock)
    assert short.attempt.deadline_at == clock.now() + timedelta(seconds=30)
    assert short.attempt.lease_until == clock.now() + timedelta(seconds=20), "its own lease"
    assert default.attempt.deadline_at == clock.now() + timedelta(seconds=240)
    assert default.attempt.lease_until is None, "no heartbeats promised, no lease"


# --- heartbeats -------------------------------------------------------------------------------------


async def test_a_heartbeat_renews_the_lease_and_a_stale_fence_is_refused(
    db: store.Store, clock: FrozenClock
) -> None:
    [job_id] = await submit(
        db, clock, policy={"heartbeat": True, "on_unknown": "fence_and_relaunch"}
    )
    [c] = await claim(db, clock)
    clock.advance(25)  # a slow launch: the lease starts again when it is recorded running
    await db.attempts.record_running(fences=[c.attempt.id], now=clock.now())
    [a] = await db.attempts.list(job_id=job_id)
    assert a.lease_until == clock.now() + timedelta(seconds=60)
    clock.advance(40)
    lease = await db.attempts.heartbeat(job_id=job_id, fence=c.attempt.id, now=clock.now())
    assert lease == clock.now() + timedelta(seconds=60)
    [a] = await db.attempts.list(job_id=job_id)
    assert (a.last_seen_at, a.lease_until) == (clock.now(), lease)
    assert await db.attempts.supersede(fences=[c.attempt.id], now=clock.now(), reason="test") == [
        c.attempt.id
    ]
    [new] = await claim(db, clock)
    with pytest.raises(errors.StaleFence, match=f"newest attempt has fence {new.attempt.id}"):
        await db.attempts.heartbeat(job_id=job_id, fence=c.attempt.id, now=clock.now())
    with pytest.raises(errors.NotFound):
        await db.attempts.heartbeat(
            job_id=job_id,
            fence=new.attempt.id + 99,
            now=clock.now(),
        )


# --- the unknown state ------------------------------------------------------------------------------


def recon(db: store.Store, clock: FrozenClock, platform: Platform) -> reconciler.Reconciler:
    return reconciler.Reconciler(
        store=db, executors={"noop": platform}, clock=clock, settings=config.Settings()
    )


async def launched(
    db: store.Store, clock: FrozenClock, platform: Platform, policy: dict[str, Any], **kw: Any
) -> model.Claimed:
    await submit(db, clock, policy={"heartbeat": True, **policy}, **kw)
    [c] = await claim(db, clock)
    await platform.launch(launching.build_launch(c, reach=launching.Reach(), deadline_seconds=None))
    await db.attempts.record_running(fences=[c.attempt.id], now=clock.now())
    return c


async def test_silence_with_policy_wait_keeps_the_attempt_until_its_deadline(
    db: store.Store, clock: FrozenClock
) -> None:
    platform = Platform()
    platform.ready = True
    c = await launched(db, clock, platform, {"on_unknown": "wait"})
    r = recon(db, clock, platform)
    clock.advance(30)
    assert (await r.run_once()).looked == 0, "inside its lease"
    clock.advance(31)  # no heartbeat for 61s: the platform still shows it running
    assert (await r.run_once()).unknown == 1
    [a] = await db.attempts.list(job_id=c.job.id)
    assert (a.state, a.lease_until) == (A.RUNNING, a.deadline_at), "the lease runs to the deadline"
    events = await db.events.list(job_id=c.job.id)
    assert events[-1].reason.startswith("unknown state (silent: no heartbeat for its lease")
    assert events[-1].details == {"unknown": "wait"}
    clock.advance(60)
    assert (await r.run_once()).unknown == 0, "waiting: not judged again before its deadline"
    assert len(await db.events.list(job_id=c.job.id)) == len(events)
    view = client.jobs.JobView(await db.jobs.get(job_id=c.job.id), [a], events)
    assert "in the unknown state" in client.explain.why(view, clock.now())
    clock.advance(240)
    assert (await r.run_once()).timed_out == 1, "the watchdog stops it at its deadline"
    [a] = await db.attempts.list(job_id=c.job.id)
    assert (a.state, a.failure_class) == (A.FAILED, FC.TRANSIENT)


async def test_silence_with_fence_and_relaunch_supersedes_and_relaunches(
    db: store.Store, clock: FrozenClock
) -> None:
    platform = Platform()
    platform.ready = True
    c = await launched(db, clock, platform, {"on_unknown": "fence_and_relaunch"})
    clock.advance(61)
    summary = await recon(db, clock, platform).run_once()
    assert (summary.unknown, summary.superseded) == (1, 1)
    [old] = await db.attempts.list(job_id=c.job.id)
    assert old.state == A.SUPERSEDED
    assert platform.cancelled == [c.attempt.launch_name], "the old one is stopped, best effort"
    job = await db.jobs.get(job_id=c.job.id)
    assert (job.state, job.run_at) == (J.QUEUED, clock.now())
    [new] = await claim(db, clock)
    assert new.attempt.id > c.attempt.id, "a higher fence"
    # The old attempt's late completion changes nothing.
    assert (
        await db.attempts.finish(
            finishes=[Finish(c.attempt.id, A.SUCCEEDED, 0, None)], now=clock.now()
        )
        == []
    )


async def test_a_platform_that_cannot_be_asked_is_unknown_too(
    db: store.Store, clock: FrozenClock
) -> None:
    platform = Platform()
    platform.ready = True
    c = await launched(db, clock, platform, {"on_unknown": "fence_and_relaunch"})
    platform.down = True
    clock.advance(61)
    await recon(db, clock, platform).run_once()
    assert [a.state for a in await db.attempts.list(job_id=c.job.id)] == [A.SUPERSEDED]


async def test_the_unknown_state_is_written_once_per_silence(
    db: store.Store, clock: FrozenClock
) -> None:
    platform = Platform()
    platform.ready = True
    c = await launched(db, clock, platform, {"on_unknown": "wait"})
    platform.down = True  # the platform cannot be asked: every pass finds it unknown
    r = recon(db, clock, platform)
    clock.advance(61)
    for _ in range(16):  # a pass a second, as with reconcile_interval = 1s
        await r.run_once()
        clock.advance(1)
    unknown = [e for e in await db.events.list(job_id=c.job.id) if e.details.get("unknown")]
    assert len(unknown) == 1, [e.reason for e in unknown]
    await db.attempts.heartbeat(job_id=c.job.id, fence=c.attempt.id, now=clock.now())  # news
    clock.advance(61)  # ... then silence again: a second silence, a second event
    for _ in range(3):
        await r.run_once()
        clock.advance(1)
    unknown = [e for e in await db.events.list(job_id=c.job.id) if e.details.get("unknown")]
    assert len(unknown) == 2, [e.reason for e in unknown]


async def test_fence_and_relaunch_without_attempts_left_waits(
    db: store.Store, clock: FrozenClock
) -> None:
    platform = Platform()
    c = await launched(db, clock, platform, {"on_unknown": "fence_and_relaunch"}, max_attempts=1)
    clock.advance(61)
    await recon(db, clock, platform).run_once()
    [a] = await db.attempts.list(job_id=c.job.id)
    assert (a.state, a.lease_until) == (A.RUNNING, a.deadline_at)
    last = (await db.events.list(job_id=c.job.id))[-1]
    assert last.reason.endswith("; no attempts left to relaunch); left to run until its deadline")


# --- a systemic failure -----------------------------------------------------------------------------


async def test_a_systemic_failure_stays_within_the_retry_budget(
    db: store.Store, clock: FrozenClock
) -> None:
    """1,000 jobs all fail (transiently) at once. Retries launched by any moment stay within
    burst + ratio * first attempts + floor * elapsed, and every job still ends."""
    budget = config.BudgetSettings(ratio=0.1, floor_per_minute=120, burst=20)
    settings = config.Settings(
        claim_batch_limit=500,
        recovery_batch_limit=1000,  # two claims: a tick's, and the next one made meanwhile
        retry=config.RetrySettings(base=1, cap=2, budget=budget, seed=1),
    )
    executor = NoopExecutor(fail_exit_code=75)
    d = dispatcher.Dispatcher(
        store=db, executors={"noop": executor}, clock=clock, settings=settings
    )
    retry_75 = {
        "failure_rules": [{"on_exit_codes": {"operator": "In", "values": [75]}, "action": "retry"}]
    }
    ids = await submit(db, clock, 1000, max_attempts=3, policy=retry_75)
    start, launched_at = clock.now(), []
    events = executor.events()
    while True:
        tick = await d.run_once()
        for _ in range(tick.launched):
            d.completions.offer(await anext(events))
        await d.completions.flush()
        launched_at += [clock.now()] * tick.launched
        if tick.claimed == 0 and await db.jobs.count_by_state() == {"failed": 1000}:
            break
        if tick.claimed == 0:
            clock.advance(5)
    firsts = 1000
    retries_at = launched_at[firsts:]
    assert len(retries_at) == 2000, "every job used all three attempts"
    for i, at in enumerate(retries_at, start=1):
        elapsed = (at - start).total_seconds()
        assert i <= budget.burst + budget.ratio * firsts + budget.floor_per_minute / 60 * elapsed
    assert {(await db.jobs.get(job_id=i)).state for i in ids} == {J.FAILED}
    span = (retries_at[-1] - start).total_seconds()
    assert span >= (2000 - 20 - 100) / 2, "the floor (2 a second) paced the rest"


# --- pools ----------------------------------------------------------------------------------------


async def test_a_pool_caps_how_many_of_its_jobs_run(db: store.Store, clock: FrozenClock) -> None:
    pools = {"backfill": 2}
    backfill = await submit(db, clock, 5, pool="backfill", priority=10)
    others = await submit(db, clock, 3)
    limits = store.DefaultLimits(timedelta(seconds=240), timedelta(seconds=60))

    async def take(n: int = 10) -> list[model.Claimed]:
        return await db.jobs.claim(
            now=clock.now(), limit=n, executors=["noop"], limits=limits, pools=pools
        )

    first = await take()
    assert sorted(c.job.id for c in first) == sorted(backfill[:2] + others)
    assert await take() == [], "the pool is full"
    done = next(c for c in first if c.job.pool == "backfill")
    await db.attempts.finish(
        finishes=[Finish(done.attempt.id, A.SUCCEEDED, 0, None)], now=clock.now()
    )
    [next_one] = await take()
    assert next_one.job.id == backfill[2]
    settings = config.Settings(pools=pools)
    c = client.Client(store=db, executors={"noop": NoopExecutor()}, settings=settings, clock=clock)
    assert await c.explain(backfill[3]) == (
        "pool full: pool 'backfill' runs 2 of its 2 slots; this job waits for one to free up"
    )
    with pytest.raises(errors.InvalidInput, match="pool: 'nightly' is not a configured pool"):
        await c.submit(spec={}, executor="noop", pool="nightly")


async def test_claims_at_the_same_moment_never_overfill_a_pool(
    db_url: str, clock: FrozenClock
) -> None:
    stores = [store.Store.connect(db_url) for _ in range(4)]
    try:
        await submit(stores[0], clock, 20, pool="backfill")
        claims = await asyncio.gather(
            *(
                s.jobs.claim(now=clock.now(), limit=5, executors=["noop"], pools={"backfill": 3})
                for s in stores
            )
        )
        assert sum(len(c) for c in claims) == 3
    finally:
        for s in stores:
            await s.close()


async def test_an_attempt_too_late_to_launch_is_not_charged_and_the_job_gets_a_new_one(
    db: store.Store, clock: FrozenClock
) -> None:
    platform = Platform()
    [job_id] = await submit(
        db, clock, max_attempts=1, policy={"limits": {"attempt_deadline": "20s"}}
    )
    assert len(await claim(db, clock)) == 1  # the dispatcher died (or lost its database) here
    clock.advance(31)  # past launch_grace (30s) and past its own 20s deadline
    assert (await recon(db, clock, platform).run_once()).never_launched == 1
    assert platform.launches == {}, "never launched that late"
    [a] = await db.attempts.list(job_id=job_id)
    assert (a.state, a.reason, a.charged) == (A.SUPERSEDED, model.NEVER_LAUNCHED, False)
    job = await db.jobs.get(job_id=job_id)
    assert (job.state, job.charged_attempts, job.uncharged_attempts) == (J.QUEUED, 0, 1)
    [again] = await claim(db, clock)
    assert again.attempt.id > a.id, "a higher fence"
    assert again.attempt.deadline_at == clock.now() + timedelta(seconds=20), "a fresh deadline"
    [o] = await db.attempts.finish(
        finishes=[Finish(again.attempt.id, A.SUCCEEDED, 0, None)], now=clock.now()
    )
    assert o.job_state == J.SUCCEEDED, "max_attempts 1: the attempt that never ran cost nothing"


async def test_a_never_launched_attempt_costs_no_retry_token_and_breaks_no_streak(
    db: store.Store, clock: FrozenClock, db_url: str
) -> None:
    rules = retry.Retry(budget=retry.Budget(ratio=0, floor_per_second=1e-9, burst=5))
    [job_id] = await submit(db, clock, max_attempts=5, policy={"quarantine_after": 2})
    [first] = await claim(db, clock)
    [o] = await fail(db, clock, first, 3, "no such table: users", rules=rules)
    assert o.job_state == J.QUEUED
    assert tokens(db_url) == pytest.approx(4), "the retry took a token"
    [second] = await claim(db, clock)
    assert await db.attempts.never_launched(
        fences=[second.attempt.id], now=clock.now(), why="test"
    ) == [second.attempt.id]
    assert tokens(db_url) == pytest.approx(4), "the attempt that never ran took none"
    [third] = await claim(db, clock)
    assert third.attempt.attempt_no == 3
    [o] = await fail(db, clock, third, 3, "no such table: users", rules=rules)
    assert o.job_state == J.QUARANTINED, "attempts 1 and 3 failed alike: a poison pill"
    assert (await db.jobs.get(job_id=job_id)).charged_attempts == 2


def tokens(db_url: str) -> float:
    engine = create_engine(db_url)
    with engine.connect() as conn:
        found = conn.execute(text("SELECT tokens FROM retry_budgets")).scalar_one()
    engine.dispose()
    return float(found)
