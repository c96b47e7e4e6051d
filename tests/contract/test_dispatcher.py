"""The dispatch cycle on both databases, with executor doubles that finish at once."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import timedelta
from typing import Any

import pytest

from corral import config, dispatcher, errors, launching, model, retry, store, timeouts
from corral.store import attempts as store_attempts
from corral.store import jobs as store_jobs
from corral.testing import FrozenClock, PausedClock
from tests.support import jobs
from tests.support.noop import NoopExecutor
from tests.support.wait import PATIENCE, eventually

J, A = model.JobState, model.AttemptState


class FlakyLaunch(NoopExecutor):
    """Refuses to launch the names in `refuse`."""

    def __init__(self, refuse: set[str]) -> None:
        super().__init__()
        self.refuse = refuse

    async def launch(self, launch: launching.Launch) -> None:
        if launch.name in self.refuse:
            raise errors.ExecutorError(f"platform said no to {launch.name}")
        await super().launch(launch)


def make(
    db: store.Store, clock: FrozenClock, executor: NoopExecutor, **settings: object
) -> dispatcher.Dispatcher:
    return dispatcher.Dispatcher(
        store=db,
        executors={"noop": executor},
        clock=clock,
        settings=config.Settings(**settings),  # type: ignore[arg-type]
    )


async def submit(db: store.Store, clock: FrozenClock, n: int, **kw: object) -> list[int]:
    new = [model.NewJob(executor="noop", spec={}, **kw) for _ in range(n)]  # type: ignore[arg-type]
    return await jobs.submit(db, clock, *new)


async def deliver(
    d: dispatcher.Dispatcher, executor: NoopExecutor, count: int
) -> list[store.Outcome]:
    """Hand `count` pushed observations to the dispatcher and write them."""
    events = executor.events()
    for _ in range(count):
        d.completions.offer(await asyncio.wait_for(anext(events), timeout=PATIENCE))
    return await d.completions.flush()


async def _count(db: store.Store, state: str, n: int) -> bool:
    return (await db.jobs.count_by_state()).get(state) == n


async def _is(db: store.Store, job_id: int, state: J) -> bool:
    return (await db.jobs.get(job_id=job_id)).state == state


async def states(db: store.Store, ids: list[int]) -> list[str]:
    return [(await db.jobs.get(job_id=i)).state for i in ids]


async def test_a_tick_claims_launches_and_records_running(
    db: store.Store, clock: FrozenClock
) -> None:
    executor = NoopExecutor()
    d = make(db, clock, executor, claim_batch_limit=3)
    ids = await submit(db, clock, 5)
    tick = await d.run_once()
    assert tick == dispatcher.Tick(claimed=3, launched=3, launch_errors=0, recorded=3)
    assert executor.launched == 3
    launch = next(iter(executor.launches.values()))
    assert model.identity_from_labels(launch.labels) == launch.identity
    assert launch.env["CORRAL_FENCE"] == str(launch.fence)
    assert not any(launch.relaunch for launch in executor.launches.values()), "first launches"
    assert await states(db, ids) == [J.RUNNING] * 3 + [J.QUEUED] * 2
    outcomes = await deliver(d, executor, 3)
    assert {o.job_state for o in outcomes} == {J.SUCCEEDED}
    assert await states(db, ids[:3]) == [J.SUCCEEDED] * 3


async def test_a_launch_error_leaves_the_attempt_for_recovery(
    db: store.Store, clock: FrozenClock
) -> None:
    ids = await submit(db, clock, 3)
    executor = FlakyLaunch(refuse={model.launch_name(ids[1], 1)})
    d = make(db, clock, executor)
    tick = await d.run_once()
    assert (tick.claimed, tick.launched, tick.launch_errors, tick.recorded) == (3, 2, 1, 2)
    [attempt] = await db.attempts.list(job_id=ids[1])
    assert attempt.state == A.LAUNCHING
    assert (
        await db.jobs.get(job_id=ids[1])
    ).state == J.RUNNING  # not lost: recovery adopts or relaunches it
    note = (await db.events.list(job_id=ids[1]))[-1]
    assert "launch failed: platform said no" in note.reason
    assert note.attempt_id == attempt.id


async def test_the_same_completion_twice_applies_once(db: store.Store, clock: FrozenClock) -> None:
    executor = NoopExecutor()
    d = make(db, clock, executor)
    [job_id] = await submit(db, clock, 1)
    await d.run_once()
    obs = await asyncio.wait_for(anext(executor.events()), timeout=PATIENCE)
    for _ in range(3):
        d.completions.offer(obs)
    assert len(await d.completions.flush()) == 1
    d.completions.offer(obs)
    assert await d.completions.flush() == []
    reasons = [e.to_state for e in await db.events.list(job_id=job_id)]
    assert reasons.count("succeeded") == 2  # once for the attempt, once for the job


async def test_failures_retry_after_a_jittered_backoff_until_attempts_run_out(
    db: store.Store, clock: FrozenClock
) -> None:
    executor = NoopExecutor(fail_exit_code=3)
    d = make(db, clock, executor, retry={"base": 10, "cap": 15, "seed": 7})
    same = retry.Backoff(10, 15, random.Random(7))  # the dispatcher's, seeded alike
    expected_delays = [same.delay(n) for n in (1, 2)]
    retry_3 = {
        "failure_rules": [{"on_exit_codes": {"operator": "In", "values": [3]}, "action": "retry"}]
    }
    [job_id] = await submit(db, clock, 1, max_attempts=3, policy=retry_3)
    for n, expected in enumerate((J.QUEUED, J.QUEUED, J.FAILED), start=1):
        assert (await d.run_once()).launched == 1
        failed_at = clock.now()
        [outcome] = await deliver(d, executor, 1)
        assert outcome.job_state == expected
        if expected == J.QUEUED:
            job = await db.jobs.get(job_id=job_id)
            assert job.run_at == failed_at + timedelta(seconds=expected_delays[n - 1]), (
                "seeded: exact"
            )
            assert job.run_at - failed_at <= timedelta(seconds=min(15, 10 * 2 ** (n - 1)))
            assert await d.run_once() == dispatcher.Tick(), "not due before its backoff"
            clock.advance(16)
    attempts = await db.attempts.list(job_id=job_id)
    assert [(a.attempt_no, a.state, a.exit_code) for a in attempts] == [
        (n, A.FAILED, 3) for n in (1, 2, 3)
    ]
    assert await d.run_once() == dispatcher.Tick()


async def test_an_observation_with_another_fence_is_ignored(
    db: store.Store, clock: FrozenClock
) -> None:
    executor = NoopExecutor()
    d = make(db, clock, executor)
    await submit(db, clock, 1)
    await d.run_once()
    obs = await asyncio.wait_for(anext(executor.events()), timeout=PATIENCE)
    assert not d.completions.offer(obs, fence=obs.identity.fence + 1 if obs.identity else 0)


async def test_polling_completes_attempts_launched_before_a_restart(
    db: store.Store, clock: FrozenClock
) -> None:
    executor = NoopExecutor()
    ids = await submit(db, clock, 4)
    await make(db, clock, executor, claim_batch_limit=4).run_once()
    # A new dispatcher (a restart) never saw the pushed events; it finds them by polling.
    fresh = make(db, clock, executor, claim_batch_limit=3)
    assert await fresh.completions.poll_once() == 4
    await fresh.completions.flush()
    assert await states(db, ids) == [J.SUCCEEDED] * 4


async def test_run_drains_the_queue_and_stops_cleanly(db: store.Store) -> None:
    clock = PausedClock()  # the loop's own sleeps must not move time
    executor = NoopExecutor()
    d = make(db, clock, executor, claim_batch_limit=10)
    ids = await submit(db, clock, 35)
    stop = asyncio.Event()
    runner = asyncio.create_task(d.run(stop))
    await eventually(lambda: _count(db, "succeeded", 35), what="35 jobs succeeded")
    stop.set()
    await asyncio.wait_for(runner, timeout=PATIENCE)
    assert await states(db, ids) == [J.SUCCEEDED] * 35
    assert executor.launch_calls == 35


async def test_a_dispatcher_needs_an_executor(db: store.Store, clock: FrozenClock) -> None:
    empty: Mapping[str, NoopExecutor] = {}
    with pytest.raises(errors.ConfigError, match="executor"):
        dispatcher.Dispatcher(store=db, executors=empty, clock=clock, settings=config.Settings())


class GatedLaunch(NoopExecutor):
    """Holds every launch until `gate` opens, so a test can stop the loop mid-tick."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()

    async def launch(self, launch: launching.Launch) -> None:
        self.entered.set()
        await self.gate.wait()
        await super().launch(launch)


