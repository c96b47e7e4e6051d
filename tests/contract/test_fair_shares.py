"""Fair shares: due jobs are taken round-robin across tenants, each in proportion to its
weight, so one tenant's backlog never holds up another's; priority orders a tenant's own
jobs only. Each is tried on both databases through every path of the claim: the hot path
(one statement on PostgreSQL), the general one (pools or tenants' max_running send a
claim there) and a Python worker's."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta

import pytest

from corral import config, dispatcher, model, python_tasks, shares, store, tenancy
from corral.testing import FrozenClock
from tests.support.jobs import submit
from tests.support.noop import NoopExecutor

CAPPED = {"elsewhere": 5}  # a pool cap: the claim takes the general path
LIMITS = store.DefaultLimits(timedelta(seconds=240), timedelta(seconds=60))
PATHS = ["hot", "general", "worker"]
TASK = {"task": "send", "version": 1}


def _new(tenant: str, clock: FrozenClock, path: str, **kw: object) -> model.NewJob:
    if path == "worker":
        kw.update(
            executor=python_tasks.PYTHON,
            spec=TASK,
            payload=python_tasks.envelope("send", 1, {}),
        )
    kw.setdefault("executor", "noop")
    kw.setdefault("spec", {})
    kw.setdefault("run_at", clock.now())
    return model.NewJob(tenant=tenant, **kw)  # type: ignore[arg-type]


async def _many(
    db: store.Store, clock: FrozenClock, path: str, tenant: str, n: int, **kw: object
) -> list[int]:
    return await submit(db, clock, *[_new(tenant, clock, path, **kw) for _ in range(n)])


async def _claim(
    db: store.Store,
    clock: FrozenClock,
    path: str,
    limit: int,
    weights: shares.Weights | None = None,
    tenants: dict[str, int] | None = None,
) -> list[model.Job]:
    if path == "worker":
        claimed = await db.workers.claim(
            worker_id="w1",
            reads=[("send", [1])],
            queues=(),
            now=clock.now(),
            limit=limit,
            limits=LIMITS,
            tenants=tenants,
            weights=weights,
        )
    else:
        claimed = await db.jobs.claim(
            now=clock.now(),
            limit=limit,
            executors=["noop"],
            pools=CAPPED if path == "general" else None,
            tenants=tenants,
            weights=weights,
        )
    return [c.job for c in claimed]


@pytest.mark.parametrize("path", PATHS)
async def test_a_backlog_does_not_hold_up_another_tenants_jobs(
    db: store.Store, clock: FrozenClock, path: str
) -> None:
    """Tenant a queues a backlog and its draining begins; tenant b's jobs, submitted later,
    start at the next claim, alongside a's."""
    await _many(db, clock, path, "a", 600)
    assert {j.tenant for j in await _claim(db, clock, path, 50)} == {"a"}
    clock.advance(1)
    b_jobs = await _many(db, clock, path, "b", 10)
    taken = await _claim(db, clock, path, 10)
    assert Counter(j.tenant for j in taken) == {"a": 5, "b": 5}
    taken = await _claim(db, clock, path, 50)
    assert Counter(j.tenant for j in taken) == {"a": 45, "b": 5}
    assert await _claim(db, clock, path, 0) == []
    claimed_b = {j.id for j in taken if j.tenant == "b"}
    assert claimed_b <= set(b_jobs)


@pytest.mark.parametrize("path", PATHS)
async def test_weights_share_the_claims(db: store.Store, clock: FrozenClock, path: str) -> None:
    """Weights 1:3 give shares of 1:3 (within 10%) over 2,000 claimed, in claims of one job
    and of several."""
    await _many(db, clock, path, "light", 1500)
    await _many(db, clock, path, "heavy", 1500)
    weights = shares.Weights({"heavy": 3.0})
    got: Counter[str] = Counter()
    sizes = [1, 1, 3, 1, 7, 2, 1, 5]
    i = 0
    while sum(got.values()) < 2000:
        size = min(sizes[i % len(sizes)], 2000 - sum(got.values()))
        got.update(j.tenant for j in await _claim(db, clock, path, size, weights))
        i += 1
    assert got["heavy"] / got["light"] == pytest.approx(3.0, rel=0.1), got


@pytest.mark.parametrize("path", PATHS)
async def test_priority_orders_a_tenants_own_jobs_only(
    db: store.Store, clock: FrozenClock, path: str
) -> None:
    """A tenant's priority 100 jobs go before its own others, never before another
    tenant's share."""
    low = await _many(db, clock, path, "a", 5)
    urgent = await _many(db, clock, path, "a", 5, priority=100)
    await _many(db, clock, path, "b", 5)
    taken = await _claim(db, clock, path, 6)
    assert Counter(j.tenant for j in taken) == {"a": 3, "b": 3}
    assert {j.id for j in taken if j.tenant == "a"} <= set(urgent)
    assert not {j.id for j in taken} & set(low)


