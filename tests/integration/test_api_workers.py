"""Python tasks through the API: a submit checked against the schema its workers
registered, parked jobs listed by tenant and released by hand, and the workers."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from corral import model
from corral.worker import App, Pinned
from tests.integration import test_api
from tests.support.api import Api

J = model.JobState
api = test_api.api  # the same app, store and tokens as the API's own tests


class Invoice(BaseModel):
    customer_id: Pinned[int]
    amount_cents: Pinned[int]


def billing() -> App:
    app = App("billing", version="2.0.0")

    @app.task("send-invoice", version=2)
    def send(invoice: Invoice) -> None: ...

    return app


async def register(api: Api, app: App) -> None:
    from corral.worker import Worker

    w = Worker(app, db=api.c.store, settings=api.c.settings, clk=api.c.clock)
    await api.c.store.workers.register(worker=w.info(), now=api.c.clock.now(), since=api.c.since())


def task_job(**kw: Any) -> dict[str, Any]:
    return {"task": "send-invoice", "payload": {"customer_id": 7, "amount_cents": 100}, **kw}


async def test_a_task_is_submitted_checked_against_its_workers_schema(api: Api) -> None:
    r = await api.http.post("/api/v1/jobs", json=task_job(), headers=api.as_("a-op"))
    assert r.status_code == 422
    assert "no live worker has registered task 'send-invoice'" in r.json()["error"]
    await register(api, billing())
    bad = task_job(payload={"customer_id": 7, "amount_cents": "lots"})
    r = await api.http.post("/api/v1/jobs", json=bad, headers=api.as_("a-op"))
    assert r.status_code == 422
    assert r.json()["error"].startswith("payload.data.amount_cents: 'lots' is not of type")
    r = await api.http.post("/api/v1/jobs", json=task_job(), headers=api.as_("a-op"))
    assert r.status_code == 201, r.text
    made = r.json()
    assert (made["executor"], made["spec"]) == ("python", {"task": "send-invoice", "version": 2})
    assert made["state"] == "queued"  # a live worker reads it
    r = await api.http.post(
        "/api/v1/jobs", json={**task_job(), "spec": {"command": ["true"]}}, headers=api.as_("a-op")
    )
    assert r.status_code == 422


async def test_parked_jobs_are_listed_per_tenant_and_released_by_hand(api: Api) -> None:
    newer = task_job(task_version=3)  # no worker reads version 3: it parks
    a = (await api.http.post("/api/v1/jobs", json=newer, headers=api.as_("a-op"))).json()
    b = (await api.http.post("/api/v1/jobs", json=newer, headers=api.as_("b-op"))).json()
    assert a["state"] == b["state"] == "parked"
    listed = (await api.http.get("/api/v1/parked", headers=api.as_("a-view"))).json()
    assert [p["job_id"] for p in listed] == [a["id"]]  # a's only
    assert listed[0] | {"parked_at": None} == {
        "job_id": a["id"],
        "tenant": "a",
        "queue": "default",
        "task": "send-invoice",
        "version": 3,
        "needs_app_version": None,
        "parked_at": None,
        "reason": listed[0]["reason"],
    }
    everyone = (await api.http.get("/api/v1/parked", headers=api.as_("admin"))).json()
    assert {p["job_id"] for p in everyone} == {a["id"], b["id"]}
    r = await api.http.post(f"/api/v1/jobs/{a['id']}/release", headers=api.as_("b-op"))
    assert r.status_code == 404  # not b's
    r = await api.http.post(f"/api/v1/jobs/{a['id']}/release", headers=api.as_("a-view"))
    assert r.status_code == 403  # a viewer may not
    r = await api.http.post(f"/api/v1/jobs/{a['id']}/release", headers=api.as_("a-op"))
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "queued"
    r = await api.http.post(f"/api/v1/jobs/{a['id']}/release", headers=api.as_("a-op"))
    assert r.status_code == 409  # queued now, not parked
    # A released job is not parked again by itself, though no worker reads it yet.
    assert await api.c.store.workers.park_unread(now=api.c.clock.now(), since=api.c.since()) == 0


async def test_the_workers_are_shown_to_a_token_of_every_tenant_only(api: Api) -> None:
    await register(api, billing())
    r = await api.http.get("/api/v1/workers", headers=api.as_("a-op"))
    assert r.status_code == 403
    [w] = (await api.http.get("/api/v1/workers", headers=api.as_("admin"))).json()
    assert (w["app"], w["app_version"], w["state"]) == ("billing", "2.0.0", "running")
    assert w["reads"] == [{"task": "send-invoice", "version": 2, "newest": True}]