async def test_stop_finishes_the_launch_in_hand_and_claims_no_more(
    db: store.Store,
) -> None:
    clock = PausedClock()  # the loop's own sleeps must not move time
    executor = GatedLaunch()
    d = make(db, clock, executor, claim_batch_limit=10)
    first = await submit(db, clock, 3)
    stop = asyncio.Event()
    runner = asyncio.create_task(d.run(stop))
    await asyncio.wait_for(executor.entered.wait(), timeout=PATIENCE)
    stop.set()  # SIGTERM arrives while the tick's launches are in flight
    later = await submit(db, clock, 2)
    executor.gate.set()
    await asyncio.wait_for(runner, timeout=PATIENCE)
    assert executor.launched == 3
    for job_id in first:
        [attempt] = await db.attempts.list(job_id=job_id)
        assert attempt.state == A.SUCCEEDED, "launched, recorded and completed before exit"
    assert await states(db, later) == [J.QUEUED, J.QUEUED]


async def test_the_next_claim_is_made_while_a_tick_launches_and_launched_before_a_stop(
    db: store.Store,
) -> None:
    clock = PausedClock()
    executor = GatedLaunch()
    d = make(db, clock, executor, claim_batch_limit=5)
    ids = await submit(db, clock, 12)
    stop = asyncio.Event()
    runner = asyncio.create_task(d.run(stop))
    await asyncio.wait_for(executor.entered.wait(), timeout=PATIENCE)
    # The first tick's 5 launches are held; its claim was full, so the next 5 are claimed
    # meanwhile: ticks overlap by one claim, no more.
    await eventually(lambda: _count(db, "running", 10), what="a second claim during the launches")
    assert (await db.jobs.count_by_state())["queued"] == 2
    stop.set()
    executor.gate.set()
    await asyncio.wait_for(runner, timeout=PATIENCE)
    assert executor.launched == 10  # what was claimed ahead was launched before the stop
    assert await states(db, ids[10:]) == [J.QUEUED, J.QUEUED]
    for job_id in ids[:10]:
        [attempt] = await db.attempts.list(job_id=job_id)
        assert attempt.state != A.LAUNCHING, "nothing claimed is left for recovery"


