"""Quotas per tenant, tried from two tenants' tokens on both databases: each quota holds
exactly at its edge (the limit passes, one more is refused with its status, naming the
quota, the tenant and the setting), a refused batch writes nothing and takes no token,
another tenant is never slowed, and the operator (the client on the store) is held to
none. A retry (a quarantined job sent back) is no submit."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx

from corral import alerts, config, model, scheduler, scheduling, store, tenancy
from corral.alerts import channels
from corral.testing import FrozenClock
from tests.support.api import JOB, Api, granting, noop_client, over_http, serving, sign_in
from tests.support.jobs import quarantine

J, F = model.JobState, scheduling.FiringOutcome
TOKENS = [("a-op", "a", "operator"), ("b-op", "b", "operator"), ("admin", None, "admin")]


def quota_settings(**a: Any) -> config.Settings:
    """The defaults, with tenant a's own table of quotas `a`."""
    return config.Settings(tenants={"a": tenancy.TenantSettings(**a)})


@contextlib.asynccontextmanager
async def api_with(db: store.Store, **a: Any) -> AsyncIterator[Api]:
    """The API over `db`, tenant a's quotas `a`, tokens of tenants a and b and an admin's."""
    async with serving(db, TOKENS, settings=quota_settings(**a)) as made:
        yield made


def _said(answer: httpx.Response, status: int, quota: str) -> str:
    assert answer.status_code == status, answer.text
    body = answer.json()
    assert body["field"] == quota
    assert "tenant 'a'" in body["error"]
    return str(body["error"])


async def _jobs(api: Api, tenant: str) -> list[model.Job]:
    return await api.c.jobs(model.JobFilter(tenant=tenant), limit=1000)


async def test_max_queued_holds_at_its_edge_through_the_api(db: store.Store) -> None:
    async with api_with(db, max_queued=3) as api:
        post = api.http.post
        assert (await post("/api/v1/jobs", json=JOB, headers=api.as_("a-op"))).status_code == 201
        keyed = {**JOB, "idempotency_key": "k"}
        two = await post("/api/v1/jobs", json=[JOB, keyed], headers=api.as_("a-op"))
        assert two.status_code == 201, two.text  # 3 waiting: exactly the quota
        one_more = await post("/api/v1/jobs", json=JOB, headers=api.as_("a-op"))
        said = _said(one_more, 403, "max_queued")
        assert "would have 4 jobs waiting" in said
        assert "quota of 3" in said
        assert "[tenants.a] max_queued" in said
        # An admin's batch over it is refused whole, its other tenant's job with it.
        both = [{**JOB, "tenant": "b"}, {**JOB, "tenant": "a"}]
        _said(await post("/api/v1/jobs", json=both, headers=api.as_("admin")), 403, "max_queued")
        assert len(await _jobs(api, "a")) == 3
        assert await _jobs(api, "b") == []
        # A repeat of a key makes nothing, so it stands; another tenant is not slowed.
        again = await post("/api/v1/jobs", json=keyed, headers=api.as_("a-op"))
        assert again.status_code == 201
        assert again.json()["created"] is False
        theirs = await post("/api/v1/jobs", json=[JOB] * 5, headers=api.as_("b-op"))
        assert theirs.status_code == 201
        # A job that ends frees its place.
        first = min(j.id for j in await _jobs(api, "a"))
        await post(f"/api/v1/jobs/{first}/cancel", headers=api.as_("a-op"))
        assert (await post("/api/v1/jobs", json=JOB, headers=api.as_("a-op"))).status_code == 201
        rerun = await post(f"/api/v1/jobs/{first}/rerun", headers=api.as_("a-op"))
        _said(rerun, 403, "max_queued")


async def test_the_operator_is_held_to_none_and_a_retry_is_no_submit(db: store.Store) -> None:
    async with api_with(db, max_queued=2) as api:
        # The operator takes tenant a past its quota: its submits stand, with a warning.
        ids = [(await api.c.submit(**JOB, tenant="a"))[0] for _ in range(3)]
        assert await api.c.quota_warnings(["a", "b"]) == [
            "max_queued: tenant 'a' now has 3 jobs waiting, over its quota of 2 ([tenants.a]"
            " max_queued); the operator is not held to it, but the tenant's own submits are refused"
            " until fewer wait"
        ]
        _said(
            await api.http.post("/api/v1/jobs", json=JOB, headers=api.as_("a-op")),
            403,
            "max_queued",
        )
        await quarantine(db, api.c.clock, ids[:1])
        # Sent back to its queue by a person: the same job again, no submit, never refused.
        retried = await api.http.post(f"/api/v1/jobs/{ids[0]}/retry", headers=api.as_("a-op"))
        assert retried.status_code == 200, retried.text
        assert (await api.c.job(ids[0])).job.state == J.QUEUED


