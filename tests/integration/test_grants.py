"""Executor grants, tried from a tenant token as a stranger would: every executor kind a
tenant is not granted is refused (403, naming the tenant, the executor and the setting)
when submitted, scheduled, re-run or fired by hand through the API; a schedule the
tenant made fires only while the grant holds (a withdrawn one records its firings as
refused, with news for the alert rules, and runs nothing), while the operator's own
schedules are checked by no grant."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from corral import client, config, model, scheduler, scheduling, store
from corral.alerts import rules
from corral.executors import registry
from corral.testing import FrozenClock
from tests.support.api import as_operator_of, granting
from tests.support.noop import NoopExecutor

KINDS = sorted({*registry.known(), "noop"} - {"http"})
"""Every executor a tenant is not granted by default (python is: workers run its tasks)."""


@pytest.fixture
async def c(db: store.Store) -> client.Client:
    return client.Client(
        store=db,
        executors={"noop": NoopExecutor()},
        settings=config.Settings(),
        clock=FrozenClock(),
    )


@pytest.fixture
async def http(c: client.Client) -> AsyncIterator[httpx.AsyncClient]:
    async with as_operator_of(c, "b") as made:
        yield made


def _refused(answer: httpx.Response, kind: str) -> None:
    assert answer.status_code == 403, answer.text
    said = answer.json()["error"]
    assert f"tenant 'b' is not granted {kind!r}" in said
    assert "[tenants.b] executors" in said


@pytest.mark.parametrize("kind", KINDS)
async def test_an_executor_not_granted_is_refused_at_every_door_of_the_api(
    kind: str, c: client.Client, http: httpx.AsyncClient
) -> None:
    job = {"executor": kind, "spec": {"command": ["id"]}}
    _refused(await http.post("/api/v1/jobs", json=job), kind)
    _refused(await http.post("/api/v1/jobs", json=[job]), kind)
    _refused(await http.post("/api/v1/schedules", json={"name": "s", "every": "1m", **job}), kind)
    assert await c.store.jobs.list(model.JobFilter(states=[]), limit=10) == []
    assert await c.schedules() == []
    # The operator's schedule of tenant b, and the operator's job: a tenant may not fire,
    # backfill, re-run or re-point them at what it is not granted.
    await c.schedule_create("ops", every="1m", spec={}, executor="noop", tenant="b")
    if kind != "noop":
        changed = await http.patch("/api/v1/schedules/ops", json={"executor": kind})
        _refused(changed, kind)
    if kind == "noop":
        _refused(await http.post("/api/v1/schedules/ops/trigger"), kind)
        window = {"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T00:05:00Z"}
        _refused(await http.post("/api/v1/schedules/ops/backfill", json=window), kind)
        job_id, _ = await c.submit(spec={}, executor="noop", tenant="b")
        await c.cancel(job_id, reason="test")
        _refused(await http.post(f"/api/v1/jobs/{job_id}/rerun"), kind)


async def test_a_tenant_s_schedule_fires_only_while_its_grant_holds(
    c: client.Client, http: httpx.AsyncClient
) -> None:
    granted = granting(c.settings, "noop")
    c.settings = granted
    made = await http.post(
        "/api/v1/schedules", json={"name": "mine", "every": "1m", "executor": "noop", "spec": {}}
    )
    assert made.status_code == 201, made.text
    await c.schedule_create("ops", every="1m", spec={}, executor="noop", tenant="b")
    assert isinstance(c.clock, FrozenClock)
    while_granted = scheduler.Scheduler(store=c.store, clock=c.clock, tenants=granted.tenants)
    await while_granted.pass_once()
    c.clock.advance(60)
    await while_granted.pass_once()
    before = await c.firings("mine", tenant="b")
    assert [f.outcome for f in before] == [scheduling.FiringOutcome.FIRED] * len(before)
    assert before
    assert all(f.job_id is not None for f in before)

    # The operator withdraws noop: the tenant's schedule is refused, the operator's fires.
    c.settings = config.Settings()
    c.clock.advance(60)
    await scheduler.Scheduler(store=c.store, clock=c.clock, tenants={}).pass_once()
    newest = (await c.firings("mine", tenant="b"))[0]
    assert newest.outcome == scheduling.FiringOutcome.REFUSED
    assert newest.job_id is None
    assert newest.note is not None
    assert "not granted 'noop'" in newest.note
    ops = await c.firings("ops", tenant="b")
    assert len(ops) == len(before) + 1
    assert {f.outcome for f in ops} == {scheduling.FiringOutcome.FIRED}
    news = [e for e, _ in (await c.store.alerts.events(after=0, limit=1000)).found if e.job_id == 0]
    [refused] = [e for e in news if e.to_state == "refused"]
    assert refused.details["schedule"] == "mine"
    said = rules.happening(refused, None)
    assert said is not None
    assert (said.cause, said.tenant) == ("refused", "b")
    jobs = await c.store.jobs.list(model.JobFilter(states=[]), limit=100)
    assert len(jobs) == len(before) + len(ops)  # none for the refused firing