async def tick_held_mid_launch(
    db: store.Store, clock: FrozenClock
) -> tuple[GatedLaunch, int, asyncio.Task[dispatcher.Tick]]:
    """A tick that has claimed one job and is held inside its launch (gate closed)."""
    executor = GatedLaunch()
    d = make(db, clock, executor)
    [job_id] = await submit(db, clock, 1)
    tick = asyncio.create_task(d.run_once())
    await asyncio.wait_for(executor.entered.wait(), timeout=PATIENCE)
    return executor, job_id, tick


async def test_a_job_cancelled_while_launching_is_stopped(
    db: store.Store, clock: FrozenClock
) -> None:
    executor, job_id, tick = await tick_held_mid_launch(db, clock)
    await db.jobs.cancel(job_id=job_id, now=clock.now(), reason="by test")  # claim done, launch not
    executor.gate.set()
    assert (await tick).recorded == 0
    await eventually(lambda: executor.cancelled, what="the launch was stopped")
    assert executor.cancelled == [model.launch_name(job_id, 1)]
    assert (await db.jobs.get(job_id=job_id)).state == J.CANCELLED


class FailingOnce(store.Store):
    """A store whose first completion write fails, like a database that blips."""

    failed = False

    def __init__(self, engine: Any) -> None:
        super().__init__(engine)
        outer, finish = self, self.attempts.finish

        class Attempts(store_attempts.Attempts):
            async def finish(self, **kwargs: Any) -> list[store.Outcome]:
                if not outer.failed:
                    outer.failed = True
                    raise errors.StoreError("database blipped")
                return await finish(**kwargs)

        self.attempts = Attempts(self.database)


