"""A tenant's quotas and its use of them, on both databases, as a tenant sees them (GET
/api/v1/tenant, the dashboard's overview) and as the operator does (/metrics, a session of
every tenant): each tenant sees its own numbers and never another's. And a run log trimmed
for its tenant's run_log_bytes says so on its job's page, in the API and on the dashboard."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from corral import config, launching, model, store, tenancy
from corral.store import Finish
from corral.testing import FrozenClock
from tests.support.api import JOB, Api, serving, sign_in

A = model.AttemptState
SETTINGS = config.Settings(
    public_url="https://corral.example.com",
    tenants={
        tenancy.ANY: tenancy.TenantSettings(run_log_bytes=1 << 20),
        "a": tenancy.TenantSettings(
            weight=3, max_running=5, max_queued=10, max_schedules=2, max_monitors=3
        ),
    },
)
"""Tenant a has quotas of its own; every other tenant takes `"*"`'s."""


@pytest.fixture
async def api(db: store.Store) -> AsyncIterator[Api]:
    tokens = [
        ("a-view", "a", "viewer"),
        ("a-op", "a", "operator"),
        ("b-view", "b", "viewer"),
        ("b-op", "b", "operator"),
        ("all-view", None, "viewer"),
    ]
    async with serving(db, tokens, settings=SETTINGS) as made:
        yield made


async def _use(api: Api) -> tuple[int, int]:
    """Tenant a: two jobs queued, one that succeeded with 2,000 bytes of output, one schedule,
    one monitor; tenant b: one job queued. The finished job's id, and the fence of its attempt."""
    for tenant, count in (("a", 3), ("b", 1)):
        op = api.as_(f"{tenant}-op")
        for _ in range(count):
            r = await api.http.post("/api/v1/jobs", json=JOB, headers=op)
            assert r.status_code == 201, r.text
    made = await api.http.post(
        "/api/v1/schedules", json={"name": "n", "every": "1h", **JOB}, headers=api.as_("a-op")
    )
    assert made.status_code == 201, made.text
    watch = {"name": "backup", "period": "1h", "grace": "5m"}
    made = await api.http.post("/api/v1/monitors", json=watch, headers=api.as_("a-op"))
    assert made.status_code == 201, made.text
    [c] = await api.c.store.jobs.claim(now=api.c.clock.now(), limit=1, executors=["noop"])
    assert c.job.tenant == "a"
    output = launching.RunLog(streams=(launching.Stream("stdout", "x" * 2000, 2000),))
    won = Finish(c.attempt.id, A.SUCCEEDED, 0, None, output=output)
    await api.c.store.attempts.settle(launched=[], finishes=[won], now=api.c.clock.now())
    return c.job.id, c.attempt.id


