"""Run logs on both databases: each attempt's output is kept in the transaction that ends
it (the hot path's settle and the general one), once, and goes with its job once the job's
retention is over."""

from __future__ import annotations

from datetime import timedelta

from corral import config, launching, maintenance, model, reconciler, store
from corral.store import Finish
from corral.testing import FrozenClock
from tests.support.platform import Platform

A, J = model.AttemptState, model.JobState

LOG = launching.RunLog(
    streams=(
        launching.Stream(
            "request", "POST https://example.com/hook\nAuthorization: [redacted]\n", 48
        ),
        launching.Stream(
            "response", "HTTP 200 OK\ncontent-type: text/plain\n\nthanks é", 52, cut=True
        ),
    ),
    latency=0.035,
    status=200,
    address="93.184.216.34",
)


async def _claimed(db: store.Store, clock: FrozenClock, n: int = 1) -> list[model.Claimed]:
    await db.jobs.submit(
        new=[model.NewJob(executor="noop", spec={}, max_attempts=2) for _ in range(n)],
        now=clock.now(),
    )
    return await db.jobs.claim(now=clock.now(), limit=n, executors=["noop"])


async def test_a_success_settled_on_the_hot_path_keeps_its_run_log(
    db: store.Store, clock: FrozenClock
) -> None:
    quiet, loud = await _claimed(db, clock, 2)
    finishes = [
        Finish(quiet.attempt.id, A.SUCCEEDED, 0, None, output=launching.RunLog(latency=0.5)),
        Finish(loud.attempt.id, A.SUCCEEDED, None, "HTTP 200 OK", output=LOG),
    ]
    _, outcomes = await db.attempts.settle(launched=[], finishes=finishes, now=clock.now())
    assert len(outcomes) == 2
    [kept] = (await db.runlogs.of_job(job_id=loud.job.id)).values()
    expected = LOG.__class__(**{**_fields(LOG), "fence": loud.attempt.id})
    assert {**_fields(kept), "recorded_at": None} == _fields(expected)
    assert kept.recorded_at == clock.now()
    assert await db.runlogs.of_job(job_id=quiet.job.id) == {}  # nothing printed: nothing written


async def test_a_failure_keeps_its_run_log_and_a_repeat_writes_nothing(
    db: store.Store, clock: FrozenClock
) -> None:
    [c] = await _claimed(db, clock)
    out = launching.RunLog(
        streams=(launching.Stream("stderr", "Traceback ...\nboom\n", 20),), latency=1.5
    )
    failed = Finish(c.attempt.id, A.FAILED, 1, "exited with code 1", output=out)
    await db.attempts.finish(finishes=[failed], now=clock.now())
    again = Finish(c.attempt.id, A.FAILED, 2, "exited with code 2", output=LOG)
    assert await db.attempts.finish(finishes=[again], now=clock.now()) == []
    logs = await db.runlogs.of_job(job_id=c.job.id)
    assert [(f, log.streams, log.latency) for f, log in logs.items()] == [
        (c.attempt.id, out.streams, 1.5)
    ]
    [job] = await db.jobs.list()
    assert job.state == J.QUEUED  # the retry follows as before


async def test_a_stale_success_keeps_no_run_log(db: store.Store, clock: FrozenClock) -> None:
    """An attempt that already ended (here: cancelled with its job) is not ended again by a
    late success, and its output is not kept under it."""
    [c] = await _claimed(db, clock)
    await db.jobs.cancel(job_id=c.job.id, now=clock.now(), reason="by a test")
    late = Finish(c.attempt.id, A.SUCCEEDED, 0, None, output=LOG)
    await db.attempts.settle(launched=[], finishes=[late], now=clock.now())
    assert await db.runlogs.of_job(job_id=c.job.id) == {}


async def test_finished_jobs_go_after_their_retention_with_all_they_hold(
    db: store.Store, clock: FrozenClock
) -> None:
    old_ok, old_failed, old_dead, old_running = await _claimed(db, clock, 4)
    await db.attempts.settle(
        launched=[old_running.attempt.id],
        finishes=[Finish(old_ok.attempt.id, A.SUCCEEDED, 0, None, output=LOG)],
        now=clock.now(),
    )
    await db.sinks.checkpoint_save(
        job_id=old_ok.job.id, fence=old_ok.attempt.id, state={"at": 1}, now=clock.now()
    )
    await db.jobs.cancel(job_id=old_failed.job.id, now=clock.now(), reason="by a test")
    permanent = Finish(old_dead.attempt.id, A.FAILED, 2, None, model.FailureClass.PERMANENT)
    await db.attempts.finish(finishes=[permanent], now=clock.now())
    clock.advance(timedelta(days=2).total_seconds())
    [young] = await _claimed(db, clock)
    await db.attempts.settle(
        launched=[], finishes=[Finish(young.attempt.id, A.SUCCEEDED, 0, None)], now=clock.now()
    )

    removed = await db.runlogs.forget(before=clock.now() - timedelta(days=1), limit=1)
    assert removed == 1
    assert await db.runlogs.forget(before=clock.now() - timedelta(days=1), limit=10) == 1
    assert await db.runlogs.forget(before=clock.now() - timedelta(days=1), limit=10) == 0

    left = {j.id: j.state for j in await db.jobs.list()}
    assert left == {
        old_dead.job.id: J.QUARANTINED,  # waits for a person, however long
        old_running.job.id: J.RUNNING,
        young.job.id: J.SUCCEEDED,  # not old enough
    }
    for gone in (old_ok, old_failed):
        assert await db.attempts.list(job_id=gone.job.id) == []
        assert await db.events.list(job_id=gone.job.id) == []
        assert await db.runlogs.of_job(job_id=gone.job.id) == {}
        assert await db.sinks.checkpoint_load(job_id=gone.job.id) is None


