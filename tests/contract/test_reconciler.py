"""Recovery on both databases, against a platform double that holds launches in place."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path

import pytest

from corral import config, errors, health, launching, model, reconciler, runtime, store, timeouts
from corral.clock import SystemClock
from corral.executors import base
from corral.store import Finish
from corral.testing import FrozenClock
from tests.support.platform import Platform
from tests.support.wait import PATIENCE, eventually

A, J, P = model.AttemptState, model.JobState, launching.Phase
TIMEOUTS = timeouts.Timeouts(
    launch_grace=30, lease_timeout=60, attempt_deadline=240, recovery_grace=360, cancel_grace=1
)


def settings(**kw: object) -> config.Settings:
    return config.Settings(timeouts=TIMEOUTS, **kw)  # type: ignore[arg-type]


def make(db: store.Store, clock: FrozenClock, platform: Platform) -> reconciler.Reconciler:
    return reconciler.Reconciler(
        store=db, executors={"noop": platform}, clock=clock, settings=settings()
    )


async def claimed(
    db: store.Store, clock: FrozenClock, n: int = 1, **kw: object
) -> list[model.Claimed]:
    """Submit and claim `n` jobs: attempts in `launching`, as a dispatcher that died left them."""
    jobs = [model.NewJob(executor="noop", spec={}, **kw) for _ in range(n)]  # type: ignore[arg-type]
    await db.jobs.submit(new=jobs, now=clock.now())
    return await db.jobs.claim(now=clock.now(), limit=n, executors=["noop"])


def launch_of(c: model.Claimed) -> launching.Launch:
    return launching.build_launch(c, reach=launching.Reach(), deadline_seconds=None)


async def running(
    db: store.Store, clock: FrozenClock, n: int = 1, **kw: object
) -> list[model.Claimed]:
    found = await claimed(db, clock, n, **kw)
    await db.attempts.record_running(fences=[c.attempt.id for c in found], now=clock.now())
    return found


async def attempt(db: store.Store, c: model.Claimed) -> model.Attempt:
    return next(a for a in await db.attempts.list(job_id=c.job.id) if a.id == c.attempt.id)


async def reasons(db: store.Store, c: model.Claimed) -> list[str]:
    return [e.reason for e in await db.events.list(job_id=c.job.id)]


async def test_a_launching_attempt_inside_its_grace_is_left_alone(
    db: store.Store, clock: FrozenClock
) -> None:
    platform = Platform()
    await claimed(db, clock)
    clock.advance(10)
    assert (await make(db, clock, platform).run_once()).looked == 0
    assert not platform.launches


async def test_an_absent_launch_is_launched_again_under_the_same_name(
    db: store.Store, clock: FrozenClock
) -> None:
    platform = Platform()
    [c] = await claimed(db, clock)  # crash between claim and launch
    clock.advance(31)
    summary = await make(db, clock, platform).run_once()
    assert (summary.looked, summary.relaunched) == (1, 1)
    assert platform.launches == {c.attempt.launch_name: 1}
    assert [launch.relaunch for launch in platform.asked] == [True], "the executor is told"
    assert (await attempt(db, c)).state == A.RUNNING
    assert any(r.startswith("relaunched") for r in await reasons(db, c))
    assert (await make(db, clock, platform).run_once()).looked == 0  # fresh news now


async def test_a_present_launch_with_this_identity_is_adopted(
    db: store.Store, clock: FrozenClock
) -> None:
    platform = Platform()
    [c] = await claimed(db, clock)
    platform.put(launch_of(c))  # crash between launch and record
    clock.advance(31)
    assert (await make(db, clock, platform).run_once()).adopted == 1
    assert not platform.launches, "adopting launches nothing"
    assert (await attempt(db, c)).state == A.RUNNING
    assert any(r.startswith("adopted") for r in await reasons(db, c))


async def test_a_present_launch_is_launched_again_before_it_is_adopted(
    db: store.Store, clock: FrozenClock
) -> None:
    """A launch may be more than one object (a Job, then its payload's ConfigMap): asking
    for it again, idempotent by name, makes what a crash between them left unmade."""
    platform = Platform()
    [c] = await claimed(db, clock)
    platform.put(launch_of(c), P.PENDING)
    clock.advance(31)
    assert (await make(db, clock, platform).run_once()).adopted == 1
    assert [(a.name, a.relaunch) for a in platform.asked] == [(c.attempt.launch_name, True)]
    assert not platform.launches, "no second copy"
    assert (await attempt(db, c)).state == A.RUNNING


async def test_a_present_launch_asked_again_in_vain_is_left_launching_for_the_next_pass(
    db: store.Store, clock: FrozenClock
) -> None:
    platform = Platform()
    [c] = await claimed(db, clock)
    platform.put(launch_of(c), P.PENDING)
    platform.down_for_launch = True
    clock.advance(31)
    summary = await make(db, clock, platform).run_once()
    assert (summary.adopted, summary.unknown) == (0, 1)
    assert (await attempt(db, c)).state == A.LAUNCHING
    platform.down_for_launch = False
    assert (await make(db, clock, platform).run_once()).adopted == 1
    assert (await attempt(db, c)).state == A.RUNNING


async def test_a_present_launch_past_its_deadline_is_adopted_as_it_is(
    db: store.Store, clock: FrozenClock
) -> None:
    platform = Platform()
    await db.jobs.submit(new=[model.NewJob(executor="noop", spec={})], now=clock.now())
    limits = store.DefaultLimits(timedelta(seconds=240), timedelta(seconds=60))
    [c] = await db.jobs.claim(now=clock.now(), limit=1, executors=["noop"], limits=limits)
    assert c.attempt.deadline_at is not None
    platform.put(launch_of(c))
    clock.advance(241)  # past its deadline, inside cancel_grace: its platform is stopping it
    assert (await make(db, clock, platform).run_once()).adopted == 1
    assert not platform.asked, "too late to launch: its platform is stopping it"
    assert (await attempt(db, c)).state == A.RUNNING


async def test_a_launch_name_held_by_another_identity_is_a_conflict(
    db: store.Store, clock: FrozenClock
) -> None:
    platform = Platform()
    [c] = await claimed(db, clock)
    stale = launching.build_launch(
        model.Claimed(c.job, model.Attempt(**{**_fields(c.attempt), "id": c.attempt.id + 1000})),
        reach=launching.Reach(),
        deadline_seconds=None,
    )
    platform.put(stale)
    clock.advance(31)
    assert (await make(db, clock, platform).run_once()).conflicts == 1
    a = await attempt(db, c)
    assert a.state == A.FAILED
    assert a.reason is not None
    assert a.reason.startswith("launch conflict")
    assert (await db.jobs.get(job_id=c.job.id)).state == J.QUEUED  # the job retries


async def test_a_finish_nobody_saw_is_completed(db: store.Store, clock: FrozenClock) -> None:
    platform = Platform()
    [ok, bad] = await running(db, clock, 2, max_attempts=1)
    platform.put(launch_of(ok), P.SUCCEEDED, exit_code=0)
    platform.put(launch_of(bad), P.FAILED, exit_code=3)
    clock.advance(61)  # no news for lease_timeout
    assert (await make(db, clock, platform).run_once()).completed == 2
    assert (await db.jobs.get(job_id=ok.job.id)).state == J.SUCCEEDED
    assert (await db.jobs.get(job_id=bad.job.id)).state == J.FAILED


async def test_an_attempt_past_its_deadline_is_stopped_and_failed(
    db: store.Store, clock: FrozenClock
) -> None:
    platform = Platform()
    [c] = await running(db, clock)
    platform.put(launch_of(c))
    clock.advance(240.5)  # past its deadline, inside cancel_grace: its platform is stopping it
    assert (await make(db, clock, platform).run_once()).timed_out == 0
    assert platform.cancelled == []
    assert (await attempt(db, c)).state == A.RUNNING
    clock.advance(0.5)  # the platform's stop had its grace: recovery is the backstop
    assert (await make(db, clock, platform).run_once()).timed_out == 1
    assert platform.cancelled == [c.attempt.launch_name]
    a = await attempt(db, c)
    assert (a.state, a.reason) == (
        A.FAILED,
        "timed out: ran past its deadline, stopped by recovery",
    )
    assert (await db.jobs.get(job_id=c.job.id)).state == J.QUEUED


async def test_absent_is_lost_only_past_recovery_grace(db: store.Store, clock: FrozenClock) -> None:
    platform = Platform()
    [c] = await running(db, clock)
    clock.advance(61)
    r = make(db, clock, platform)
    assert (await r.run_once()).waiting == 1, "absent but recently started: wait"
    assert (await attempt(db, c)).state == A.RUNNING
    clock.advance(300)
    assert (await r.run_once()).lost == 1
    assert (await attempt(db, c)).state == A.LOST
    assert (await db.jobs.get(job_id=c.job.id)).state == J.QUEUED
    clock.advance(2)  # past the retry's backoff (base 1s)
    [again] = await db.jobs.claim(now=clock.now(), limit=1, executors=["noop"])
    assert again.attempt.id > c.attempt.id, "the retry carries a higher fence"


async def test_a_platform_that_cannot_be_asked_changes_nothing(
    db: store.Store, clock: FrozenClock
) -> None:
    platform = Platform()
    [launching] = await claimed(db, clock)
    [quiet] = await running(db, clock)
    platform.down = True
    clock.advance(400)
    r = make(db, clock, platform)
    for _ in range(3):
        summary = await r.run_once()
        assert (summary.unknown, summary.relaunched, summary.lost) == (2, 0, 0)
    assert (await attempt(db, launching)).state == A.LAUNCHING
    assert (await attempt(db, quiet)).state == A.RUNNING
    notes = [x for x in await reasons(db, quiet) if x.startswith("unknown state (platform")]
    assert len(notes) == 1, "noted once, not every pass"
    platform.down = False
    summary = await r.run_once()
    assert (summary.relaunched, summary.lost) == (1, 1)


async def test_orphans_of_ended_attempts_and_cancelled_jobs_are_stopped(
    db: store.Store, clock: FrozenClock
) -> None:
    platform = Platform()
    [ended, cancelled, healthy] = await running(db, clock, 3)
    for c in (ended, cancelled, healthy):
        platform.put(launch_of(c))
    await db.attempts.finish(
        finishes=[Finish(ended.attempt.id, A.FAILED, 1, "gave up")], now=clock.now()
    )
    await db.jobs.cancel(job_id=cancelled.job.id, now=clock.now(), reason="by test")
    assert (await make(db, clock, platform).run_once()).orphans_cancelled == 2
    assert sorted(platform.cancelled) == sorted(
        [ended.attempt.launch_name, cancelled.attempt.launch_name]
    )
    assert any(r.startswith("orphan cancelled") for r in await reasons(db, ended))


async def test_many_reconcilers_repair_each_attempt_once(
    db: store.Store, db_url: str, clock: FrozenClock
) -> None:
    platform = Platform()
    found = await claimed(db, clock, 20)
    for c in found[:10]:
        platform.put(launch_of(c))  # half to adopt, half to relaunch
    clock.advance(31)
    others = [store.Store.connect(db_url) for _ in range(3)]
    try:
        passes = await asyncio.gather(*(make(s, clock, platform).run_once() for s in [db, *others]))
    finally:
        for s in others:
            await s.close()
    assert sum(p.looked for p in passes) >= 20
    assert all(n == 1 for n in platform.launches.values())
    for c in found:
        states = [
            e.to_state for e in await db.events.list(job_id=c.job.id) if e.entity == "attempt"
        ]
        assert states == ["running"], f"job {c.job.id}: {states}"


async def test_the_same_completion_from_everywhere_applies_once(
    db: store.Store, db_url: str, clock: FrozenClock
) -> None:
    [c] = await running(db, clock, max_attempts=3)
    finish = Finish(c.attempt.id, A.FAILED, 2, "exit 2")
    deliverers = [store.Store.connect(db_url) for _ in range(4)]  # watcher, reconciler, repeats
    try:
        results = await asyncio.gather(
            *(
                s.attempts.finish(finishes=[finish], now=clock.now())
                for s in deliverers
                for _ in range(3)
            )
        )
    finally:
        for s in deliverers:
            await s.close()
    assert sum(len(r) for r in results) == 1, "one state change, one retry decision"
    events = [(e.entity, e.to_state) for e in await db.events.list(job_id=c.job.id)]
    assert events.count(("attempt", "failed")) == 1
    assert events.count(("job", "queued")) == 2  # submitted, then one retry


@pytest.mark.timeout(4 * PATIENCE)
async def test_the_first_pass_waits_for_executors_to_be_ready(
    db: store.Store, db_url: str, tmp_path: Path
) -> None:
    slow = Platform(start_delay=0.3)
    beats = tmp_path / "health.json"  # appears once a tick and a pass have both ended
    s = config.Settings(
        database_url=db_url,
        health_file=beats,
        timeouts=timeouts.Timeouts(reconcile_interval=0.05),
    )
    [(job_id, _)] = await db.jobs.submit(
        new=[model.NewJob(executor="noop", spec={})], now=SystemClock().now()
    )
    stop = asyncio.Event()
    readied = 0

    async def count(_: runtime.Runtime) -> None:
        nonlocal readied
        readied += 1

    task = asyncio.create_task(runtime.serve(s, stop, executors={"noop": slow}, on_ready=count))
    try:
        await eventually(beats.exists, what="a tick and a pass after the slow start")
        await eventually(lambda: slow.launches, what="the queued job launched")
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=PATIENCE)
    assert set(health.read(beats).loops) == {
        health.DISPATCHER,
        health.RECONCILER,
        health.SCHEDULER,
        health.ALERTER,
    }  # the alerter runs with no rule set: a tenant may make one
    assert slow.ready
    assert readied == 1
    assert slow.launches == {model.launch_name(job_id, 1): 1}
    assert slow.calls > 0, "the passes and ticks did ask the platform"
    assert slow.calls_before_ready == 0, "a pass or a tick asked the platform before it was ready"


def test_recovery_batch_must_cover_a_claim_batch() -> None:
    with pytest.raises(errors.ConfigError, match="one reconciler pass must be able to repair"):
        config.Settings.load(None, claim_batch_limit=200, recovery_batch_limit=100)


def _fields(a: model.Attempt) -> dict[str, object]:
    return {f: getattr(a, f) for f in a.__dataclass_fields__}


async def test_attempts_that_must_wait_do_not_starve_the_rest(
    db: store.Store, clock: FrozenClock
) -> None:
    platform = Platform()
    waiting = await running(db, clock, 3)  # absent, not yet past recovery_grace: they wait
    clock.advance(61)
    [launching] = await claimed(db, clock)  # behind them in fence order
    clock.advance(31)
    s = config.Settings(timeouts=TIMEOUTS, claim_batch_limit=1, recovery_batch_limit=2)
    r = reconciler.Reconciler(store=db, executors={"noop": platform}, clock=clock, settings=s)
    first, second = await r.run_once(), await r.run_once()
    assert (first.waiting, second.waiting, second.relaunched) == (2, 1, 1)
    assert (await attempt(db, launching)).state == A.RUNNING
    for c in waiting:
        assert (await attempt(db, c)).state == A.RUNNING


async def test_a_relaunch_that_keeps_failing_ends_past_recovery_grace(
    db: store.Store, clock: FrozenClock
) -> None:
    platform = Platform()
    [c] = await claimed(db, clock)
    platform.down_for_launch = True
    clock.advance(31)
    r = make(db, clock, platform)
    assert (await r.run_once()).unknown == 1
    assert (await attempt(db, c)).state == A.LAUNCHING, "not yet: the platform may recover"
    clock.advance(400)
    await r.run_once()
    a = await attempt(db, c)
    assert a.state == A.FAILED
    assert a.reason is not None
    assert a.reason.startswith("launch failed past recovery_grace")
    assert (await db.jobs.get(job_id=c.job.id)).state == J.QUEUED


async def test_a_timed_out_attempt_that_cannot_be_stopped_is_not_failed(
    db: store.Store, clock: FrozenClock
) -> None:
    platform = Platform()
    [c] = await running(db, clock)
    platform.put(launch_of(c))
    platform.cancel_fails = True
    clock.advance(241)
    r = make(db, clock, platform)
    await r.run_once()
    assert (await attempt(db, c)).state == A.RUNNING, "a retry must not run beside it"
    platform.cancel_fails = False
    await r.run_once()
    assert (await attempt(db, c)).state == A.FAILED


async def test_a_namesake_fence_is_not_an_orphan(db: store.Store, clock: FrozenClock) -> None:
    platform = Platform()
    [ended] = await running(db, clock)
    await db.attempts.finish(finishes=[Finish(ended.attempt.id, A.FAILED, 1, "x")], now=clock.now())
    other = model.Claimed(
        model.Job(**{**_fields(ended.job), "id": ended.job.id + 500}),  # type: ignore[arg-type]
        ended.attempt,
    )
    platform.put(launch_of(other))  # same fence, another job: a store restored from backup
    assert (await make(db, clock, platform).run_once()).orphans_cancelled == 0
    assert not platform.cancelled


class PodPlatform(Platform):
    """A platform whose launches leave parts that can outlive them (pods): `strays` is
    what `list_strays` answers, `stopped` the names `stop_stray` was given."""

    def __init__(self) -> None:
        super().__init__()
        self.strays: list[base.Stray] = []
        self.stopped: list[str] = []

    async def list_strays(self, selector: Mapping[str, str]) -> list[base.Stray]:
        return list(self.strays)

    async def stop_stray(self, stray: base.Stray) -> None:
        self.stopped.append(stray.name)


def stray_of(c: model.Claimed, *, launch_gone: bool) -> base.Stray:
    launch = launch_of(c)
    identity = model.identity_from_labels(launch.labels)
    return base.Stray(f"{launch.name}-pod", "default", "uid", launch.name, identity, launch_gone)


async def test_pods_whose_launch_is_gone_are_stopped_the_others_go_with_their_launch(
    db: store.Store, clock: FrozenClock
) -> None:
    # Fails on the code before strays: the sweep listed launches (Jobs) only, so a pod
    # orphaned by its Job's delete ran on beside the retry of its attempt. A pod whose
    # launch is still there is left to it: the launch of an ended attempt is the orphan
    # sweep's to stop (deleting the pod alone would end its Job failed first).
    platform = PodPlatform()
    [gone, ended, healthy] = await running(db, clock, 3)
    await db.attempts.finish(
        finishes=[Finish(ended.attempt.id, A.FAILED, 1, "gave up")], now=clock.now()
    )
    platform.strays = [
        stray_of(gone, launch_gone=True),
        stray_of(ended, launch_gone=False),
        stray_of(healthy, launch_gone=False),
    ]
    assert (await make(db, clock, platform).run_once()).orphans_cancelled == 1
    assert platform.stopped == [f"{gone.attempt.launch_name}-pod"]
