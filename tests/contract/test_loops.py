"""Every loop's pulse on both databases: the loops table, the warnings of work nobody can
do (said once each time they begin), and recovery of the blind attempts a dead loop sent.
Time is the injected clock's."""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta

import pytest

from corral import client, config, loops, model, reconciler, store
from corral.testing import FrozenClock
from tests.support.noop import NoopExecutor

A, J = model.AttemptState, model.JobState
BEAT = timedelta(seconds=20)  # the default heartbeat_interval


def settings(**kw: object) -> config.Settings:
    return config.Settings(**kw)  # type: ignore[arg-type]


def pulse(db: store.Store, clock: FrozenClock, kind: str, *runs: str, **kw: object) -> loops.Pulse:
    return loops.Service(db, settings(**kw), clock).pulse(kind=kind, runs=runs or (kind,))


@contextlib.asynccontextmanager
async def started(p: loops.Pulse) -> AsyncIterator[loops.Pulse]:
    """`p.beating()` without its beats in the background: the test beats (`beat_once`)."""
    await p.start()
    try:
        yield p
    finally:
        await p.stop()


async def test_a_loop_is_recorded_beats_stops_and_is_forgotten_after_a_day(
    db: store.Store, clock: FrozenClock
) -> None:
    one = pulse(db, clock, "dispatcher")
    async with started(one):
        [row] = await db.loops.all()
        assert (row.id, row.kind, row.runs, row.stopped_at) == (
            one.id,
            "dispatcher",
            ("dispatcher",),
            None,
        )
        assert row.pid_started == loops.process_mark(row.pid)
        clock.advance(5)
        await one.beat_once()
        assert (await db.loops.all())[0].beat_at == clock.now()
    [row] = await db.loops.all()
    assert row.stopped_at == clock.now()
    clock.advance(loops.FORGET_AFTER.total_seconds() + 1)
    other = pulse(db, clock, "scheduler")
    async with started(other):
        await other.beat_once()
        assert [r.id for r in await db.loops.all()] == [other.id]


async def test_a_loop_forgotten_while_it_runs_writes_its_row_again(
    db: store.Store, clock: FrozenClock
) -> None:
    one = pulse(db, clock, "reconciler")
    async with started(one):
        clock.advance(loops.FORGET_AFTER.total_seconds() + 1)
        await pulse(db, clock, "api").beat_once()  # another loop forgets the silent row
        assert one.id not in [r.id for r in await db.loops.all()]
        await one.beat_once()
        assert one.id in [r.id for r in await db.loops.all()]


async def _due_schedule(db: store.Store, clock: FrozenClock) -> None:
    c = client.Client(
        store=db, executors={"noop": NoopExecutor()}, settings=settings(), clock=clock
    )
    await c.schedule_create("tick", every="1m", spec={"command": ["true"]}, executor="noop")


async def test_due_schedules_and_no_scheduler_are_said_once_and_again_after_one_came_and_went(
    db: store.Store, clock: FrozenClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="corral.loops")
    dispatcher = pulse(db, clock, "dispatcher")
    async with started(dispatcher):
        assert await dispatcher.beat_once() == []  # nothing is due: nothing to say
        await _due_schedule(db, clock)
        [began] = await dispatcher.beat_once()
        assert began.condition == loops.NO_SCHEDULER
        assert await dispatcher.beat_once() == []  # once, however often it is seen
        scheduler = pulse(db, clock, "scheduler")
        async with started(scheduler):
            await dispatcher.beat_once()
            [warning] = await db.loops.warnings()
            assert warning.ended_at == clock.now()  # a scheduler beats: it ended
        [again] = await dispatcher.beat_once()  # it stopped: gone, so said again
        assert again.condition == loops.NO_SCHEDULER
        said = [r for r in caplog.records if "no scheduler is running" in r.getMessage()]
        assert len(said) == 2
    [again, first] = await db.loops.warnings()
    assert (again.ended_at, first.ended_at) == (None, first.ended_at)


async def test_a_scheduler_silent_for_three_beats_no_longer_counts(
    db: store.Store, clock: FrozenClock
) -> None:
    await _due_schedule(db, clock)
    far = replace(pulse(db, clock, "scheduler").loop, host="another-host")
    await db.loops.register(loop=far)  # it beats no more: killed, say
    dispatcher = pulse(db, clock, "dispatcher")
    async with started(dispatcher):
        clock.advance(3 * BEAT.total_seconds())
        assert await dispatcher.beat_once() == []
        clock.advance(1)
        [began] = await dispatcher.beat_once()
        assert began.condition == loops.NO_SCHEDULER


async def test_many_processes_seeing_a_condition_begin_say_it_once(
    db: store.Store, clock: FrozenClock
) -> None:
    await _due_schedule(db, clock)
    seen = [pulse(db, clock, "dispatcher") for _ in range(3)]
    for p in seen:
        await db.loops.register(loop=p.loop)
    begun = [w for p in seen for w in await p.beat_once()]
    assert len(begun) == 1
    assert len(await db.loops.warnings(open_only=True)) == 1


async def test_a_warning_nobody_judges_any_more_ends(db: store.Store, clock: FrozenClock) -> None:
    """Only a process with alert rules judges the alerter's condition: once it is gone,
    the warning it began ends after three beats, not never."""
    rules = {
        "channels": {"hook": {"kind": "webhook", "url": "http://127.0.0.1:9/hook"}},
        "rules": {"all": {"on": ["quarantined"], "channels": ["hook"]}},
    }
    alerting = pulse(db, clock, "dispatcher", alerts=rules)
    async with started(alerting):
        [began] = await alerting.beat_once()
        assert began.condition == loops.NO_ALERTER
    plain = pulse(db, clock, "dispatcher")
    async with started(plain):
        clock.advance(3 * BEAT.total_seconds() + 1)
        await plain.beat_once()
    assert await db.loops.warnings(open_only=True) == []


