"""Flows on both databases, through the client and the store, on an injected clock: a flow's
rate and parallelism held by its claim, a Retry-After holding the whole flow, two tenants'
flows of one name apart, jobs of no flow claimed as before, and `explain` saying why a
job waits and until when."""

from __future__ import annotations

from datetime import timedelta

import pytest

from corral import client, errors, model, store
from corral.store import Finish
from corral.testing import FrozenClock
from tests.support.api import noop_client

A, J = model.AttemptState, model.JobState
NOOP = ["noop"]


@pytest.fixture
def c(db: store.Store, clock: FrozenClock) -> client.Client:
    return noop_client(db, clock_=clock)


async def _submit(c: client.Client, n: int, *, flow: str | None, tenant: str = "a") -> list[int]:
    made = [await c.submit(executor="noop", spec={}, flow=flow, tenant=tenant) for _ in range(n)]
    return [job_id for job_id, _ in made]


async def _claim(c: client.Client, limit: int = 100) -> list[model.Claimed]:
    return await c.store.flows.claim(now=c.clock.now(), limit=limit, executors=NOOP)


async def _finish(c: client.Client, claimed: list[model.Claimed], **how: object) -> None:
    finishes = [
        Finish(x.attempt.id, A.SUCCEEDED if not how else A.FAILED, 0 if not how else 1, None, **how)  # type: ignore[arg-type]
        for x in claimed
    ]
    await c.store.attempts.finish(finishes=finishes, now=c.clock.now())


async def test_a_flow_starts_no_more_than_its_rate_in_any_window(c: client.Client) -> None:
    await c.flow_add("a", {"name": "api", "rate": "10/1s"})
    await _submit(c, 25, flow="api")
    starts = []
    for step in range(30):  # 3 s, a claim every 100 ms
        got = await _claim(c)
        starts += [x.attempt.created_at for x in got]
        await _finish(c, got)
        c.clock.advance(0.1)  # type: ignore[attr-defined]
        assert step < 29 or len(starts) == 25
    starts.sort()
    assert len(starts) == 25
    assert all(b - a >= timedelta(seconds=1) for a, b in zip(starts, starts[10:], strict=False))
    assert starts[-1] - starts[0] >= timedelta(seconds=2)  # 25 at 10 a second: three windows


async def test_a_flow_runs_no_more_than_its_parallelism(c: client.Client) -> None:
    await c.flow_add("a", {"name": "slow", "parallelism": 2})
    await _submit(c, 5, flow="slow")
    first = await _claim(c)
    assert len(first) == 2
    assert await _claim(c) == []  # two run: none more
    await _finish(c, first[:1])
    assert len(await _claim(c)) == 1


async def test_jobs_of_no_flow_and_of_a_flow_are_claimed_apart(c: client.Client) -> None:
    await c.flow_add("a", {"name": "api", "rate": "1/1h"})
    plain = await _submit(c, 3, flow=None)
    flowed = await _submit(c, 3, flow="api")
    taken = await c.store.jobs.claim(now=c.clock.now(), limit=100, executors=NOOP)
    assert sorted(x.job.id for x in taken) == plain  # the flow's jobs are not the claim's
    [one] = await _claim(c)
    assert one.job.id in flowed
    assert one.job.flow == "api"
    assert await _claim(c) == []  # its rate: one an hour; the others stay queued
    assert [(await c.store.jobs.get(job_id=i)).state for i in flowed].count(J.QUEUED) == 2


async def test_a_retry_after_holds_the_whole_flow_until_then(c: client.Client) -> None:
    await c.flow_add("a", {"name": "api"})
    jobs = await _submit(c, 3, flow="api")
    first = (await _claim(c, 1))[0]
    await _finish(c, [first], http_status=429, retry_after=30.0)
    assert await _claim(c) == []  # held: no other job of the flow starts
    held = await c.explain(jobs[1])
    assert held.startswith("held by its flow: flow 'api' is held until")
    assert "a 429 with Retry-After from job" in held
    view = await c.job(first.job.id)
    assert any("its flow 'api' is held until" in e.reason for e in view.events)
    shown, _ = await c.flow("a", "api")
    assert shown.held_until == c.clock.now() + timedelta(seconds=30)
    c.clock.advance(30)  # type: ignore[attr-defined]
    assert len(await _claim(c)) == 3  # the two waiting, and the retry (due after 30 s too)