async def test_completions_survive_a_failed_write(db_url: str) -> None:
    clock = PausedClock()  # the loop's own sleeps must not move time
    db = FailingOnce(store.Store.connect(db_url).database.engine)
    executor = NoopExecutor()
    d = make(db, clock, executor)  # type: ignore[arg-type]
    [job_id] = await submit(db, clock, 1)
    [claimed] = await db.jobs.claim(now=clock.now(), limit=1, executors=["noop"])
    launch = launching.build_launch(claimed, reach=launching.Reach(), deadline_seconds=None)
    finished = launching.Observation(
        launch.name, launching.Phase.SUCCEEDED, launch.labels, exit_code=0
    )
    stop = asyncio.Event()
    runner = asyncio.create_task(d.run(stop))
    d.completions.offer(finished)
    d.completions.offer(finished)  # a repeat while the first is pending is not queued twice
    await eventually(lambda: _is(db, job_id, J.SUCCEEDED), what="the job succeeded")
    stop.set()
    await asyncio.wait_for(runner, timeout=PATIENCE)
    assert db.failed
    assert (await db.jobs.get(job_id=job_id)).state == J.SUCCEEDED
    await db.close()


class WaitingFinish(store.Store):
    """A store whose completion writes wait at `gate`, like a write stuck on a row lock
    or a slow network."""

    def __init__(self, engine: Any) -> None:
        super().__init__(engine)
        self.gate = asyncio.Event()
        self.waiting = asyncio.Event()
        outer, finish = self, self.attempts.finish

        class Attempts(store_attempts.Attempts):
            async def finish(self, **kwargs: Any) -> list[store.Outcome]:
                outer.waiting.set()
                await outer.gate.wait()
                return await finish(**kwargs)

        self.attempts = Attempts(self.database)


async def test_a_completion_write_that_waits_does_not_hold_up_claims(db_url: str) -> None:
    db = WaitingFinish(store.Store.connect(db_url).database.engine)
    clock = PausedClock()  # the loop's own sleeps must not move time
    executor = NoopExecutor()
    d = make(db, clock, executor)  # type: ignore[arg-type]
    [first] = await submit(db, clock, 1)
    [claimed] = await db.jobs.claim(now=clock.now(), limit=1, executors=["noop"])
    launch = launching.build_launch(claimed, reach=launching.Reach(), deadline_seconds=None)
    d.completions.offer(
        launching.Observation(launch.name, launching.Phase.SUCCEEDED, launch.labels, exit_code=0)
    )
    stop = asyncio.Event()
    runner = asyncio.create_task(d.run(stop))
    try:
        await asyncio.wait_for(db.waiting.wait(), timeout=PATIENCE)  # that write now waits
        later = await submit(db, clock, 3)
        await eventually(lambda: executor.launched == 3, what="the next jobs were launched")
        assert set(await states(db, later)) <= {J.RUNNING, J.SUCCEEDED}, "and recorded"
        assert await states(db, [first]) == [J.RUNNING], "while the first one's write waits"
        db.gate.set()
        await eventually(lambda: _count(db, J.SUCCEEDED, 4), what="every job succeeded")
        assert await states(db, [first]) == [J.SUCCEEDED]
    finally:
        db.gate.set()
        stop.set()
        await asyncio.wait_for(runner, timeout=PATIENCE)
        await db.close()