async def test_status_lists_every_loop_with_its_liveness_and_the_warnings(
    db: store.Store, clock: FrozenClock
) -> None:
    await _due_schedule(db, clock)
    running = pulse(db, clock, "dispatcher")
    await db.loops.register(loop=running.loop)
    gone = _dead_loop(db, clock)
    await db.loops.register(loop=gone)
    found = await loops.Service(db, settings(), clock).status()
    assert {(loop.id, state) for loop, state in found.loops} == {
        (running.id, loops.Liveness.LIVE),
        (gone.id, loops.Liveness.GONE),
    }
    assert list(found.warnings) == [loops.NO_SCHEDULER]


def _dead_loop(db: store.Store, clock: FrozenClock) -> loops.Loop:
    """A loop whose process ran on this host and is gone."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        mark = loops.process_mark(child.pid)
    finally:
        child.kill()
        child.wait()
    dead = pulse(db, clock, "serve", "dispatcher", "reconciler").loop
    return replace(dead, pid=child.pid, pid_started=mark)


async def _blind(db: store.Store, clock: FrozenClock, sender: str) -> model.Claimed:
    """An attempt recorded running before it was sent, by `sender`."""
    await db.jobs.submit(new=[model.NewJob(executor="noop", spec={})], now=clock.now())
    [c] = await db.jobs.claim(now=clock.now(), limit=1, executors=["noop"])
    await db.attempts.record_running(
        fences=[c.attempt.id], now=clock.now(), reason="sent blind", sent_by=sender
    )
    return c


async def test_the_blind_attempts_of_a_dead_sender_are_lost_at_once_and_retried(
    db: store.Store, clock: FrozenClock
) -> None:
    dead = _dead_loop(db, clock)
    await db.loops.register(loop=dead)
    alive = pulse(db, clock, "serve", "dispatcher")
    await db.loops.register(loop=alive.loop)
    lost = await _blind(db, clock, dead.id)
    kept = await _blind(db, clock, alive.id)
    r = reconciler.Reconciler(
        store=db, executors={"noop": NoopExecutor()}, clock=clock, settings=settings()
    )
    done = await r.run_once()
    assert done.lost == 1
    [a] = await db.attempts.list(job_id=lost.job.id)
    assert a.state == A.LOST
    assert f"serve pid {dead.pid}" in (a.reason or "")
    assert "gone" in (a.reason or "")
    assert (await db.jobs.get(job_id=lost.job.id)).state == J.QUEUED  # its retry, a new fence
    assert [a.state for a in await db.attempts.list(job_id=kept.job.id)] == [A.RUNNING]
    assert (await r.run_once()).lost == 0


async def test_a_sender_silent_for_three_beats_elsewhere_is_dead_too(
    db: store.Store, clock: FrozenClock
) -> None:
    far = replace(pulse(db, clock, "dispatcher").loop, host="another-host")
    await db.loops.register(loop=far)
    c = await _blind(db, clock, far.id)
    r = reconciler.Reconciler(
        store=db, executors={"noop": NoopExecutor()}, clock=clock, settings=settings()
    )
    assert (await r.run_once()).lost == 0
    clock.advance(3 * BEAT.total_seconds() + 1)
    assert (await r.run_once()).lost == 1
    assert [a.state for a in await db.attempts.list(job_id=c.job.id)] == [A.LOST]


async def test_a_warning_is_kept_a_week_after_it_ended(db: store.Store, clock: FrozenClock) -> None:
    await _due_schedule(db, clock)
    one = pulse(db, clock, "dispatcher")
    async with started(one):
        [began] = await one.beat_once()
        scheduler = pulse(db, clock, "scheduler")
        await scheduler.start()
        await one.beat_once()  # ended
        clock.advance(loops.WARNINGS_KEPT.total_seconds() - 1)
        await scheduler.beat_once()
        assert [w.id for w in await db.loops.warnings()] == [began.id]
        clock.advance(2)
        await scheduler.beat_once()
        assert await db.loops.warnings() == []


async def test_after_an_outage_a_silence_counts_only_once_this_process_beats_steadily(
    db: store.Store, clock: FrozenClock
) -> None:
    """The database was away: every loop's last beat is old, the reconciler's own too. A
    sender elsewhere that is as silent is not taken for dead until this process has beaten
    without a miss for four heartbeats, time in which a live sender beats again; one
    whose process is gone from this host is dead at once."""
    far = replace(pulse(db, clock, "dispatcher").loop, host="another-host")
    await db.loops.register(loop=far)
    cut = await _blind(db, clock, far.id)
    gone = _dead_loop(db, clock)
    await db.loops.register(loop=gone)
    lost_at_once = await _blind(db, clock, gone.id)
    clock.advance(10 * BEAT.total_seconds())  # the outage
    own = pulse(db, clock, "serve", "dispatcher", "reconciler")
    await own.start()
    r = reconciler.Reconciler(
        store=db, executors={"noop": NoopExecutor()}, clock=clock, settings=settings(), pulse=own
    )
    assert (await r.run_once()).lost == 1
    assert [a.state for a in await db.attempts.list(job_id=lost_at_once.job.id)] == [A.LOST]
    for _ in range(loops.STALE_BEATS):
        clock.advance(BEAT.total_seconds())
        await own.beat_once()
        assert (await r.run_once()).lost == 0  # not yet: the sender may be beating again
    clock.advance(BEAT.total_seconds())
    await own.beat_once()
    assert (await r.run_once()).lost == 1
    assert [a.state for a in await db.attempts.list(job_id=cut.job.id)] == [A.LOST]
