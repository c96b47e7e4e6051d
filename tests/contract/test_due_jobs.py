"""Jobs waiting for their time (`scheduled`, `corral submit --at/--delay`) are taken by the
claim itself once due: a dispatcher (or a worker) alone runs them, no scheduler needed.

Each path of the claim is tried on both databases: the hot path (one statement on
PostgreSQL), the general path (pools and tenant caps send a claim there), and a worker's."""

from __future__ import annotations

from datetime import timedelta

import pytest

from corral import model, python_tasks, store
from corral.testing import FrozenClock
from tests.support.jobs import submit

J = model.JobState
CAPPED = {"elsewhere": 5}  # a pool cap: the claim takes the general path


def _new(*, run_at_in: float = 0.0, clock: FrozenClock, **kw: object) -> model.NewJob:
    kw.setdefault("executor", "noop")
    return model.NewJob(
        spec=kw.pop("spec", {}),  # type: ignore[arg-type]
        run_at=clock.now() + timedelta(seconds=run_at_in),
        **kw,  # type: ignore[arg-type]
    )


async def _claim(
    db: store.Store, clock: FrozenClock, *, limit: int = 10, general: bool = False
) -> list[int]:
    claimed = await db.jobs.claim(
        now=clock.now(), limit=limit, executors=["noop"], pools=CAPPED if general else None
    )
    return [c.job.id for c in claimed]


async def _log(db: store.Store, job_id: int) -> list[tuple[str | None, str, str]]:
    return [(e.from_state, e.to_state, e.reason) for e in await db.events.list(job_id=job_id)]


@pytest.mark.parametrize("general", [False, True], ids=["hot", "general"])
async def test_a_due_scheduled_job_is_claimed_with_both_lines_of_its_run_log(
    db: store.Store, clock: FrozenClock, general: bool
) -> None:
    [job_id] = await submit(db, clock, _new(run_at_in=30, clock=clock))
    assert await _claim(db, clock, general=general) == []
    assert (await db.jobs.get(job_id=job_id)).state == J.SCHEDULED
    clock.advance(30)
    assert await _claim(db, clock, general=general) == [job_id]
    assert (await db.jobs.get(job_id=job_id)).state == J.RUNNING
    assert (await _log(db, job_id))[1:] == [
        ("scheduled", "queued", "its time came"),
        ("queued", "running", "claimed: attempt 1 launching"),
    ]


@pytest.mark.parametrize("general", [False, True], ids=["hot", "general"])
async def test_the_claim_takes_the_most_urgent_and_queues_the_other_due_ones(
    db: store.Store, clock: FrozenClock, general: bool
) -> None:
    """Of queued and due scheduled jobs together, the most urgent are claimed (priority,
    then run_at); due scheduled ones not claimed now are queued for a later claim."""
    waited = await submit(
        db,
        clock,
        _new(run_at_in=5, priority=1, clock=clock),
        _new(run_at_in=10, priority=7, clock=clock),
        _new(run_at_in=3600, priority=9, clock=clock),  # not due
    )
    [ready] = await submit(db, clock, _new(priority=3, clock=clock))
    clock.advance(10)
    assert await _claim(db, clock, limit=2, general=general) == [waited[1], ready]
    assert (await db.jobs.get(job_id=waited[0])).state == J.QUEUED
    assert (await _log(db, waited[0]))[1:] == [("scheduled", "queued", "its time came")]
    assert (await db.jobs.get(job_id=waited[2])).state == J.SCHEDULED
    assert await _claim(db, clock, general=general) == [waited[0]]
    assert await _claim(db, clock, general=general) == []


@pytest.mark.parametrize("general", [False, True], ids=["hot", "general"])
async def test_a_claim_leaves_the_due_jobs_of_other_executors_scheduled(
    db: store.Store, clock: FrozenClock, general: bool
) -> None:
    """A dispatcher moves only what it could run; another executor's due jobs wait for a
    dispatcher of theirs (or the scheduler)."""
    [other] = await submit(db, clock, _new(executor="other", run_at_in=1, clock=clock))
    clock.advance(1)
    assert await _claim(db, clock, general=general) == []
    assert (await db.jobs.get(job_id=other)).state == J.SCHEDULED
    assert await db.jobs.promote_due(now=clock.now(), limit=10) == 1
    assert (await db.jobs.get(job_id=other)).state == J.QUEUED


@pytest.mark.parametrize("general", [False, True], ids=["hot", "general"])
async def test_a_workers_claim_takes_its_due_scheduled_tasks(
    db: store.Store, clock: FrozenClock, general: bool
) -> None:
    task = {"task": "send", "version": 1}
    [job_id] = await submit(
        db,
        clock,
        _new(
            executor=python_tasks.PYTHON,
            spec=task,
            payload=python_tasks.envelope("send", 1, {}),
            run_at_in=60,
            clock=clock,
        ),
    )

    async def claim() -> list[int]:
        claimed = await db.workers.claim(
            worker_id="w1",
            reads=[("send", [1])],
            queues=(),
            now=clock.now(),
            limit=10,
            limits=store.DefaultLimits(timedelta(seconds=240), timedelta(seconds=60)),
            pools=CAPPED if general else None,
        )
        return [c.job.id for c in claimed]

    assert await claim() == []
    clock.advance(60)
    assert await claim() == [job_id]
    assert [line[:2] for line in await _log(db, job_id)][1:] == [
        ("scheduled", "queued"),
        ("queued", "running"),
        ("launching", "running"),
    ]
