"""Fenced checkpoints on both databases: a relaunched attempt resumes from the newest
state, and the attempt it replaced cannot roll that state back."""

from __future__ import annotations

import pytest

from corral import config, errors, model, retry, store
from corral.sinks import load_checkpoint, load_checkpoint_async, save_checkpoint_async
from corral.store import Finish
from corral.testing import FrozenClock
from corral.worker import CurrentAttempt


def attempt(job_id: int, fence: int) -> CurrentAttempt:
    return CurrentAttempt(job_id, 1, fence, None, None, None)


async def two_attempts(db: store.Store, clock: FrozenClock) -> tuple[int, int, int]:
    """A job whose first attempt failed and was claimed again: (job, old fence, new)."""
    await db.jobs.submit(new=[model.NewJob(executor="noop", spec={})], now=clock.now())
    [first] = await db.jobs.claim(now=clock.now(), limit=1, executors=["noop"])
    await db.attempts.finish(
        finishes=[Finish(first.attempt.id, model.AttemptState.FAILED, 1, "boom")],
        now=clock.now(),
        retry=retry.Retry.from_settings(config.Settings()),
    )
    clock.advance(3600)
    [second] = await db.jobs.claim(now=clock.now(), limit=1, executors=["noop"])
    assert second.attempt.id > first.attempt.id
    return first.job.id, first.attempt.id, second.attempt.id


async def test_the_replaced_attempt_cannot_roll_the_checkpoint_back(
    db: store.Store, db_url: str, clock: FrozenClock
) -> None:
    settings = config.Settings(database_url=db_url)
    job_id, old, new = await two_attempts(db, clock)
    await save_checkpoint_async({"page": 40}, attempt=attempt(job_id, new), settings=settings)
    with pytest.raises(errors.StaleFence, match=f"newest attempt has fence {new}"):
        await save_checkpoint_async({"page": 3}, attempt=attempt(job_id, old), settings=settings)
    got = await load_checkpoint_async(attempt=attempt(job_id, old), settings=settings)
    assert got == {"page": 40}, "every attempt reads the newest state"
    await save_checkpoint_async({"page": 41}, attempt=attempt(job_id, new), settings=settings)
    assert await db.sinks.checkpoint_load(job_id=job_id) == (new, {"page": 41})


async def test_a_job_with_no_checkpoint_reads_the_default(
    db: store.Store, db_url: str, clock: FrozenClock
) -> None:
    settings = config.Settings(database_url=db_url)
    job_id, _, new = await two_attempts(db, clock)
    got = await load_checkpoint_async(
        default={"page": 0}, attempt=attempt(job_id, new), settings=settings
    )
    assert got == {"page": 0}


async def test_state_must_be_json(db: store.Store, db_url: str, clock: FrozenClock) -> None:
    settings = config.Settings(database_url=db_url)
    job_id, _, new = await two_attempts(db, clock)
    with pytest.raises(errors.InvalidInput, match="must be JSON"):
        await save_checkpoint_async({1, 2}, attempt=attempt(job_id, new), settings=settings)
    assert await db.sinks.checkpoint_load(job_id=job_id) is None


async def test_the_blocking_calls_refuse_to_run_inside_an_event_loop() -> None:
    with pytest.raises(errors.CorralError, match="_async version"):
        load_checkpoint(attempt=attempt(1, 1), settings=config.Settings())
