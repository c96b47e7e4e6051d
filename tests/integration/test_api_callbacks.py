"""Callbacks through the REST API, on both databases: a job's and a schedule's callbacks
given in their bodies and shown back, a bad one refused naming the field, a tenant not
granted `http` refused one, and the callback job its tenant's alone."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from corral import config, model, store
from corral.executors import http
from corral.store import Finish
from tests.support.api import JOB, Api, granting, serving

A = model.AttemptState
HOOK = "https://hooks.example.com/done"
TOKENS = [("a-op", "a", "operator"), ("b-op", "b", "operator"), ("c-op", "c", "operator")]


@pytest.fixture
async def api(db: store.Store) -> AsyncIterator[Api]:
    settings = granting(
        config.Settings(tenants={"c": {"executors": ["python"]}}), "noop", tenant="c"
    )
    async with serving(db, TOKENS, settings=settings) as made:
        made.c.checkers = {**made.c.checkers, "http": http.SpecCheck(made.c.settings)}
        yield made


async def test_a_jobs_callback_is_shown_and_its_callback_job_is_its_tenants_alone(
    api: Api,
) -> None:
    body = {**JOB, "callback": HOOK, "failure_callback": None}
    r = await api.http.post("/api/v1/jobs", json=body, headers=api.as_("a-op"))
    assert r.status_code == 201, r.text
    job = r.json()
    assert (job["callback"], job["failure_callback"], job["callback_of"]) == (HOOK, None, None)
    db, now = api.c.store, api.c.clock.now()
    [claimed] = await db.jobs.claim(now=now, limit=1, executors=["noop"])
    await db.attempts.finish(finishes=[Finish(claimed.attempt.id, A.SUCCEEDED, 0, None)], now=now)
    [callback] = [j for j in await db.jobs.list() if j.callback_of == job["id"]]
    mine = await api.http.get(f"/api/v1/jobs/{callback.id}", headers=api.as_("a-op"))
    assert mine.status_code == 200
    assert (mine.json()["tenant"], mine.json()["callback_of"]) == ("a", job["id"])
    theirs = await api.http.get(f"/api/v1/jobs/{callback.id}", headers=api.as_("b-op"))
    assert theirs.status_code == 404
    listed = await api.http.get("/api/v1/jobs", headers=api.as_("b-op"))
    assert [j["id"] for j in listed.json()["jobs"]] == []
    cancel = await api.http.post(f"/api/v1/jobs/{callback.id}/cancel", headers=api.as_("b-op"))
    assert cancel.status_code == 404


@pytest.mark.parametrize(
    ("field", "url"),
    [
        ("callback", "ftp://x.example/"),
        ("failure_callback", "http://10.0.0.1/"),
        ("callback", "https://hooks.example.com/{{job}}"),
    ],
)
async def test_a_bad_callback_is_refused_naming_the_field(api: Api, field: str, url: str) -> None:
    r = await api.http.post("/api/v1/jobs", json={**JOB, field: url}, headers=api.as_("a-op"))
    assert r.status_code == 422, r.text
    assert r.json()["error"].startswith(f"{field}: ")
    r = await api.http.post(
        "/api/v1/schedules",
        json={**JOB, "name": "s", "every": "1h", field: url},
        headers=api.as_("a-op"),
    )
    assert r.status_code == 422, r.text
    assert r.json()["error"].startswith(f"{field}: ")
    assert await api.c.store.jobs.list() == []


async def test_a_tenant_not_granted_http_may_name_no_callback(api: Api) -> None:
    r = await api.http.post("/api/v1/jobs", json={**JOB, "callback": HOOK}, headers=api.as_("c-op"))
    assert r.status_code == 403, r.text
    assert "'http'" in r.json()["error"]


async def test_a_schedules_callbacks_are_given_shown_and_removed(api: Api) -> None:
    body = {**JOB, "name": "nightly", "every": "1h", "failure_callback": HOOK}
    r = await api.http.post("/api/v1/schedules", json=body, headers=api.as_("a-op"))
    assert r.status_code == 201, r.text
    assert r.json()["template"]["failure_callback"] == HOOK
    r = await api.http.patch(
        "/api/v1/schedules/nightly", json={"failure_callback": None}, headers=api.as_("a-op")
    )
    assert r.status_code == 200, r.text
    assert "failure_callback" not in r.json()["template"]