async def test_submit_rate_holds_at_its_edge_and_says_when_to_try_again(db: store.Store) -> None:
    async with api_with(db, submit_rate=6) as api:
        post, clock = api.http.post, api.c.clock
        assert isinstance(clock, FrozenClock)
        assert (
            await post("/api/v1/jobs", json=[JOB] * 4, headers=api.as_("a-op"))
        ).status_code == 201
        assert (
            await post("/api/v1/jobs", json=[JOB] * 2, headers=api.as_("a-op"))
        ).status_code == 201
        late = await post("/api/v1/jobs", json=JOB, headers=api.as_("a-op"))  # the 7th in a minute
        said = _said(late, 429, "submit_rate")
        assert late.headers["retry-after"] == "10"  # a token every 60 / 6 seconds
        assert "may submit 6 jobs a minute" in said
        assert "[tenants.a] submit_rate" in said
        too_big = await post("/api/v1/jobs", json=[JOB] * 7, headers=api.as_("a-op"))
        assert "split it" in _said(too_big, 403, "submit_rate")  # no wait would let it in
        assert (await post("/api/v1/jobs", json=JOB, headers=api.as_("b-op"))).status_code == 201
        # 20 seconds give 2 tokens: a batch of 3 is refused and takes none, one of 2 passes.
        clock.advance(20)
        three = await post("/api/v1/jobs", json=[JOB] * 3, headers=api.as_("a-op"))
        _said(three, 429, "submit_rate")
        assert three.headers["retry-after"] == "10"
        assert (
            await post("/api/v1/jobs", json=[JOB] * 2, headers=api.as_("a-op"))
        ).status_code == 201
        assert len(await _jobs(api, "a")) == 8
        # The operator's submits take no token.
        await api.c.submit(**JOB, tenant="a")
        clock.advance(10)
        assert (await post("/api/v1/jobs", json=JOB, headers=api.as_("a-op"))).status_code == 201


async def test_max_schedules_holds_at_its_edge_through_the_api(db: store.Store) -> None:
    async with api_with(db, max_schedules=2) as api:

        def schedule(name: str) -> dict[str, Any]:
            return {"name": name, "every": "1h", **JOB}

        post = api.http.post
        for name in ("s1", "s2"):
            made = await post("/api/v1/schedules", json=schedule(name), headers=api.as_("a-op"))
            assert made.status_code == 201, made.text
        third = await post("/api/v1/schedules", json=schedule("s3"), headers=api.as_("a-op"))
        said = _said(third, 403, "max_schedules")
        assert "has 2 schedules, its quota of 2" in said
        assert "[tenants.a] max_schedules" in said
        assert (
            await post("/api/v1/schedules", json=schedule("s3"), headers=api.as_("b-op"))
        ).is_success
        await api.c.schedule_create("ops", every="1h", **JOB, tenant="a")  # the operator's
        assert len(await api.c.schedules(tenant="a")) == 3
        assert (await api.http.delete("/api/v1/schedules/s1", headers=api.as_("a-op"))).is_success
        assert (await api.http.delete("/api/v1/schedules/s2", headers=api.as_("a-op"))).is_success
        again = await post("/api/v1/schedules", json=schedule("s3"), headers=api.as_("a-op"))
        assert again.status_code == 201


async def test_the_lower_of_the_global_and_the_tenant_s_payload_limit_holds(
    db: store.Store,
) -> None:
    async with api_with(db, max_payload_bytes=100) as api:
        big = {**JOB, "payload": {"text": "x" * 200}}
        refused = await api.http.post("/api/v1/jobs", json=big, headers=api.as_("a-op"))
        assert refused.status_code == 422
        assert (
            "over tenant 'a''s limit of 100 ([tenants.a] max_payload_bytes)"
            in refused.json()["error"]
        )
        schedule = {"name": "s", "every": "1h", **big}
        made = await api.http.post("/api/v1/schedules", json=schedule, headers=api.as_("a-op"))
        assert made.status_code == 422
        assert (await api.http.post("/api/v1/jobs", json=big, headers=api.as_("b-op"))).is_success
        await api.c.submit(**big, tenant="a")  # the operator's job: the global limit only
        api.c.settings = api.c.settings.model_copy(update={"max_payload_bytes": 50})
        b_big = await api.http.post("/api/v1/jobs", json=big, headers=api.as_("b-op"))
        assert "over the limit of 50 (max_payload_bytes)" in b_big.json()["error"]


async def test_a_backfill_or_a_trigger_through_the_api_is_held_to_the_quotas(
    db: store.Store,
) -> None:
    async with api_with(db, max_queued=3, submit_rate=100) as api:
        post = api.http.post
        made = await post(
            "/api/v1/schedules", json={"name": "s", "every": "1h", **JOB}, headers=api.as_("a-op")
        )
        assert made.status_code == 201
        four = {"from": "2026-01-01T01:00:00Z", "to": "2026-01-01T05:00:00Z"}  # 4 firings
        _said(
            await post("/api/v1/schedules/s/backfill", json=four, headers=api.as_("a-op")),
            403,
            "max_queued",
        )
        assert await api.c.firings("s", tenant="a") == []  # all or nothing
        three = {"from": "2026-01-01T01:00:00Z", "to": "2026-01-01T04:00:00Z"}
        filled = await post("/api/v1/schedules/s/backfill", json=three, headers=api.as_("a-op"))
        assert filled.json()["created"] == 3
        _said(await post("/api/v1/schedules/s/trigger", headers=api.as_("a-op")), 403, "max_queued")
        assert len(await api.c.firings("s", tenant="a")) == 3


