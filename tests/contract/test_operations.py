"""Bulk operations in the store, on SQLite and PostgreSQL: the preview's count and sample,
the snapshot taken by the same query, steps that apply each item once (skipping a job that
no longer fits, with a note), a cancelled operation, and tenants kept apart."""

from __future__ import annotations

import asyncio

import pytest

from corral import errors, model, store
from corral.testing import FrozenClock
from tests.support import jobs
from tests.support.jobs import quarantine

J, B, S = model.JobState, model.BulkAction, model.OperationState
QUARANTINED = model.JobFilter(states=("quarantined",))


async def submit(
    db: store.Store, clock: FrozenClock, n: int, *, tenant: str = "a", queue: str = "q"
) -> list[int]:
    new = [model.NewJob(executor="noop", spec={}, tenant=tenant, queue=queue) for _ in range(n)]
    return await jobs.submit(db, clock, *new)


async def make(
    db: store.Store,
    clock: FrozenClock,
    action: model.BulkAction = B.RETRY,
    given: model.JobFilter = QUARANTINED,
    *,
    tenant: str | None = "a",
    expect: int | None = None,
) -> model.Operation:
    return await db.operations.create(
        tenant=tenant,
        action=action,
        given=given,
        expect=expect,
        token_id=None,
        made_by="test",
        now=clock.now(),
    )


async def run_all(db: store.Store, clock: FrozenClock, operation_id: int, limit: int = 2) -> None:
    for _ in range(1000):
        step = await db.operations.step(operation_id=operation_id, now=clock.now(), limit=limit)
        if step.ended or step.done == 0:
            return
    raise AssertionError("the operation never ended")


async def test_a_preview_counts_exactly_what_the_action_can_touch(
    db: store.Store, clock: FrozenClock
) -> None:
    ids = await submit(db, clock, 5)
    await quarantine(db, clock, ids[:3])
    await submit(db, clock, 2, tenant="b")  # another tenant's
    seen = await db.operations.preview(tenant="a", action=B.RETRY, given=model.JobFilter())
    assert (seen.count, seen.sample) == (3, tuple(reversed(ids[:3])))
    cancel = await db.operations.preview(tenant="a", action=B.CANCEL, given=model.JobFilter())
    assert cancel.count == 5  # every job not ended, the quarantined ones too
    everyone = await db.operations.preview(tenant=None, action=B.CANCEL, given=model.JobFilter())
    assert everyone.count == 7
    none = await db.operations.preview(
        tenant="a", action=B.RETRY, given=model.JobFilter(states=("queued",))
    )
    assert none.count == 0


async def test_the_operation_runs_on_its_snapshot_and_skips_what_changed(
    db: store.Store, clock: FrozenClock
) -> None:
    ids = await submit(db, clock, 5)
    await quarantine(db, clock, ids)
    op = await make(db, clock, expect=5)
    assert (op.state, op.total, op.applied, op.skipped) == (S.RUNNING, 5, 0, 0)
    later = await submit(db, clock, 2)
    await quarantine(db, clock, later)  # matches the filter now, but after the snapshot
    await db.jobs.unquarantine(job_id=ids[1], to=J.CANCELLED, now=clock.now(), reason="a person")
    first = await db.operations.step(operation_id=op.id, now=clock.now(), limit=3)
    assert (first.applied, first.skipped, first.ended) == (2, 1, False)
    halfway = await db.operations.get(operation_id=op.id)
    assert (halfway.applied, halfway.skipped, halfway.left) == (2, 1, 2)
    await run_all(db, clock, op.id)
    done = await db.operations.get(operation_id=op.id)
    assert (done.state, done.applied, done.skipped) == (S.SUCCEEDED, 4, 1)
    assert done.finished_at == clock.now()
    jobs = {j.id: j.state for j in await db.jobs.get_many(job_ids=ids + later)}
    assert [jobs[i] for i in ids] == [J.QUEUED, J.CANCELLED, J.QUEUED, J.QUEUED, J.QUEUED]
    assert [jobs[i] for i in later] == [J.QUARANTINED, J.QUARANTINED]
    [skipped] = await db.operations.items(operation_id=op.id, outcome=model.ItemOutcome.SKIPPED)
    assert (skipped.job_id, skipped.note) == (ids[1], "cancelled, not quarantined any more")
    events = await db.events.list(job_id=ids[0])
    assert events[-1].reason == f"retry by bulk operation {op.id}"