async def test_a_failed_flush_keeps_the_completions_queued(db_url: str, clock: FrozenClock) -> None:
    db = FailingOnce(store.Store.connect(db_url).database.engine)
    d = make(db, clock, NoopExecutor())  # type: ignore[arg-type]
    [job_id] = await submit(db, clock, 1)
    [claimed] = await db.jobs.claim(now=clock.now(), limit=1, executors=["noop"])
    launch = launching.build_launch(claimed, reach=launching.Reach(), deadline_seconds=None)
    d.completions.offer(
        launching.Observation(launch.name, launching.Phase.FAILED, launch.labels, exit_code=2)
    )
    with pytest.raises(errors.StoreError):
        await d.completions.flush()
    [outcome] = await d.completions.flush()
    assert (outcome.job_id, outcome.job_state) == (job_id, J.QUEUED)
    await db.close()


async def test_an_attempt_recovery_adopted_mid_launch_is_left_running(
    db: store.Store, clock: FrozenClock
) -> None:
    executor, job_id, tick = await tick_held_mid_launch(db, clock)
    [a] = await db.attempts.list(job_id=job_id)
    await db.attempts.record_running(fences=[a.id], now=clock.now(), reason="adopted")  # recovery
    executor.gate.set()
    await tick
    # A stop would be a task the tick started before it returned; ready tasks run before a
    # timer that is due later, and NoopExecutor.cancel never waits, so it would be in by
    # the end of this short sleep however loaded the machine.
    await asyncio.sleep(0.05)
    assert executor.cancelled == []


class ClockAdvancingLaunch(NoopExecutor):
    """The first launch takes longer than launch_grace (the clock moves 31s during it)."""

    def __init__(self, clock: FrozenClock) -> None:
        super().__init__()
        self.clock = clock

    async def launch(self, launch: launching.Launch) -> None:
        if not self.launches:
            self.clock.advance(31)
        await super().launch(launch)


async def test_a_launch_later_than_launch_grace_is_left_to_recovery(
    db: store.Store, clock: FrozenClock
) -> None:
    executor = ClockAdvancingLaunch(clock)
    d = make(db, clock, executor, launch_concurrency=1)
    _, second = await submit(db, clock, 2)
    tick = await d.run_once()
    # The slow launch also used up the tick's deadline: the second waits for the next tick,
    assert (tick.launched, tick.launch_errors, tick.carried) == (1, 0, 1)
    # which finds it past launch_grace and leaves it to recovery.
    tick = await d.run_once()
    assert (tick.claimed, tick.launched, tick.launch_errors, tick.carried) == (0, 0, 1, 0)
    [late] = await db.attempts.list(job_id=second)
    assert late.state == A.LAUNCHING
    assert "past launch_grace" in (await db.events.list(job_id=second))[-1].reason


class BlindClockAdvancingLaunch(ClockAdvancingLaunch):
    """As above, for attempts that leave nothing to observe (an HTTP request): each is
    recorded running before it is sent."""

    observable = False


async def test_an_attempt_recorded_before_its_send_and_never_sent_is_given_back_at_once(
    db: store.Store, clock: FrozenClock
) -> None:
    """Recovery would wait recovery_grace (minutes) before calling such an attempt lost:
    the dispatcher knows it never sent it, so its job is queued again at once, uncharged."""
    executor = BlindClockAdvancingLaunch(clock)
    d = make(db, clock, executor, launch_concurrency=1)
    _, second = await submit(db, clock, 2)
    tick = await d.run_once()
    assert (tick.launched, tick.carried) == (1, 1)
    [held] = await db.attempts.list(job_id=second)
    assert held.state == A.RUNNING, "recorded running before its send"
    tick = await d.run_once()  # past launch_grace: not sent, given back
    assert (tick.launched, tick.launch_errors, tick.carried) == (0, 0, 0)
    [unsent] = await db.attempts.list(job_id=second)
    assert (unsent.state, unsent.reason) == (A.SUPERSEDED, model.NEVER_LAUNCHED)
    job = await db.jobs.get(job_id=second)
    assert (job.state, job.uncharged_attempts) == (J.QUEUED, 1)
    await d.run_once()
    assert [a.state for a in await db.attempts.list(job_id=second)] == [A.SUPERSEDED, A.RUNNING]
    assert list(executor.launches)[-1].endswith("-2")