async def test_the_jobs_holding_the_highest_ids_are_kept_so_no_id_is_given_twice(
    db: store.Store, clock: FrozenClock
) -> None:
    """SQLite gives a new row the highest id + 1: were the rows holding the highest job id,
    fence or event id removed, the next job would get an id, a fence and a launch name
    that were given before."""
    a, b, c = await _claimed(db, clock, 3)
    for one in (c, a, b):  # c holds the highest job id and fence, b the highest event id
        await db.attempts.settle(
            launched=[], finishes=[Finish(one.attempt.id, A.SUCCEEDED, 0, None)], now=clock.now()
        )
    clock.advance(timedelta(days=2).total_seconds())
    assert await db.runlogs.forget(before=clock.now() - timedelta(days=1), limit=10) == 1
    assert {j.id for j in await db.jobs.list()} == {b.job.id, c.job.id}
    [d] = await _claimed(db, clock)
    assert d.job.id > c.job.id
    assert d.attempt.id > c.attempt.id
    events = await db.events.list(job_id=d.job.id)
    assert min(e.id for e in events) > max(e.id for e in await db.events.list(job_id=b.job.id))


async def test_the_reconciler_removes_old_jobs_and_looks_again_later(
    db: store.Store, clock: FrozenClock
) -> None:
    [c] = await _claimed(db, clock)
    await db.attempts.settle(
        launched=[], finishes=[Finish(c.attempt.id, A.SUCCEEDED, 0, None)], now=clock.now()
    )
    message = {  # a message sent about it
        "dedupe_key": "k",
        "rule": "r",
        "channel": "hook",
        "kind": "alert",
        "cause": "failed",
        "subject": "queue:default",
        "job_id": c.job.id,
        "details": {},
        "due_at": clock.now(),
    }
    sent = await db.alerts.add(message=message, now=clock.now())
    await db.alerts.tried(alert_id=sent, now=clock.now(), error=None, retry_at=None)
    settings = config.Settings(retention=config.RetentionSettings(jobs=timedelta(days=30)))
    r = reconciler.Reconciler(
        store=db, executors={"noop": Platform()}, clock=clock, settings=settings
    )
    clock.advance(timedelta(days=30).total_seconds() - 1)
    assert (await r.run_once()).jobs_removed == 0  # one second too young
    assert [a.id for a in await db.alerts.list()] == [sent]
    clock.advance(2)
    assert (await r.run_once()).jobs_removed == 0  # old now, but looked a moment ago
    clock.advance(maintenance.RETENTION_EVERY)
    assert (await r.run_once()).jobs_removed == 0  # the newest job is kept, however old
    assert await db.alerts.list() == []  # the message goes with its age
    [d] = await _claimed(db, clock)
    clock.advance(maintenance.RETENTION_EVERY)
    assert (await r.run_once()).jobs_removed == 1
    assert [j.id for j in await db.jobs.list()] == [d.job.id]


def _fields(log: launching.RunLog) -> dict[str, object]:
    return {name: getattr(log, name) for name in log.__slots__}  # type: ignore[attr-defined]


async def test_a_platform_that_gives_only_a_message_has_it_as_its_run_log(
    db: store.Store, clock: FrozenClock
) -> None:
    """A container's termination message is all a Kubernetes attempt says of itself."""
    [c] = await _claimed(db, clock)
    obs = launching.Observation(
        c.attempt.launch_name, launching.Phase.FAILED, exit_code=1, message="ValueError: bad row 7"
    )
    await db.attempts.finish(finishes=[Finish.seen(c.attempt.id, obs)], now=clock.now())
    [kept] = (await db.runlogs.of_job(job_id=c.job.id)).values()
    assert kept.streams == (launching.Stream("message", "ValueError: bad row 7", 21),)