def _quotas(body: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    return {name: (q["use"], q["limit"]) for name, q in body["quotas"].items()}


async def test_a_token_sees_its_own_tenant_s_quotas_and_use_and_no_other_s(api: Api) -> None:
    await _use(api)
    a = await api.http.get("/api/v1/tenant", headers=api.as_("a-view"))
    assert a.status_code == 200, a.text
    assert (a.json()["tenant"], a.json()["weight"]) == ("a", 3.0)
    assert _quotas(a.json()) == {
        "max_running": (0, 5),
        "max_queued": (2, 10),
        "max_schedules": (1, 2),
        "max_monitors": (1, 3),
        "submit_rate": (pytest.approx(a.json()["quotas"]["submit_rate"]["use"]), 6000),
        "max_payload_bytes": (None, 1 << 20),
        "run_log_bytes": (2000, 1 << 20),
    }
    b = (await api.http.get("/api/v1/tenant", headers=api.as_("b-view"))).json()
    assert (b["tenant"], b["weight"]) == ("b", 1.0)
    assert _quotas(b)["max_queued"] == (1, 100_000)
    assert _quotas(b)["run_log_bytes"] == (0, 1 << 20)
    assert _quotas(b)["max_schedules"] == (0, 1000)
    assert _quotas(b)["max_monitors"] == (0, 100)
    # Naming another tenant, or one that does not exist, is the same 404.
    for name in ("a", "nobody"):
        other = await api.http.get(f"/api/v1/tenant?tenant={name}", headers=api.as_("b-view"))
        assert (other.status_code, other.json()) == (404, {"error": f"no tenant {name!r}"})
    own = await api.http.get("/api/v1/tenant?tenant=b", headers=api.as_("b-view"))
    assert own.json() == b


async def test_a_token_of_every_tenant_names_the_tenant_it_asks_about(api: Api) -> None:
    await _use(api)
    bare = await api.http.get("/api/v1/tenant", headers=api.as_("all-view"))
    assert bare.status_code == 400
    assert bare.json()["field"] == "tenant"
    assert "corral tenants list" in bare.json()["error"]
    a = await api.http.get("/api/v1/tenant?tenant=a", headers=api.as_("all-view"))
    assert _quotas(a.json())["max_queued"] == (2, 10)
    gone = await api.http.get("/api/v1/tenant?tenant=nobody", headers=api.as_("all-view"))
    assert gone.status_code == 404
    assert gone.json()["error"].startswith("no tenant 'nobody'")


async def test_the_route_is_in_the_openapi_document(api: Api) -> None:
    doc = (await api.http.get("/api/v1/openapi.json")).json()
    route = doc["paths"]["/api/v1/tenant"]["get"]
    assert [p["name"] for p in route["parameters"]] == ["tenant"]
    assert {"200", "400", "401", "404"} <= set(route["responses"])


def _scraped(text: str) -> dict[tuple[str, tuple[Any, ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("corral_tenant_")
    }


async def test_metrics_show_each_tenant_s_use_against_its_quotas_to_every_tenant_only(
    api: Api,
) -> None:
    await _use(api)
    refused = await api.http.get("/metrics", headers=api.as_("a-view"))
    assert refused.status_code == 403
    assert "corral_tenant" not in refused.text
    r = await api.http.get("/metrics", headers=api.as_("all-view"))
    assert r.status_code == 200
    got = _scraped(r.text)

    def of(name: str, tenant: str, quota: str | None = None) -> float | None:
        labels = (("quota", quota), ("tenant", tenant)) if quota else (("tenant", tenant),)
        return got.get((name, labels))

    assert of("corral_tenant_quota_use", "a", "max_queued") == 2
    assert of("corral_tenant_quota_limit", "a", "max_queued") == 10
    assert of("corral_tenant_quota_use", "a", "run_log_bytes") == 2000
    assert of("corral_tenant_quota_use", "b", "max_queued") == 1
    assert of("corral_tenant_quota_limit", "b", "max_running") is None  # none: no sample
    assert of("corral_tenant_quota_use", "b", "max_payload_bytes") is None  # nothing uses it
    assert of("corral_tenant_quota_limit", "b", "max_payload_bytes") == 1 << 20
    assert of("corral_tenant_weight", "a") == 3
    assert {dict(labels)["tenant"] for _, labels in got} == {"a", "b"}


async def _session(api: Api, name: str, tenant: str | None) -> httpx.AsyncClient:
    """The app's client, signed in as a new operator user `name` of `tenant`."""
    await api.c.user_add(name, password="correct horse", tenant=tenant, role="operator")
    signed = await sign_in(api.http, name=name, password="correct horse")
    assert signed.status_code == 303
    return api.http


def _row(page: str, tenant: str) -> str | None:
    found = re.search(rf"<tr><td>{tenant}</td>(.*?)</tr>", page, re.S)
    return found[1] if found else None


async def test_the_overview_shows_the_session_s_tenant_s_quotas(api: Api) -> None:
    await _use(api)
    http = await _session(api, "ada", "a")
    page = (await http.get("/ui/")).text
    assert 'id="quotas"' in page
    mine = _row(page, "a")
    assert mine is not None
    uses = re.findall(
        r'<span class="use">([^<]*)</span> / <span class="limit">([^<]*)</span>', mine
    )
    assert uses == [
        ("0", "5"),
        ("2", "10"),
        ("1", "2"),
        (uses[3][0], "6,000"),
        ("2 KiB", "1 MiB"),  # 2,000 bytes
    ]
    assert '<meter min="0" max="1"' in mine
    assert _row(page, "b") is None  # another tenant's row is never shown


async def test_the_overview_of_every_tenant_shows_each_tenant_s_row(api: Api) -> None:
    await _use(api)
    http = await _session(api, "root", None)
    page = (await http.get("/ui/")).text
    assert _row(page, "a") is not None
    theirs = _row(page, "b")
    assert theirs is not None
    assert '<span class="use">1</span> / <span class="limit">100,000</span>' in theirs


async def test_a_job_whose_log_was_trimmed_says_so(api: Api) -> None:
    job_id, fence = await _use(api)
    clock = api.c.clock
    assert isinstance(clock, FrozenClock)
    done = await api.c.store.runlogs.trim(tenant="a", over=1, limit=10, now=clock.now())
    assert done.jobs == (job_id,)
    view = api.as_("a-view")
    page = (await api.http.get(f"/api/v1/jobs/{job_id}", headers=view)).json()
    [attempt] = page["attempt_list"]
    assert attempt["output_trimmed_at"] == clock.now().isoformat()
    logs = (await api.http.get(f"/api/v1/jobs/{job_id}/logs", headers=view)).json()
    assert [(e["streams"], e["output_trimmed_at"]) for e in logs] == [([], clock.now().isoformat())]
    http = await _session(api, "ada", "a")
    shown = (await http.get(f"/ui/jobs/{job_id}")).text
    assert "Output trimmed to keep its tenant under its run_log_bytes quota" in shown
    assert f"fence <b>{fence}</b>" in shown