class BrokenStreamOnce(NoopExecutor):
    """Its event stream fails once; polling sees nothing, so only the stream can complete."""

    def __init__(self) -> None:
        super().__init__()
        self.broke = False

    async def observe(self, names: Sequence[str]) -> dict[str, launching.Observation]:
        return {n: launching.Observation(n, launching.Phase.RUNNING) for n in names}

    async def events(self) -> AsyncIterator[launching.Observation]:
        if not self.broke:
            self.broke = True
            raise errors.ExecutorError("watch connection dropped")
        async for obs in super().events():
            yield obs


async def test_a_broken_event_stream_is_restarted(db: store.Store) -> None:
    clock = PausedClock()  # the loop's own sleeps must not move time
    executor = BrokenStreamOnce()
    d = make(db, clock, executor)
    [job_id] = await submit(db, clock, 1)
    stop = asyncio.Event()
    runner = asyncio.create_task(d.run(stop))
    await eventually(lambda: _is(db, job_id, J.SUCCEEDED), what="the job succeeded")
    stop.set()
    await asyncio.wait_for(runner, timeout=PATIENCE)
    assert executor.broke
    assert (await db.jobs.get(job_id=job_id)).state == J.SUCCEEDED


class SlowLaunch(NoopExecutor):
    """Each launch takes 200ms of the (frozen) clock."""

    def __init__(self, clock: FrozenClock) -> None:
        super().__init__()
        self.clock = clock

    async def launch(self, launch: launching.Launch) -> None:
        await self.clock.sleep(0.2)
        await super().launch(launch)


async def test_a_tick_stops_launching_at_its_deadline_and_the_next_goes_on(
    db: store.Store, clock: FrozenClock
) -> None:
    executor = SlowLaunch(clock)
    d = make(
        db,
        clock,
        executor,
        claim_batch_limit=5,
        launch_concurrency=1,
        timeouts=timeouts.Timeouts(tick_deadline="500ms"),
    )
    await submit(db, clock, 12)
    ticks = []
    while len(ticks) < 20 and executor.launched < 12:
        ticks.append(await d.run_once())
    carried_in = 0
    for tick in ticks:
        assert tick.launched <= 3, "no launch starts past the 500ms deadline (200ms each)"
        assert tick.claimed + carried_in <= 5, "claimed and unlaunched never exceed a batch"
        carried_in = tick.carried
    assert ticks[0] == dispatcher.Tick(claimed=5, launched=3, recorded=3, carried=2)
    assert ticks[1].claimed == 3, "the next tick claims that many fewer"
    assert executor.launched == 12
    assert executor.launch_calls == 12, "every attempt launched once"


async def test_claims_made_ahead_never_pile_up_behind_slow_launches(
    db: store.Store, clock: FrozenClock
) -> None:
    """While `run` runs, a full claim starts the next one ahead; not while the launches
    lag behind, or claimed attempts would pile up past their launch_grace."""
    executor = SlowLaunch(clock)
    d = make(
        db,
        clock,
        executor,
        claim_batch_limit=5,
        launch_concurrency=1,
        timeouts=timeouts.Timeouts(tick_deadline="500ms"),
    )
    d._overlap = True  # as in run()
    await submit(db, clock, 60)
    waiting = []
    for _ in range(15):
        tick = await d.run_once()
        waiting.append(tick.carried)
    assert max(waiting) <= 5, f"claimed and not launched, tick by tick: {waiting}"
    assert executor.launched >= 15 * 2


