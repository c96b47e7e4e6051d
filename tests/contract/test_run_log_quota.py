"""Each tenant's run_log_bytes on both databases: what a tenant keeps is counted as its logs
are written (by the hot path's settle and the general one), and the reconciler trims a
tenant over its quota, its oldest finished jobs' logs first, never a quarantined job's nor
one of a job that may run again, and never another tenant's."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest

from corral import access, config, launching, maintenance, model, reconciler, store, tenancy, usage
from corral.store import Finish
from corral.testing import FrozenClock
from tests.support.platform import Platform

A, J = model.AttemptState, model.JobState
KB = 1000


def _output(size: int, text: str = "x") -> launching.RunLog:
    """A run log of `size` bytes of stdout (`text` is one character, of any UTF-8 width)."""
    width = len(text.encode())
    return launching.RunLog(streams=(launching.Stream("stdout", text * (size // width), size),))


async def _running(
    db: store.Store, clock: FrozenClock, tenant: str, *, attempts: int = 1
) -> model.Claimed:
    """A job of `tenant` submitted and claimed (no other job is due meanwhile)."""
    new = model.NewJob(executor="noop", spec={}, tenant=tenant, max_attempts=attempts)
    await db.jobs.submit(new=[new], now=clock.now())
    [claimed] = await db.jobs.claim(now=clock.now(), limit=1, executors=["noop"])
    assert claimed.job.tenant == tenant
    return claimed


async def _succeeded(db: store.Store, clock: FrozenClock, tenant: str, size: int) -> int:
    """A job of `tenant` that succeeded with `size` bytes of output, settled as the hot
    path settles successes; its id."""
    c = await _running(db, clock, tenant)
    won = Finish(c.attempt.id, A.SUCCEEDED, 0, None, output=_output(size))
    await db.attempts.settle(launched=[], finishes=[won], now=clock.now())
    clock.advance(1)
    return c.job.id


async def _failed(
    db: store.Store,
    clock: FrozenClock,
    tenant: str,
    size: int,
    *,
    attempts: int = 1,
    failure_class: model.FailureClass | None = None,
) -> model.Claimed:
    """A job of `tenant` whose attempt failed with `size` bytes of output (the general
    path's finish), of `attempts` attempts at most, its failure of `failure_class`."""
    c = await _running(db, clock, tenant, attempts=attempts)
    lost = Finish(c.attempt.id, A.FAILED, 1, "exit 1", failure_class, output=_output(size))
    await db.attempts.finish(finishes=[lost], now=clock.now())
    clock.advance(1)
    return c


async def _trimmed(db: store.Store, job_id: int) -> list[tuple[bool, int]]:
    """Each run log of a job: (whether it was trimmed, the bytes of output it still has)."""
    logs = await db.runlogs.of_job(job_id=job_id)
    return [
        (log.trimmed_at is not None, sum(len(s.text.encode()) for s in log.streams))
        for log in logs.values()
    ]


def _reconciler(db: store.Store, clock: FrozenClock, **quotas: int) -> reconciler.Reconciler:
    """A reconciler whose tenants keep `quotas` run-log bytes each (by name)."""
    tenants = {name: tenancy.TenantSettings(run_log_bytes=n) for name, n in quotas.items()}
    settings = config.Settings(tenants=tenants)
    return reconciler.Reconciler(
        store=db, executors={"noop": Platform()}, clock=clock, settings=settings
    )


async def test_each_run_log_counts_toward_its_job_s_tenant(
    db: store.Store, clock: FrozenClock
) -> None:
    await _succeeded(db, clock, "a", 3 * KB)
    await _failed(db, clock, "a", 2 * KB)
    await _succeeded(db, clock, "b", KB)
    wide = await _running(db, clock, "b")
    output = _output(30, "é")  # 15 characters, two bytes each
    won = Finish(wide.attempt.id, A.SUCCEEDED, 0, None, output=output)
    await db.attempts.settle(launched=[], finishes=[won], now=clock.now())
    assert await db.runlogs.kept() == {"a": 5 * KB, "b": KB + 30}
    assert await db.runlogs.kept(tenant="b") == {"b": KB + 30}
    assert await db.runlogs.kept(tenant="c") == {}


async def test_a_tenant_over_its_run_log_bytes_loses_its_oldest_finished_jobs_logs_first(
    db: store.Store, clock: FrozenClock, caplog: pytest.LogCaptureFixture
) -> None:
    poison = await _failed(db, clock, "a", KB, failure_class=model.FailureClass.PERMANENT)
    cancelled = await _failed(db, clock, "a", KB, attempts=2)
    await db.jobs.cancel(job_id=cancelled.job.id, now=clock.now(), reason="by a test")
    clock.advance(1)
    oldest = await _succeeded(db, clock, "a", KB)
    failed = await _failed(db, clock, "a", KB)
    newest = await _succeeded(db, clock, "a", KB)
    theirs = await _succeeded(db, clock, "b", 10 * KB)  # over a's quota: b's own is 1 GiB
    again = await _failed(db, clock, "a", KB, attempts=2)  # queued again, to retry
    clock.advance(3600)  # the retry is due: it runs again, its first attempt's log kept
    [rerun] = await db.jobs.claim(now=clock.now(), limit=1, executors=["noop"])
    assert rerun.job.id == again.job.id
    assert await db.runlogs.kept() == {"a": 6 * KB, "b": 10 * KB}

    r = _reconciler(db, clock, a=3 * KB)
    with caplog.at_level(logging.INFO, logger="corral.reconciler"):
        assert (await r.run_once()).logs_trimmed == 3
    # 3,000 bytes over: the oldest finished jobs' logs go first, as many as that takes.
    for job_id in (cancelled.job.id, oldest, failed.job.id):
        assert await _trimmed(db, job_id) == [(True, 0)]
    for job_id in (newest, poison.job.id, again.job.id):  # kept; quarantined; running again
        assert await _trimmed(db, job_id) == [(False, KB)]
    assert await _trimmed(db, theirs) == [(False, 10 * KB)]
    assert await db.runlogs.kept() == {"a": 3 * KB, "b": 10 * KB}
    [said] = [r.getMessage() for r in caplog.records if "run_log_bytes" in r.getMessage()]
    assert said == (
        "tenant 'a' kept 6000 bytes of run logs, over its run_log_bytes 3000: trimmed 3 logs"
        f" (3000 bytes) of its oldest finished jobs, jobs {cancelled.job.id}, {oldest},"
        f" {failed.job.id}"
    )

    caplog.clear()
    tighter = _reconciler(db, clock, a=KB // 2)
    with caplog.at_level(logging.INFO, logger="corral.reconciler"):
        assert (await tighter.run_once()).logs_trimmed == 1
    assert await _trimmed(db, newest) == [(True, 0)]
    assert await db.runlogs.kept() == {"a": 2 * KB, "b": 10 * KB}  # the rest is not its to take
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == [
        "tenant 'a' keeps 1500 bytes of run logs past its run_log_bytes 500 that no trim may"
        " take: its quarantined jobs' logs, and those of jobs not finished"
    ]
    clock.advance(maintenance.TRIM_EVERY)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="corral.reconciler"):
        assert (await tighter.run_once()).logs_trimmed == 0
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]  # said once