async def test_a_firing_of_an_api_made_schedule_past_max_queued_is_refused_and_alerts(
    db: store.Store,
) -> None:
    """A tenant's schedule's firings are its jobs: one that would break max_queued is
    recorded refused (no job), naming the quota, and a rule on `quota` hears of it; the
    operator's schedule of the same tenant fires all the same."""
    await db.alerts.write(  # an alerter that reads from the start
        name="alerter", read_from=0, read_to=0, messages=[], digested=[], now=FrozenClock().now()
    )
    async with api_with(db, max_queued=1) as api:
        mine = {"name": "mine", "every": "1m", **JOB}
        assert (
            await api.http.post("/api/v1/schedules", json=mine, headers=api.as_("a-op"))
        ).is_success
        await api.c.schedule_create("ops", every="1m", **JOB, tenant="a")
        clock = api.c.clock
        assert isinstance(clock, FrozenClock)
        fires = scheduler.Scheduler(store=db, clock=clock, tenants=api.c.settings.tenants)
        for _ in range(2):
            clock.advance(60)
            await fires.pass_once()
        refused, fired, _missed = await api.c.firings("mine", tenant="a")  # newest first
        assert fired.outcome == F.FIRED
        assert (refused.outcome, refused.job_id) == (F.REFUSED, None)
        assert refused.note is not None
        assert "max_queued: tenant 'a' would have 3 jobs waiting" in refused.note
        ops = [f.outcome for f in await api.c.firings("ops", tenant="a")]
        assert ops == [F.FIRED, F.FIRED, F.MISSED]
        assert len(await _jobs(api, "a")) == 3
    alerter = alerts.Alerter(store=db, clock=clock, settings=_alerting())
    try:
        assert await alerter.read_once() > 0
    finally:
        await alerter.close()
    [alert] = await db.alerts.list()
    assert (alert.rule, alert.cause, alert.subject) == ("full", "quota", "schedule:a/mine")
    assert (alert.details["schedule"], alert.details["tenant"]) == ("mine", "a")
    assert "did not run: max_queued: tenant 'a'" in alert.details["reason"]
    said = channels.render(alert)
    assert said.title == "[corral] schedule mine of tenant a: nominal times were refused"


def _alerting() -> config.Settings:
    """A rule on `quota` for tenant a's schedules, to a webhook (nothing is delivered)."""
    return config.Settings(
        alerts={  # type: ignore[arg-type]
            "channels": {"hook": {"kind": "webhook", "url": "http://127.0.0.1:9/hook"}},
            "rules": {
                "full": {"on": ["quota"], "match": {"tenant": "a"}, "channels": ["hook"]},
            },
        }
    )


async def test_the_dashboard_s_form_is_held_to_the_quotas_and_says_which(
    db: store.Store,
) -> None:
    settings = granting(quota_settings(max_queued=2, submit_rate=3), "process")
    c = noop_client(db, settings=settings)
    c.checkers = {**c.checkers, "process": _ProcessSpec()}  # checked here, never run
    await c.user_add("ada", password="correct horse", tenant="a", role="operator")
    await c.user_add("bob", password="correct horse", tenant="b", role="operator")
    async with over_http(c) as ada, over_http(c) as bob:
        send = await _form(ada, "ada")
        for _ in range(2):
            assert (await send()).status_code == 303
        full = await send()
        assert full.status_code == 403
        assert "max_queued: tenant &#39;a&#39; would have 3 jobs waiting" in full.text
        assert "[tenants.a] max_queued" in full.text
        assert len(await c.jobs(model.JobFilter(tenant="a"))) == 2
        assert (await (await _form(bob, "bob"))()).status_code == 303  # b is not slowed
        # Room again, but the third token of the minute is the last.
        for job in await c.jobs(model.JobFilter(tenant="a")):
            await c.cancel(job.id)
        assert (await send()).status_code == 303
        late = await send()
        assert late.status_code == 429
        assert late.headers["retry-after"] == "20"
        assert "submit_rate: tenant &#39;a&#39; may submit 3 jobs a minute" in late.text


async def _form(http: httpx.AsyncClient, name: str) -> Callable[[], Awaitable[httpx.Response]]:
    """Sign `name` in; a sender of the "Submit a command" form."""
    await sign_in(http, name=name, password="correct horse")
    page = await http.get("/ui/jobs")
    assert "Submit a command" in page.text
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found is not None

    async def send() -> httpx.Response:
        return await http.post("/ui/jobs", data={"csrf": found[1], "command": "echo hi"})

    return send


class _ProcessSpec:
    def validate_spec(self, spec: dict[str, object]) -> dict[str, object]:
        return spec
