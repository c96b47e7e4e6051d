"""Auto-pause on both databases: a schedule whose last `pause_after` firings' jobs ended
failed or quarantined is paused by the scheduler, with its reason, an event and a `paused`
alert (to a real Slack stand-in on 127.0.0.1) that says how to resume; missed firings never
count, a success or a resume begins the count again, a job still running counts once it
ends, and a tenant's default applies to the schedules that have no value of their own.
Time is the injected clock's."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp import web

from corral import alerts, client, config, model, scheduler, scheduling, store
from corral.store import Finish
from corral.tenancy import TenantSettings
from corral.testing import FrozenClock
from tests.support.net import http_server
from tests.support.noop import NoopExecutor

A, F, J = model.AttemptState, scheduling.FiringOutcome, model.JobState
START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
JOB = {"spec": {"command": ["true"]}, "executor": "noop", "max_attempts": 1}


class Corral:
    """A client and a scheduler over one store, on one frozen clock and one settings."""

    def __init__(self, db: store.Store, clock: FrozenClock, settings: config.Settings) -> None:
        self.db, self.clock = db, clock
        self.c = client.Client(
            store=db, executors={"noop": NoopExecutor()}, settings=settings, clock=clock
        )
        self.scheduler = scheduler.Scheduler(store=db, clock=clock, tenants=settings.tenants)

    async def fire(self) -> list[int]:
        """A scheduler pass at now: the ids of the jobs it made."""
        before = {j for j in await self._job_ids()}
        await self.scheduler.pass_once()
        return sorted(set(await self._job_ids()) - before)

    async def _job_ids(self) -> list[int]:
        return [j.id for j in await self.db.jobs.list(limit=1000)]

    async def end(self, how: model.JobState | None) -> None:
        """Claim the jobs due now and end each as `how` says (None: leave it running)."""
        claimed = await self.db.jobs.claim(now=self.clock.now(), limit=10, executors=["noop"])
        if how is None:
            return
        finishes = [_finish(c.attempt.id, how) for c in claimed]
        await self.db.attempts.finish(finishes=finishes, now=self.clock.now())

    async def finish(self, job_id: int, how: model.JobState) -> None:
        """End the running job `job_id` as `how`."""
        [attempt] = await self.db.attempts.list(job_id=job_id)
        await self.db.attempts.finish(finishes=[_finish(attempt.id, how)], now=self.clock.now())

    async def round(self, how: model.JobState | None) -> None:
        """Fire what is due, end its jobs as `how`, and move to the next minute."""
        await self.fire()
        await self.end(how)
        self.clock.advance(60)

    async def schedule(self, name: str, tenant: str = "default") -> scheduling.Schedule:
        return await self.c.schedule(name, tenant=tenant)


def _finish(fence: int, how: model.JobState) -> Finish:
    if how == J.SUCCEEDED:
        return Finish(fence, A.SUCCEEDED, 0, None)
    cls = model.FailureClass.PERMANENT if how == J.QUARANTINED else model.FailureClass.TRANSIENT
    return Finish(fence, A.FAILED, 1, "exited with code 1", cls)


@pytest.fixture
def corral(db: store.Store) -> Corral:
    return Corral(db, FrozenClock(START), config.Settings())


async def paused_events(db: store.Store) -> list[model.Event]:
    read = await db.alerts.events(after=0, limit=1000)
    return [e for e, _ in read.found if e.entity == "schedule" and e.to_state == "paused"]


async def test_three_failed_firings_pause_the_schedule_with_its_reason_and_an_event(
    corral: Corral,
) -> None:
    await corral.c.schedule_create("tick", every="1m", pause_after=3, **JOB)
    for how in (J.FAILED, J.QUARANTINED, J.FAILED):
        await corral.round(how)
    assert (await corral.schedule("tick")).paused_at is None  # paused when it would fire
    other = scheduler.Scheduler(store=corral.db, clock=corral.clock)
    assert await corral.fire() == []  # no fourth job
    await other.pass_once()  # a second scheduler at the same instant: nothing more
    found = await corral.schedule("tick")
    assert found.paused_at == corral.clock.now()
    assert found.paused_reason is not None
    assert "pause_after = 3" in found.paused_reason
    [event] = await paused_events(corral.db)
    assert event.details["schedule"] == "tick"
    assert event.details["pause_after"] == 3
    assert "corral schedules resume tick --tenant default" in event.reason
    outcomes = [f.outcome for f in await corral.c.firings("tick", limit=100)]
    assert outcomes == [F.FIRED] * 3


async def test_two_failed_and_a_missed_firing_do_not_pause(corral: Corral) -> None:
    await corral.c.schedule_create("tick", every="1m", pause_after=3, **JOB)
    for how in (J.FAILED, J.FAILED):
        await corral.round(how)
    corral.clock.advance(60)  # no scheduler ran for one nominal time: it is missed
    assert len(await corral.fire()) == 1
    assert (await corral.schedule("tick")).paused_at is None
    outcomes = [f.outcome for f in await corral.c.firings("tick", limit=100)]
    assert outcomes == [F.FIRED, F.MISSED, F.FIRED, F.FIRED]
    assert await paused_events(corral.db) == []


async def test_a_success_in_between_begins_the_count_again(corral: Corral) -> None:
    await corral.c.schedule_create("tick", every="1m", pause_after=3, **JOB)
    for how in (J.FAILED, J.SUCCEEDED, J.FAILED, J.FAILED):
        await corral.round(how)
    assert (await corral.schedule("tick")).paused_at is None
    await corral.round(J.FAILED)  # this pass fires; the third failure in a row
    assert (await corral.schedule("tick")).paused_at is None
    await corral.fire()
    assert (await corral.schedule("tick")).paused_at is not None


async def test_a_job_still_running_counts_once_it_ends(corral: Corral) -> None:
    await corral.c.schedule_create("tick", every="1m", pause_after=3, **JOB)
    await corral.round(J.FAILED)
    await corral.round(J.FAILED)
    [running] = await corral.fire()
    await corral.end(None)
    corral.clock.advance(60)
    assert len(await corral.fire()) == 1  # two ended badly, one runs: it fires
    await corral.finish(running, J.FAILED)
    corral.clock.advance(60)
    assert await corral.fire() == []
    assert (await corral.schedule("tick")).paused_at is not None


async def test_resuming_clears_the_count(corral: Corral) -> None:
    await corral.c.schedule_create("tick", every="1m", pause_after=3, **JOB)
    for how in (J.FAILED, J.FAILED, J.FAILED):
        await corral.round(how)
    await corral.fire()
    assert (await corral.schedule("tick")).paused_at is not None
    resumed = await corral.c.schedule_resume("tick")
    assert (resumed.paused_at, resumed.paused_reason) == (None, None)
    corral.clock.advance(60)  # its next nominal time after the resume
    for how in (J.FAILED, J.FAILED):
        await corral.round(how)
    assert await corral.fire() != []  # the failures before the resume never count again
    await corral.end(J.FAILED)
    assert (await corral.schedule("tick")).paused_at is None
    corral.clock.advance(60)
    assert await corral.fire() == []
    assert (await corral.schedule("tick")).paused_at is not None
    assert len(await paused_events(corral.db)) == 2


async def test_the_tenant_s_default_applies_and_a_schedule_s_own_value_wins(
    db: store.Store,
) -> None:
    settings = config.Settings(tenants={"a": TenantSettings(pause_after=2)})
    corral = Corral(db, FrozenClock(START), settings)
    await corral.c.schedule_create("default-2", every="1m", tenant="a", **JOB)
    await corral.c.schedule_create("never", every="1m", tenant="a", pause_after=0, **JOB)
    await corral.c.schedule_create("own-3", every="1m", tenant="a", pause_after=3, **JOB)
    await corral.c.schedule_create("other", every="1m", tenant="b", **JOB)
    for _ in range(2):
        await corral.round(J.FAILED)
    await corral.fire()
    paused = {s.name for s in await corral.c.schedules() if s.paused_at is not None}
    assert paused == {"default-2"}
    await corral.end(J.FAILED)
    corral.clock.advance(60)
    await corral.fire()
    paused = {s.name for s in await corral.c.schedules() if s.paused_at is not None}
    assert paused == {"default-2", "own-3"}


@pytest.fixture
async def slack() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    seen: list[dict[str, Any]] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append(json.loads(await request.read()))
        return web.Response(text="ok")

    async with http_server(handle) as base:
        yield f"{base}/slack", seen


async def test_an_operator_rule_on_paused_sends_how_to_resume(
    db: store.Store, slack: tuple[str, list[dict[str, Any]]]
) -> None:
    url, seen = slack
    settings = config.Settings(
        executors={"http": {"allow_networks": ["127.0.0.0/8:1024-65535"]}},  # type: ignore[arg-type]
        alerts={  # type: ignore[arg-type]
            "channels": {"team_slack": {"kind": "slack", "webhook_url": url}},
            "rules": {"stopped": {"on": ["paused"], "channels": ["team_slack"]}},
        },
    )
    clock = FrozenClock(START)
    corral = Corral(db, clock, settings)
    await db.alerts.write(
        name="alerter", read_from=0, read_to=0, messages=[], digested=[], now=clock.now()
    )
    await corral.c.schedule_create("tick", every="1m", tenant="a", pause_after=1, **JOB)
    await corral.round(J.QUARANTINED)
    await corral.fire()
    alerter = alerts.Alerter(store=db, clock=clock, settings=settings)
    try:
        await alerter.read_once()
        await alerter.deliver_all()
    finally:
        await alerter.close()
    [sent] = await db.alerts.list()
    assert (sent.cause, sent.state, sent.channel) == ("paused", "delivered", "team_slack")
    [message] = seen
    said = json.dumps(message)
    assert "schedule tick (tenant a) paused" in message["text"]
    assert "corral schedules resume tick --tenant a" in said
    assert "Resume button" in said
