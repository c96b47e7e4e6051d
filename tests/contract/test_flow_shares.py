"""The flow claim keeps every claim's caps and fair shares, on both databases: a tenant's
flow backlog never takes the other tenants' room, nor runs more than its own max_running
or its pool's slots; flows of several tenants share by weight; a submit naming a flow does
not keep the flow claim off it; `explain` says when a flow's rate, lowered under its starts,
lets the next one start; and the main claim's index holds no job of a flow."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from datetime import timedelta

import pytest
from sqlalchemy import create_engine, text

from corral import client, config, dispatcher, flows, model, shares, store, tenancy
from corral.store import Finish
from corral.store import flows as stored_flows
from corral.testing import FrozenClock
from tests.support.api import noop_client
from tests.support.noop import NoopExecutor

A, J = model.AttemptState, model.JobState
NOOP = ["noop"]
POOLS, TENANTS = {"p": 1}, {"t": 1}
CAPS = [
    pytest.param({"pools": POOLS}, id="pool"),
    pytest.param({"tenants": TENANTS}, id="max_running"),
    pytest.param({"pools": POOLS, "tenants": TENANTS}, id="both"),
]


async def _flow(db: store.Store, clock: FrozenClock, tenant: str, name: str, **kw: object) -> None:
    limits = flows.Limits(**kw)  # type: ignore[arg-type]
    await db.flows.add(tenant=tenant, name=name, limits=limits, now=clock.now(), most=10)


async def _jobs(
    db: store.Store, clock: FrozenClock, n: int, tenant: str, **kw: object
) -> list[int]:
    new = [model.NewJob(executor="noop", spec={}, tenant=tenant, **kw) for _ in range(n)]  # type: ignore[arg-type]
    return [job_id for job_id, _ in await db.jobs.submit(new=new, now=clock.now())]


async def _tick(
    db: store.Store, clock: FrozenClock, room: int, **caps: Mapping[str, int]
) -> list[model.Job]:
    """A dispatcher's claim: the flows' jobs first, then the others with the room left."""
    now = clock.now()
    flowed = await db.flows.claim(now=now, limit=room, executors=NOOP, **caps)  # type: ignore[arg-type]
    rest = await db.jobs.claim(now=now, limit=room - len(flowed), executors=NOOP, **caps)  # type: ignore[arg-type]
    return [c.job for c in flowed + rest]


async def _running(db: store.Store, tenant: str) -> int:
    return sum(
        1 for j in await db.jobs.list(limit=1000) if j.tenant == tenant and j.state == J.RUNNING
    )


@pytest.mark.parametrize("caps", CAPS)
async def test_a_flow_backlog_keeps_its_caps_and_leaves_others_their_room(
    db: store.Store, clock: FrozenClock, caps: dict[str, Mapping[str, int]]
) -> None:
    """The review's case: tenant t's flow has no limit and 20 jobs in pool p; t may run 1
    (or p holds 1); tenant u has 5 jobs of no flow. u gets all of its jobs at once, and
    t never runs more than 1."""
    await _flow(db, clock, "t", "api")
    await _jobs(db, clock, 20, "t", flow="api", pool="p")
    await _jobs(db, clock, 5, "u")
    first = await _tick(db, clock, 10, **caps)
    assert Counter(j.tenant for j in first) == {"t": 1, "u": 5}
    assert await _tick(db, clock, 10, **caps) == []  # t's one runs: none more
    [ts] = [j for j in first if j.tenant == "t"]
    attempts = (await db.jobs.record(job_id=ts.id))[1]
    await db.attempts.finish(
        finishes=[Finish(attempts[-1].id, A.SUCCEEDED, 0, None)], now=clock.now()
    )
    assert [j.tenant for j in await _tick(db, clock, 10, **caps)] == ["t"]
    assert await _running(db, "t") == 1


async def test_a_flow_takes_its_tenant_s_fair_part_of_the_room(
    db: store.Store, clock: FrozenClock
) -> None:
    """Nothing capped: t's flow gets its part of the room beside u's jobs of no flow (by
    weight, or what u's jobs leave if more), the main claim the rest; alone, the flow gets
    all of it."""
    await _flow(db, clock, "t", "api")
    await _jobs(db, clock, 30, "t", flow="api")
    await _jobs(db, clock, 5, "u")
    assert Counter(j.tenant for j in await _tick(db, clock, 10)) == {"t": 5, "u": 5}
    assert Counter(j.tenant for j in await _tick(db, clock, 10)) == {"t": 10}
    await _jobs(db, clock, 10, "u")
    heavy = shares.Weights({"u": 4.0})
    flowed = await db.flows.claim(now=clock.now(), limit=10, executors=NOOP, weights=heavy)
    assert [c.job.tenant for c in flowed] == ["t", "t"]  # ceil(10 * 1 / 5)
    assert len(await db.jobs.claim(now=clock.now(), limit=10, executors=NOOP)) == 10
    await _jobs(db, clock, 2, "u")
    assert Counter(j.tenant for j in await _tick(db, clock, 10)) == {"t": 8, "u": 2}


async def test_flows_of_two_tenants_share_the_claim_by_weight(
    db: store.Store, clock: FrozenClock
) -> None:
    for tenant in ("a", "b"):
        await _flow(db, clock, tenant, "api")
        await _jobs(db, clock, 20, tenant, flow="api")
    weights = shares.Weights({"a": 3.0})
    got = await db.flows.claim(now=clock.now(), limit=8, executors=NOOP, weights=weights)
    assert Counter(c.job.tenant for c in got) == {"a": 6, "b": 2}
    got = await db.flows.claim(now=clock.now(), limit=8, executors=NOOP, weights=weights)
    assert Counter(c.job.tenant for c in got) == {"a": 6, "b": 2}  # the turns moved on


async def test_the_dispatcher_s_flow_claim_keeps_the_settings_caps(
    db: store.Store, clock: FrozenClock
) -> None:
    executor = NoopExecutor()
    settings = config.Settings(
        claim_batch_limit=10,
        pools=POOLS,
        tenants={"t": tenancy.TenantSettings(max_running=1)},
    )
    d = dispatcher.Dispatcher(
        store=db, executors={"noop": executor}, clock=clock, settings=settings
    )
    d._flows_exist = True  # as run()'s probe finds
    await _flow(db, clock, "t", "api")
    await _jobs(db, clock, 20, "t", flow="api", pool="p")
    await _jobs(db, clock, 5, "u")
    tick = await d.run_once()
    assert (tick.claimed, tick.launched) == (6, 6)
    assert await _running(db, "t") == 1
    assert await _running(db, "u") == 5


@pytest.fixture
def c(db: store.Store, clock: FrozenClock) -> client.Client:
    return noop_client(db, clock_=clock)


async def test_explain_counts_a_lowered_rate_from_the_start_that_holds_it(
    c: client.Client,
) -> None:
    """Three starts 10 s apart in a window of 3/1m, then the rate lowered to 2/1m: the
    next start waits for the second of them to leave the window (OFFSET 3 - 2)."""
    await c.flow_add("a", {"name": "api", "rate": "3/1m"})
    waiting = [
        (await c.submit(executor="noop", spec={}, flow="api", tenant="a"))[0] for _ in range(4)
    ]
    starts, claimed = [], set()
    for _ in range(3):
        [got] = await c.store.flows.claim(now=c.clock.now(), limit=1, executors=NOOP)
        starts.append(got.attempt.created_at)
        claimed.add(got.job.id)
        c.clock.advance(10)  # type: ignore[attr-defined]
    await c.flow_update("a", "api", {"rate": "2/1m"})
    [left] = [i for i in waiting if i not in claimed]
    at = (starts[1] + timedelta(minutes=1)).isoformat(timespec="milliseconds")
    assert f"it may start at {at}" in await c.explain(left)
    _, use = await c.flow("a", "api")
    assert (use.started, use.holding_start) == (3, starts[1])


@pytest.mark.postgres
async def test_a_submit_naming_a_flow_does_not_keep_the_flow_claim_off_it(
    db: store.Store, clock: FrozenClock, db_url: str
) -> None:
    """A submit keeps its flow (FOR KEY SHARE) until it commits; meanwhile the flow claim
    (FOR NO KEY UPDATE SKIP LOCKED) still claims the flow's jobs."""
    await _flow(db, clock, "t", "api")
    await _jobs(db, clock, 3, "t", flow="api")
    engine = create_engine(db_url)
    try:
        with engine.begin() as conn:
            stored_flows.flows_named(conn, named=[("t", "api")])  # a submit, not committed
            got = await db.flows.claim(now=clock.now(), limit=10, executors=NOOP)
            assert len(got) == 3
    finally:
        engine.dispose()


def test_the_main_claim_s_index_holds_no_job_of_a_flow(db_url: str) -> None:
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            if conn.dialect.name == "postgresql":
                found = "SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_jobs_queued_tenant'"
            else:
                found = "SELECT sql FROM sqlite_master WHERE name = 'ix_jobs_queued_tenant'"
            made = conn.execute(text(found)).scalar_one()
    finally:
        engine.dispose()
    assert "flow IS NULL" in made, made