@pytest.mark.parametrize("path", PATHS)
async def test_a_tenant_back_from_a_pause_gets_its_share_and_no_burst(
    db: store.Store, clock: FrozenClock, path: str
) -> None:
    """Tenants a and c drain while b has nothing due; b's jobs then get a third of the
    claims, not all of them until b catches up."""
    await _many(db, clock, path, "a", 400)
    await _many(db, clock, path, "c", 400)
    for _ in range(30):
        await _claim(db, clock, path, 10)
    await _many(db, clock, path, "b", 200)
    got: Counter[str] = Counter()
    for _ in range(30):
        got.update(j.tenant for j in await _claim(db, clock, path, 3))
    assert got == {"a": 30, "b": 30, "c": 30}


@pytest.mark.parametrize("path", PATHS)
async def test_a_tenant_with_few_jobs_leaves_its_room_to_the_others(
    db: store.Store, clock: FrozenClock, path: str
) -> None:
    """A tenant with fewer due jobs than its share gets them all, and the others fill the
    claim (PostgreSQL reads each tenant's jobs past what its share alone would take)."""
    await _many(db, clock, path, "a", 100)
    await _many(db, clock, path, "b", 2)
    await _many(db, clock, path, "c", 100)
    taken = await _claim(db, clock, path, 30)
    assert Counter(j.tenant for j in taken) == {"a": 14, "b": 2, "c": 14}


@pytest.mark.parametrize("path", PATHS)
async def test_max_running_caps_a_tenant_inside_its_share(
    db: store.Store, clock: FrozenClock, path: str
) -> None:
    """A tenant at its max_running gets nothing more; the others take the room."""
    await _many(db, clock, path, "a", 50)
    await _many(db, clock, path, "b", 50)
    taken = await _claim(db, clock, path, 20, tenants={"a": 3})
    assert Counter(j.tenant for j in taken) == {"a": 3, "b": 17}


@pytest.mark.parametrize("path", PATHS)
async def test_due_scheduled_jobs_are_shared_too(
    db: store.Store, clock: FrozenClock, path: str
) -> None:
    """Jobs submitted for later (`--at`) are taken by their tenants' shares once due: a
    tenant's thousand due at once do not hold up another's one."""
    later = clock.now() + timedelta(seconds=30)
    a = [_new("a", clock, path, run_at=later) for _ in range(300)]
    await submit(db, clock, *a)
    clock.advance(60)
    [b_job] = await submit(db, clock, _new("b", clock, path, run_at=later))
    taken = await _claim(db, clock, path, 4)
    assert Counter(j.tenant for j in taken) == {"a": 3, "b": 1}
    assert b_job in {j.id for j in taken}


async def test_a_dispatcher_starts_another_tenants_job_within_two_ticks(
    db: store.Store, clock: FrozenClock
) -> None:
    """The issue's case through a real dispatcher: tenant a's backlog is draining when
    tenant b submits; b's first job is launched within two ticks, a's weight or not."""
    executor = NoopExecutor()
    d = dispatcher.Dispatcher(
        store=db,
        executors={"noop": executor},
        clock=clock,
        settings=config.Settings(
            claim_batch_limit=20, tenants={"a": tenancy.TenantSettings(weight=5.0)}
        ),
    )
    await _many(db, clock, "hot", "a", 2000)
    for _ in range(3):
        await d.run_once()
    clock.advance(1)
    [first, *_] = await _many(db, clock, "hot", "b", 10)
    for _ in range(2):
        await d.run_once()
        if (await db.jobs.get(job_id=first)).state != model.JobState.QUEUED:
            break
    assert (await db.jobs.get(job_id=first)).state == model.JobState.RUNNING
    assert model.launch_name(first, 1) in executor.launches


@pytest.mark.postgres
async def test_claims_at_once_share_without_deadlock_or_a_job_twice(
    pg_url: str, clock: FrozenClock
) -> None:
    """Four dispatchers' claims at once on PostgreSQL, over five tenants: each job is
    claimed once, every claim ends (the turns' rows are locked in one order), and the
    shares still come out even."""
    from tests.conftest import pg_empty

    pg_empty(pg_url)
    stores = [store.Store.connect(pg_url) for _ in range(4)]
    try:
        for tenant in "abcde":
            await _many(stores[0], clock, "hot", tenant, 300)
        got: list[model.Job] = []

        async def claims(db: store.Store) -> None:
            for _ in range(15):
                got.extend(await _claim(db, clock, "hot", 10))

        await asyncio.gather(*(claims(db) for db in stores))
        assert len({j.id for j in got}) == len(got) == 600
        counts = Counter(j.tenant for j in got)
        assert max(counts.values()) - min(counts.values()) <= 40, counts
    finally:
        for db in stores:
            await db.close()
