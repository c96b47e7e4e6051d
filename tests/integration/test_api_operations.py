"""Bulk actions through the API, on both databases: a preview's exact count and ids, an
operation that runs on that snapshot and reports its progress, a count that changed
refused with the new one, roles, the audit log, and tenants kept apart."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from corral import model, operations, store
from tests.support.api import JOB, Api, serving
from tests.support.jobs import quarantine

J = model.JobState
RETRY = {"action": "retry", "filter": {"state": ["quarantined"], "queue": "q"}}


TOKENS = [
    ("a-op", "a", "operator"),
    ("a-view", "a", "viewer"),
    ("b-op", "b", "operator"),
    ("admin", None, "admin"),
]


@pytest.fixture
async def api(db: store.Store) -> AsyncIterator[Api]:
    async with serving(db, TOKENS) as made:
        yield made


async def quarantined(api: Api, n: int, *, token: str = "a-op", queue: str = "q") -> list[int]:
    made = await api.http.post(
        "/api/v1/jobs", json=[{**JOB, "queue": queue}] * n, headers=api.as_(token)
    )
    ids = [j["id"] for j in made.json()]
    await quarantine(api.c.store, api.c.clock, ids)
    return ids


async def run(api: Api) -> None:
    runner = operations.Runner(store=api.c.store, clock=api.c.clock, settings=api.c.settings)
    while await runner.run_once():
        pass


async def test_a_retry_by_filter_previews_then_runs_on_its_snapshot(api: Api) -> None:
    op, view = api.as_("a-op"), api.as_("a-view")
    ids = await quarantined(api, 4)
    preview = await api.http.post("/api/v1/jobs/bulk/preview", json=RETRY, headers=op)
    assert preview.status_code == 200, preview.text
    seen = preview.json()
    assert (seen["count"], seen["sample"], seen["tenant"]) == (4, ids[::-1], "a")
    made = await api.http.post("/api/v1/operations", json={**RETRY, "expect": 4}, headers=op)
    assert made.status_code == 202, made.text
    started = made.json()
    assert (started["state"], started["total"], started["applied"]) == ("running", 4, 0)
    later = await quarantined(api, 2)  # match the filter, after the snapshot
    await api.c.dead_discard(ids[0])  # a person got there first
    await run(api)
    got = await api.http.get(f"/api/v1/operations/{started['id']}", headers=view)
    done = got.json()
    assert (done["state"], done["total"], done["applied"], done["skipped"], done["left"]) == (
        "succeeded",
        4,
        3,
        1,
        0,
    )
    assert done["skipped_jobs"] == [
        {"job_id": ids[0], "note": "cancelled, not quarantined any more"}
    ]
    states = {j.id: j.state for j in await api.c.store.jobs.get_many(job_ids=ids + later)}
    assert [states[i] for i in ids] == [J.CANCELLED, J.QUEUED, J.QUEUED, J.QUEUED]
    assert [states[i] for i in later] == [J.QUARANTINED, J.QUARANTINED]
    listed = (await api.http.get("/api/v1/operations", headers=view)).json()
    assert [o["id"] for o in listed["operations"]] == [started["id"]]
    audited = (await api.http.get("/api/v1/audit", headers=view)).json()
    started_rows = [a for a in audited if a["action"] == "operations.start"]
    assert [a["target"] for a in started_rows] == [str(started["id"])]
    assert started_rows[0]["details"]["total"] == 4


async def test_a_count_that_changed_is_409_with_the_new_count(api: Api) -> None:
    await quarantined(api, 3)
    r = await api.http.post(
        "/api/v1/operations", json={**RETRY, "expect": 2}, headers=api.as_("a-op")
    )
    assert r.status_code == 409
    assert (r.json()["field"], r.json()["count"]) == ("expect", 3)
    assert (await api.http.get("/api/v1/operations", headers=api.as_("a-op"))).json()[
        "operations"
    ] == []


async def test_a_cancelled_operation_leaves_the_rest(api: Api) -> None:
    op = api.as_("a-op")
    ids = await quarantined(api, 3)
    body = {"action": "discard", "filter": {}, "expect": 3}
    made = (await api.http.post("/api/v1/operations", json=body, headers=op)).json()
    r = await api.http.post(f"/api/v1/operations/{made['id']}/cancel", headers=op)
    assert (r.status_code, r.json()["state"], r.json()["left"]) == (200, "cancelled", 3)
    await run(api)
    assert {j.state for j in await api.c.store.jobs.get_many(job_ids=ids)} == {J.QUARANTINED}


async def test_tenants_are_kept_apart(api: Api) -> None:
    mine = await quarantined(api, 2, token="a-op")
    theirs = await quarantined(api, 2, token="b-op")
    a_op = (
        await api.http.post(
            "/api/v1/operations", json={**RETRY, "expect": 2}, headers=api.as_("a-op")
        )
    ).json()
    await run(api)
    states = {j.id: j.state for j in await api.c.store.jobs.get_many(job_ids=mine + theirs)}
    assert [states[i] for i in mine] == [J.QUEUED, J.QUEUED]
    assert [states[i] for i in theirs] == [J.QUARANTINED, J.QUARANTINED]
    b = api.as_("b-op")
    assert (await api.http.get(f"/api/v1/operations/{a_op['id']}", headers=b)).status_code == 404
    assert (await api.http.get("/api/v1/operations", headers=b)).json()["operations"] == []
    other = {**RETRY, "filter": {"tenant": "a"}}
    r = await api.http.post("/api/v1/jobs/bulk/preview", json=other, headers=b)
    assert (r.status_code, r.json()["field"]) == (422, "filter.tenant")
    admin = await api.http.post("/api/v1/jobs/bulk/preview", json=other, headers=api.as_("admin"))
    assert (admin.json()["count"], admin.json()["tenant"]) == (0, "a")  # a's were retried


async def test_a_viewer_may_read_but_not_act(api: Api) -> None:
    view = api.as_("a-view")
    r = await api.http.post("/api/v1/jobs/bulk/preview", json=RETRY, headers=view)
    assert r.status_code == 403
    r = await api.http.post("/api/v1/operations", json={**RETRY, "expect": 0}, headers=view)
    assert r.status_code == 403
    assert (await api.http.get("/api/v1/operations", headers=view)).status_code == 200


async def test_a_bad_filter_names_the_field(api: Api) -> None:
    op = api.as_("a-op")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"action": "retry", "filter": {"state": ["queued"]}}, "filter.state"),
        ({"action": "retry", "filter": {"state": ["nope"]}}, "filter.state"),
        ({"action": "cancel", "filter": {"label": ["x"]}}, "filter.label"),
        ({"action": "cancel", "filter": {"since": "2026-01-01T00:00:00"}}, "filter.since"),
        ({"action": "cancel", "filter": {"colour": "red"}}, "filter.colour"),
        ({"action": "explode"}, "action"),
    ]
    for body, field in cases:
        r = await api.http.post("/api/v1/jobs/bulk/preview", json=body, headers=op)
        assert r.status_code == 422, (body, r.text)
        assert r.json()["field"] == field, (body, r.json())