async def test_a_503_without_retry_after_or_a_500_holds_nothing(c: client.Client) -> None:
    await c.flow_add("a", {"name": "api"})
    jobs = await _submit(c, 3, flow="api")
    got = await _claim(c, 2)
    await _finish(c, got[:1], http_status=503)
    await _finish(c, got[1:], http_status=500, retry_after=30.0)
    [third] = [i for i in jobs if i not in {x.job.id for x in got}]
    assert third in {x.job.id for x in await _claim(c)}
    assert (await c.flow("a", "api"))[0].held_until is None


async def test_two_tenants_flows_of_one_name_never_share_a_limit(c: client.Client) -> None:
    for tenant in ("a", "b"):
        await c.flow_add(tenant, {"name": "api", "rate": "2/1m"})
        await _submit(c, 4, flow="api", tenant=tenant)
    got = await _claim(c)
    assert sorted(x.job.tenant for x in got) == ["a", "a", "b", "b"]
    await c.flow_update("b", "api", {"rate": "3/1m"})
    assert [x.job.tenant for x in await _claim(c)] == ["b"]  # b's change is b's alone


async def test_explain_says_when_a_flow_s_job_may_start(c: client.Client) -> None:
    await c.flow_add("a", {"name": "api", "rate": "1/1m", "parallelism": 1})
    jobs = await _submit(c, 2, flow="api")
    [got] = await _claim(c)
    waiting = next(i for i in jobs if i != got.job.id)
    at = (got.attempt.created_at + timedelta(minutes=1)).isoformat(timespec="milliseconds")
    assert "flow 'api' reached its rate 1/1m" in await c.explain(waiting)
    assert f"it may start at {at}" in await c.explain(waiting)
    await c.flow_update("a", "api", {"rate": None})
    said = await c.explain(waiting)
    assert "runs 1 of its jobs, its parallelism is 1; it may start when one of them ends" in said


async def test_a_job_or_schedule_naming_no_flow_of_its_tenant_is_refused(
    c: client.Client,
) -> None:
    await c.flow_add("b", {"name": "api"})
    with pytest.raises(errors.InvalidInput, match="flow: tenant 'a' has no flow named 'api'"):
        await c.submit(executor="noop", spec={}, flow="api", tenant="a")
    with pytest.raises(errors.InvalidInput, match="flow: tenant 'a' has no flow named 'api'"):
        await c.schedule_create("s", every="1h", executor="noop", spec={}, flow="api", tenant="a")
    with pytest.raises(errors.InvalidInput, match="flow: 'no spaces' must be"):
        await c.submit(executor="noop", spec={}, flow="no spaces", tenant="b")
    assert await c.store.jobs.list() == []
    assert await c.schedules() == []


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"name": "x", "rate": "10"}, "rate: '10' is not N/PERIOD"),
        ({"name": "x", "rate": "0/1s"}, "rate: N must be between 1 and 100000"),
        ({"name": "x", "rate": "5/10ms"}, "rate: PERIOD must be between 100ms and 1d"),
        ({"name": "x", "rate": "5/soon"}, "rate: 'soon' is not a duration"),
        ({"name": "x", "parallelism": 0}, "parallelism: a whole number between 1"),
        ({"name": "x", "colour": "red"}, "colour: unknown field"),
        ({"name": "no spaces"}, "name: required"),
    ],
)
async def test_a_bad_flow_is_refused_naming_the_field(
    c: client.Client, body: dict[str, object], said: str
) -> None:
    with pytest.raises(errors.InvalidInput) as refused:
        await c.flow_add("a", body)
    assert str(refused.value).startswith(said)
    assert await c.flows("a") == []


async def test_a_flow_in_use_is_not_deleted(c: client.Client) -> None:
    await c.flow_add("a", {"name": "api"})
    [job] = await _submit(c, 1, flow="api")
    with pytest.raises(errors.Conflict, match="1 jobs of flow 'api' have not ended yet"):
        await c.flow_delete("a", "api")
    await c.schedule_create("s", every="1h", executor="noop", spec={}, flow="api", tenant="a")
    await _finish(c, await _claim(c))
    with pytest.raises(errors.Conflict, match="schedule 's' names flow 'api'"):
        await c.flow_delete("a", "api")
    await c.schedule_delete("s", tenant="a")
    await c.flow_delete("a", "api")
    assert (await c.store.jobs.get(job_id=job)).flow == "api"  # its history keeps the name
    with pytest.raises(errors.NotFound):
        await c.flow_delete("a", "api")
    await c.flow_add("b", {"name": "api"})
    with pytest.raises(errors.Conflict, match="has a flow named 'api' already"):
        await c.flow_add("b", {"name": "api"})