async def test_a_count_that_changed_makes_nothing(db: store.Store, clock: FrozenClock) -> None:
    ids = await submit(db, clock, 3)
    with pytest.raises(errors.CountChanged) as refused:
        await make(db, clock, B.CANCEL, model.JobFilter(), expect=2)
    assert refused.value.count == 3
    assert "expect: the filter now matches 3 jobs, not 2" in str(refused.value)
    assert await db.operations.list(tenant=None) == []
    op = await make(db, clock, B.CANCEL, model.JobFilter(queue="q"), expect=3)
    await run_all(db, clock, op.id)
    assert {j.state for j in await db.jobs.get_many(job_ids=ids)} == {J.CANCELLED}


async def test_an_empty_snapshot_has_ended_at_once(db: store.Store, clock: FrozenClock) -> None:
    op = await make(db, clock, expect=0)
    assert (op.state, op.total) == (S.SUCCEEDED, 0)


async def test_a_cancelled_operation_stops_its_remaining_items(
    db: store.Store, clock: FrozenClock
) -> None:
    ids = await submit(db, clock, 4)
    await quarantine(db, clock, ids)
    op = await make(db, clock, B.DISCARD)
    await db.operations.step(operation_id=op.id, now=clock.now(), limit=1)
    stopped = await db.operations.cancel(operation_id=op.id, now=clock.now())
    assert (stopped.state, stopped.applied, stopped.left) == (S.CANCELLED, 1, 3)
    assert (await db.operations.step(operation_id=op.id, now=clock.now(), limit=10)).done == 0
    states = [j.state for j in await db.jobs.get_many(job_ids=ids)]
    assert states == [J.CANCELLED, J.QUARANTINED, J.QUARANTINED, J.QUARANTINED]
    again = await db.operations.cancel(operation_id=op.id, now=clock.now())
    assert again.state == S.CANCELLED
    finished = await make(db, clock, given=model.JobFilter(queue="none"), expect=0)
    with pytest.raises(errors.Conflict):
        await db.operations.cancel(operation_id=finished.id, now=clock.now())


async def test_a_tenant_s_operation_touches_only_its_jobs(
    db: store.Store, clock: FrozenClock
) -> None:
    mine = await submit(db, clock, 2, tenant="a")
    theirs = await submit(db, clock, 2, tenant="b")
    op = await make(db, clock, B.CANCEL, model.JobFilter(queue="q"), tenant="a", expect=2)
    await run_all(db, clock, op.id)
    states = {j.id: j.state for j in await db.jobs.get_many(job_ids=mine + theirs)}
    assert [states[i] for i in mine] == [J.CANCELLED, J.CANCELLED]
    assert [states[i] for i in theirs] == [J.QUEUED, J.QUEUED]
    assert [o.id for o in await db.operations.list(tenant="b")] == []
    assert [o.id for o in await db.operations.list(tenant="a")] == [op.id]


@pytest.mark.postgres
async def test_two_runners_at_once_apply_each_item_once(
    db: store.Store, clock: FrozenClock, db_url: str
) -> None:
    if db.database.dialect != "postgresql":
        pytest.skip("SQLite writers take turns")
    ids = await submit(db, clock, 60)
    op = await make(db, clock, B.CANCEL, model.JobFilter(queue="q"), expect=60)
    other = store.Store.connect(db_url)
    try:
        await asyncio.gather(
            run_all(db, clock, op.id, limit=3), run_all(other, clock, op.id, limit=3)
        )
        await run_all(db, clock, op.id)  # one that found the operation locked stops early
    finally:
        await other.close()
    done = await db.operations.get(operation_id=op.id)
    assert (done.state, done.applied, done.skipped) == (S.SUCCEEDED, 60, 0)
    for job_id in ids:
        cancels = [e for e in await db.events.list(job_id=job_id) if e.to_state == "cancelled"]
        assert len(cancels) == 1
