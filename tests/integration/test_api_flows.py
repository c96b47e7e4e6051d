"""Flows through the REST API and the dashboard, on both databases: a tenant's operator
makes, lists, shows, changes and deletes its flows, submits jobs and a schedule naming one;
a viewer only reads; another tenant's flow of the same name is apart, and never seen; an
admin names the tenant with ?tenant=; the dashboard's /ui/flows lists the tenant's own."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from corral import client, store
from tests.support.api import JOB, Api, over_http, serving
from tests.support.forms import forms_client, signed

TOKENS = [("a-op", "a", "operator"), ("a-view", "a", "viewer"), ("b-op", "b", "operator"),
          ("admin", None, "admin")]  # fmt: skip


@pytest.fixture
async def api(db: store.Store) -> AsyncIterator[Api]:
    async with serving(db, TOKENS) as made:
        yield made


async def test_a_tenant_s_flows_through_the_api(api: Api) -> None:
    op, view, other = api.as_("a-op"), api.as_("a-view"), api.as_("b-op")
    made = await api.http.post(
        "/api/v1/flows", json={"name": "stripe", "rate": "10/1s"}, headers=op
    )
    assert made.status_code == 201, made.text
    assert (made.json()["tenant"], made.json()["rate"], made.json()["parallelism"]) == (
        "a", "10/1s", None,
    )  # fmt: skip
    theirs = {"name": "stripe", "parallelism": 1}
    assert (await api.http.post("/api/v1/flows", json=theirs, headers=other)).status_code == 201
    again = await api.http.post("/api/v1/flows", json={"name": "stripe"}, headers=op)
    assert (again.status_code, again.json()["field"]) == (409, "name")
    bad = await api.http.post("/api/v1/flows", json={"name": "x", "rate": "fast"}, headers=op)
    assert (bad.status_code, bad.json()["field"]) == (422, "rate")
    refused = await api.http.post("/api/v1/flows", json={"name": "y"}, headers=view)
    assert refused.status_code == 403

    listed = (await api.http.get("/api/v1/flows", headers=view)).json()
    assert [(f["name"], f["rate"]) for f in listed] == [("stripe", "10/1s")]
    changed = await api.http.patch(
        "/api/v1/flows/stripe", json={"rate": None, "parallelism": 3}, headers=op
    )
    assert (changed.json()["rate"], changed.json()["parallelism"]) == (None, 3)

    job = await api.http.post("/api/v1/jobs", json={**JOB, "flow": "stripe"}, headers=op)
    assert job.status_code == 201, job.text
    assert job.json()["flow"] == "stripe"
    missing = await api.http.post("/api/v1/jobs", json={**JOB, "flow": "nope"}, headers=op)
    assert (missing.status_code, missing.json()["field"]) == (422, "flow")
    every = {"name": "hourly", "every": "1h", **JOB, "flow": "stripe"}
    assert (await api.http.post("/api/v1/schedules", json=every, headers=op)).status_code == 201

    shown = (await api.http.get("/api/v1/flows/stripe", headers=view)).json()
    assert (shown["running"], shown["started_in_window"], shown["parallelism"]) == (0, 0, 3)
    said = (await api.http.get(f"/api/v1/jobs/{job.json()['id']}/explain", headers=view)).json()
    assert said["cause"] == "due now"  # the flow has room: a dispatcher takes it next
    in_use = await api.http.delete("/api/v1/flows/stripe", headers=op)
    assert in_use.status_code == 409
    assert "have not ended yet" in in_use.json()["error"]

    b_own = (await api.http.get("/api/v1/flows/stripe", headers=other)).json()
    assert (b_own["tenant"], b_own["parallelism"]) == ("b", 1)  # b's own, apart from a's
    for path in ("/api/v1/flows?tenant=a", "/api/v1/flows/stripe?tenant=a"):
        assert (await api.http.get(path, headers=other)).status_code == 404
    admin = await api.http.get("/api/v1/flows/stripe?tenant=a", headers=api.as_("admin"))
    assert admin.json()["tenant"] == "a"
    assert (await api.http.delete("/api/v1/flows/stripe", headers=other)).status_code == 200
    assert [f.name for f in await api.c.flows("a")] == ["stripe"]  # a's stays


@pytest.fixture
async def c(db: store.Store) -> client.Client:
    return await forms_client(db)


@pytest.fixture
async def http(c: client.Client) -> AsyncIterator[httpx.AsyncClient]:
    async with over_http(c) as made:
        yield made


async def test_the_dashboard_lists_the_tenant_s_own_flows(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    await c.flow_add("a", {"name": "stripe", "rate": "600/1m", "parallelism": 4})
    await c.flow_add("b", {"name": "b-only", "rate": "1/1s"})
    await signed(http, c, "vic")
    page = await http.get("/ui/flows")
    assert page.status_code == 200
    assert 'href="/ui/flows" class="here" aria-current="page"' in page.text
    assert 'id="flow-stripe"' in page.text
    assert "600/1m" in page.text
    assert "b-only" not in page.text
    assert (await http.get("/ui/flows?tenant=b")).status_code == 404