async def test_a_trimmed_log_keeps_its_facts_and_says_when(
    db: store.Store, clock: FrozenClock
) -> None:
    c = await _running(db, clock, "a")
    log = launching.RunLog(
        streams=(launching.Stream("response", "HTTP 500\n\n" + "x" * 990, 1000),),
        latency=0.25,
        status=500,
        address="192.0.2.7",
    )
    await db.attempts.finish(
        finishes=[Finish(c.attempt.id, A.FAILED, None, "HTTP 500", output=log)], now=clock.now()
    )
    done = await db.runlogs.trim(tenant="a", over=1, limit=10, now=clock.now())
    assert (done.logs, done.bytes, done.jobs, done.more) == (1, 1000, (c.job.id,), False)
    [kept] = (await db.runlogs.of_job(job_id=c.job.id)).values()
    assert (kept.streams, kept.status, kept.latency, kept.address) == ((), 500, 0.25, "192.0.2.7")
    assert kept.trimmed_at == clock.now()
    again = await db.runlogs.trim(tenant="a", over=1, limit=10, now=clock.now())
    assert again.logs == 0  # nothing left to take


async def test_a_trim_goes_in_batches_and_the_next_pass_goes_on(
    db: store.Store, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(maintenance, "TRIM_BATCH", 2)
    monkeypatch.setattr(maintenance, "TRIM_BATCHES", 2)
    jobs = [await _succeeded(db, clock, "a", KB) for _ in range(6)]
    r = _reconciler(db, clock, a=KB)
    assert (await r.run_once()).logs_trimmed == 4  # two batches of two a pass
    assert [await _trimmed(db, j) for j in jobs[4:]] == [[(False, KB)]] * 2
    assert (await r.run_once()).logs_trimmed == 1  # more to take: looked again at once
    assert (await r.run_once()).logs_trimmed == 0  # under now: not before TRIM_EVERY
    await _succeeded(db, clock, "a", KB)
    assert (await r.run_once()).logs_trimmed == 0
    clock.advance(maintenance.TRIM_EVERY)
    assert (await r.run_once()).logs_trimmed == 1
    assert await db.runlogs.kept() == {"a": KB}


async def test_the_tenant_s_use_is_read_grouped_for_every_tenant(
    db: store.Store, clock: FrozenClock
) -> None:
    await _succeeded(db, clock, "a", KB)
    await _running(db, clock, "a")
    await db.jobs.submit(
        new=[model.NewJob(executor="noop", spec={}, tenant="b") for _ in range(3)],
        now=clock.now(),
    )
    await db.tokens.add(
        name="c-view",
        tenant="c",
        role=access.Role.VIEWER,
        secret_sha256="0" * 64,
        now=clock.now(),
        expires_at=None,
    )
    every = await db.tenants.every()
    assert every == {
        "a": usage.Use(waiting=0, running=1, log_bytes=KB),
        "b": usage.Use(waiting=3),
        "c": usage.Use(),
    }
    assert await db.tenants.use(tenant="b") == usage.Use(waiting=3)
    assert await db.tenants.use(tenant="nobody") == usage.Use()
    assert await db.tenants.known() == ["a", "b", "c"]


async def test_run_logs_go_with_their_jobs_and_stop_counting(
    db: store.Store, clock: FrozenClock
) -> None:
    await _succeeded(db, clock, "a", KB)
    await _succeeded(db, clock, "a", 2 * KB)  # the newest: kept (it holds the highest ids)
    clock.advance(timedelta(days=2).total_seconds())
    assert await db.runlogs.forget(before=clock.now() - timedelta(days=1), limit=10) == 1
    assert await db.runlogs.kept() == {"a": 2 * KB}