class ClaimFailsOnce(store.Store):
    """A store whose second claim fails, like a database that blips mid-run."""

    claims = 0

    def __init__(self, engine: Any) -> None:
        super().__init__(engine)
        outer, claim = self, self.jobs.claim

        class Jobs(store_jobs.Jobs):
            async def claim(self, **kwargs: Any) -> list[model.Claimed]:
                outer.claims += 1
                if outer.claims == 2:
                    raise errors.StoreError("database blipped")
                return await claim(**kwargs)

        self.jobs = Jobs(self.database)


async def test_attempts_carried_to_the_next_tick_are_launched_when_the_claim_fails(
    db_url: str, clock: FrozenClock
) -> None:
    db = ClaimFailsOnce(store.Store.connect(db_url).database.engine)
    executor = SlowLaunch(clock)
    d = dispatcher.Dispatcher(
        store=db,
        executors={"noop": executor},
        clock=clock,
        settings=config.Settings(
            claim_batch_limit=5,
            launch_concurrency=1,
            timeouts=timeouts.Timeouts(tick_deadline="500ms"),
        ),
    )
    try:
        ids = await submit(db, clock, 5, max_attempts=1)
        assert (await d.run_once()).carried == 2
        with pytest.raises(errors.StoreError, match="blipped"):
            await d.run_once()  # the claim fails, and is said to have failed...
        assert executor.launched == 5, "...but the two held attempts are launched all the same"
        for job_id in ids:
            [attempt] = await db.attempts.list(job_id=job_id)
            assert attempt.state == A.RUNNING, "and recorded: their deadlines are running"
        assert (await d.run_once()).claimed == 0
    finally:
        await db.close()


class Waits(NoopExecutor):
    """Launches that stay on the platform, each observed as `seen` says (PENDING with a
    reason: a pod that has not started), until told otherwise."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, launching.Observation] = {}

    async def launch(self, launch: launching.Launch) -> None:
        self.launches.setdefault(launch.name, launch)
        self.seen.setdefault(launch.name, self.pending(launch.name, "ErrImagePull", "not found"))

    def pending(self, name: str, reason: str, message: str) -> launching.Observation:
        labels = self.launches[name].labels
        return launching.Observation(
            name,
            launching.Phase.PENDING,
            labels,
            reason=f"waiting to start: {reason}",
            message=message,
        )

    async def observe(self, names: Sequence[str]) -> dict[str, launching.Observation]:
        return {
            n: self.seen.get(n, launching.Observation(n, launching.Phase.ABSENT)) for n in names
        }


async def test_why_an_attempt_waits_on_its_platform_is_in_its_run_log_once(
    db: store.Store, clock: FrozenClock
) -> None:
    executor = Waits()
    d = make(db, clock, executor)
    (job_id,) = await submit(db, clock, 1)
    await d.run_once()
    (name,) = executor.launches

    async def notes() -> list[tuple[str, bool]]:
        _, _, events, _ = await db.jobs.record(job_id=job_id)
        return [(e.reason, e.details["waiting"]) for e in events if "waiting" in e.details]

    await d.completions.poll_once()
    await d.completions.poll_once()  # the same reason: not noted again
    assert await notes() == [("waiting to start: ErrImagePull: not found", True)]
    executor.seen[name] = executor.pending(name, "Unschedulable", "0/3 nodes are available")
    await d.completions.poll_once()
    executor.seen[name] = executor.pending(name, "ErrImagePull", "not found again")
    await d.completions.poll_once()  # back to a reason noted before: not noted again
    executor.seen[name] = launching.Observation(
        name, launching.Phase.RUNNING, executor.launches[name].labels
    )
    await d.completions.poll_once()
    await d.completions.poll_once()
    assert await notes() == [
        ("waiting to start: ErrImagePull: not found", True),
        ("waiting to start: Unschedulable: 0/3 nodes are available", True),
        ("started on its platform", False),
    ]
