"""A flow's name kept where it is named, on both databases: a schedule is written only
naming a flow of its tenant as its own transaction sees it; a schedule whose flow is gone
all the same has its firings refused, with an event, while every other schedule fires; and a
flow with jobs quarantined or parked is not deleted."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import delete

from corral import client, errors, model, scheduler, scheduling, store
from corral.store import tables
from corral.testing import FrozenClock
from tests.support.api import noop_client

F, J = scheduling.FiringOutcome, model.JobState
START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
JOB = {"executor": "noop", "spec": {}}


@pytest.fixture
def c(db: store.Store) -> client.Client:
    return noop_client(db, clock_=FrozenClock(START))


def _remove_behind_its_back(db: store.Store, tenant: str, name: str) -> None:
    """Delete a flow row as a race past the checks would leave it: its schedule kept."""
    flows = tables.flows.c
    with db.database.engine.begin() as conn:
        conn.execute(delete(tables.flows).where(flows.tenant == tenant, flows.name == name))


async def test_a_schedule_is_written_only_naming_a_flow_its_transaction_sees(
    c: client.Client,
) -> None:
    """The client's check and the write are apart: a flow deleted between them is found by
    the write, which keeps nothing."""
    await c.flow_add("a", {"name": "x"})
    new, anchor, first = await c.schedule_prepared("s", every="1h", flow="x", tenant="a", **JOB)
    await c.flow_delete("a", "x")  # nothing names it yet: the deletion may go
    with pytest.raises(errors.InvalidInput, match="flow: tenant 'a' has no flow named 'x'"):
        await c.store.schedules.create(new=new, anchor=anchor, next_due=first, now=START)
    assert await c.schedules(tenant="a") == []
    await c.flow_add("a", {"name": "y"})
    made = await c.schedule_create("t", every="1h", flow="y", tenant="a", **JOB)
    changed = {"template": {**made.template, "flow": "x"}}
    with pytest.raises(errors.InvalidInput, match="flow: tenant 'a' has no flow named 'x'"):
        await c.store.schedules.update(
            schedule_id=made.id, changes=changed, next_due=None, now=START
        )
    assert (await c.schedule("t", tenant="a")).template["flow"] == "y"


async def test_a_schedule_whose_flow_is_gone_is_refused_and_the_others_fire(
    c: client.Client,
) -> None:
    await c.flow_add("a", {"name": "x"})
    await c.flow_add("b", {"name": "y"})
    gone = await c.schedule_create("s", every="1m", flow="x", tenant="a", **JOB)
    kept = await c.schedule_create("s", every="1m", flow="y", tenant="b", **JOB)
    plain = await c.schedule_create("p", every="1m", tenant="a", **JOB)
    _remove_behind_its_back(c.store, "a", "x")
    fires = scheduler.Scheduler(store=c.store, clock=c.clock)
    for _ in range(2):  # the refused schedule moves on: no pass fails, none is stuck
        done = await fires.pass_once()
        assert (done.schedules, done.fired, done.recorded) == (3, 2, 3)
        c.clock.advance(60)  # type: ignore[attr-defined]
    for made in (kept, plain):
        fired = await c.store.schedules.firings(schedule_id=made.id, limit=10)
        assert [(f.outcome, f.job_id is not None) for f in fired] == [(F.FIRED, True)] * 2
    refused = await c.store.schedules.firings(schedule_id=gone.id, limit=10)
    assert [(f.outcome, f.job_id) for f in refused] == [(F.REFUSED, None)] * 2
    assert all("flow 'x', which tenant 'a' no longer has" in (f.note or "") for f in refused)
    _, events = await c.store.events.page(after=0, limit=100)  # a schedule's news: no tenant
    said = [e for e in events if e.entity == "schedule" and e.to_state == F.REFUSED.value]
    assert len(said) == 2
    assert all((e.details["schedule"], e.details["tenant"]) == ("s", "a") for e in said)
    assert "did not run: its jobs name flow 'x', which tenant 'a' no longer has" in said[0].reason
    assert "corral flows add x --tenant a" in said[0].reason
    assert {j.flow for j in await c.store.jobs.list()} == {"y", None}


@pytest.mark.parametrize("state", [J.QUARANTINED, J.PARKED])
async def test_a_flow_with_jobs_quarantined_or_parked_is_not_deleted(
    c: client.Client, state: model.JobState
) -> None:
    """Such a job may go back to the queue (unquarantined, or its worker back): the flow it
    names must still be there then."""
    await c.flow_add("a", {"name": "x"})
    job_id, _ = await c.submit(flow="x", tenant="a", **JOB)
    jobs = tables.jobs.c
    with c.store.database.engine.begin() as conn:
        conn.execute(tables.jobs.update().where(jobs.id == job_id).values(state=state.value))
    with pytest.raises(errors.Conflict, match="1 jobs of flow 'x' have not ended yet") as refused:
        await c.flow_delete("a", "x")
    assert "quarantined or parked" in str(refused.value)
    assert [f.name for f in await c.flows("a")] == ["x"]
