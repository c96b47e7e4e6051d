"""The REST API through httpx against the app, on both databases: tokens and roles,
jobs submitted, listed, looked at and changed, errors that name the field, and tenant
isolation on every route of the route table."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from corral import client, config, model, shapes, store
from corral.api import MAX_BODY
from corral.store import Finish
from tests.support.api import JOB, Api, noop_client, over_http, serving

A, J = model.AttemptState, model.JobState
TOKENS = [
    ("a-op", "a", "operator"),
    ("a-view", "a", "viewer"),
    ("b-op", "b", "operator"),
    ("b-admin", "b", "admin"),
    ("admin", None, "admin"),
]
PING_ROUTES = {"/ping/{key}", "/ping/{key}/{action}"}
"""The one named exception of the isolation test, exactly: any other route outside /api/v1
gets a case."""


@pytest.fixture
async def api(db: store.Store) -> AsyncIterator[Api]:
    async with serving(db, TOKENS) as made:
        yield made


async def test_no_token_or_a_bad_one_is_401_and_the_health_routes_need_none(api: Api) -> None:
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic x"}):
        r = await api.http.get("/api/v1/jobs", headers=headers)
        assert r.status_code == 401
        assert r.headers["www-authenticate"] == "Bearer"
        assert r.json()["field"] == "authorization"
    assert (await api.http.get("/healthz")).json() == {"status": "ok"}
    assert (await api.http.get("/readyz")).json() == {"status": "ready"}


async def test_a_revoked_or_expired_token_is_refused(api: Api) -> None:
    _made, secret = await api.c.token_create(
        name="t", tenant="a", role="viewer", expires=timedelta(hours=1)
    )
    auth = {"Authorization": f"Bearer {secret}"}
    assert (await api.http.get("/api/v1/jobs", headers=auth)).status_code == 200
    api.c.clock.advance(3601)  # type: ignore[attr-defined]
    assert (await api.http.get("/api/v1/jobs", headers=auth)).status_code == 401
    _, secret = await api.c.token_create(name="u", tenant="a", role="viewer")
    auth = {"Authorization": f"Bearer {secret}"}
    [listed] = [t for t in await api.c.store.tokens.list() if t.name == "u"]
    await api.c.token_revoke(listed.id)  # through this process: refused at once
    assert (await api.http.get("/api/v1/jobs", headers=auth)).status_code == 401


async def test_a_token_revoked_by_another_process_is_refused_within_seconds(api: Api) -> None:
    _, secret = await api.c.token_create(name="v", tenant="a", role="viewer")
    auth = {"Authorization": f"Bearer {secret}"}
    assert (await api.http.get("/api/v1/jobs", headers=auth)).status_code == 200
    [listed] = [t for t in await api.c.store.tokens.list() if t.name == "v"]
    await api.c.store.tokens.revoke(token_id=listed.id, now=api.c.clock.now())  # elsewhere
    assert (await api.http.get("/api/v1/jobs", headers=auth)).status_code == 200, "still kept"
    api.c.clock.advance(client.tokens.TOKEN_FRESH_SECONDS)  # type: ignore[attr-defined]
    assert (await api.http.get("/api/v1/jobs", headers=auth)).status_code == 401


async def test_a_submit_returns_the_job_and_a_viewer_may_not_submit(api: Api) -> None:
    body = {**JOB, "queue": "q", "idempotency_key": "k", "payload": {"n": 1}}
    r = await api.http.post("/api/v1/jobs", json=body, headers=api.as_("a-op"))
    assert r.status_code == 201, r.text
    job = r.json()
    assert (job["queue"], job["tenant"], job["payload"], job["created"]) == (
        "q",
        "a",
        {"n": 1},
        True,
    )
    again = await api.http.post("/api/v1/jobs", json=body, headers=api.as_("a-op"))
    assert (again.json()["id"], again.json()["created"]) == (job["id"], False)
    refused = await api.http.post("/api/v1/jobs", json=body, headers=api.as_("a-view"))
    assert refused.status_code == 403
    assert refused.json() == {
        "error": "role: viewer may not do this; it takes operator",
        "field": "role",
    }
    many = await api.http.post("/api/v1/jobs", json=[JOB, JOB], headers=api.as_("a-op"))
    assert [j["state"] for j in many.json()] == ["queued", "queued"]
    [entry, *_] = (await api.http.get("/api/v1/audit", headers=api.as_("a-view"))).json()
    assert (entry["action"], entry["tenant"], entry["target"], entry["details"]) == (
        "jobs.submit",
        "a",
        "2 jobs",
        {"count": 2, "ids": [j["id"] for j in many.json()]},
    )


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"queue": "q"}, "spec", "spec: required"),
        ({**JOB, "queue": "no spaces"}, "queue", "must be 1-200 characters"),
        ({**JOB, "colour": "red"}, "colour", "unknown field"),
        ({**JOB, "tenant": "b"}, "tenant", "acts for tenant 'a' only"),
        ([JOB, {**JOB, "priority": "high"}], "1.priority", "priority"),
        ("a string", "body", ""),
        ([], "body", "1 to 1000 jobs"),
    ],
)
async def test_a_bad_submit_names_the_field_and_stores_nothing(
    api: Api, body: Any, field: str, words: str
) -> None:
    r = await api.http.post("/api/v1/jobs", json=body, headers=api.as_("a-op"))
    assert r.status_code == 422, r.text
    assert r.json()["error"].startswith(field)
    assert words in r.json()["error"]
    assert await api.c.store.jobs.list() == []


async def test_a_body_past_the_limit_is_413(api: Api) -> None:
    big = {**JOB, "payload": "x" * MAX_BODY}
    r = await api.http.post("/api/v1/jobs", json=big, headers=api.as_("a-op"))
    assert r.status_code == 413
    assert r.json()["field"] == "body"


async def test_the_list_filters_and_pages_by_keyset(api: Api) -> None:
    made = []
    for n in range(5):
        body = {**JOB, "queue": "even" if n % 2 == 0 else "odd", "labels": {"n": str(n)}}
        r = await api.http.post("/api/v1/jobs", json=body, headers=api.as_("a-op"))
        made.append(r.json()["id"])
    get = api.http.get
    page = (await get("/api/v1/jobs?limit=2", headers=api.as_("a-view"))).json()
    assert [j["id"] for j in page["jobs"]] == made[:2:-1][:2]
    assert page["next"] == made[3]
    rest = (await get(f"/api/v1/jobs?before={page['next']}", headers=api.as_("a-view"))).json()
    assert [j["id"] for j in rest["jobs"]] == made[2::-1]
    assert rest["next"] is None
    odd = (await get("/api/v1/jobs?queue=odd", headers=api.as_("a-view"))).json()
    assert [j["id"] for j in odd["jobs"]] == [made[3], made[1]]
    labelled = (await get("/api/v1/jobs?label=n=4", headers=api.as_("a-view"))).json()
    assert [j["id"] for j in labelled["jobs"]] == [made[4]]
    bad = await get("/api/v1/jobs?state=sleeping", headers=api.as_("a-view"))
    assert bad.status_code == 422
    assert bad.json()["field"] == "state"


async def test_the_list_and_a_job_s_page_answer_each_job_as_its_shape_says(api: Api) -> None:
    """What the list and a job's page answer is shapes' JSON of what the store holds: secrets
    redacted, text as it is, numbers as they were sent, an integer past 64 bits included."""
    secret = {"url": "https://u:pw@example.com/x?token=abc", "headers": {"Authorization": "x"}}
    bodies = [
        {**JOB, "spec": secret, "labels": {"team": "a"}, "payload": {"note": "é ✓"}},
        {**JOB, "spec": secret, "payload": {"ratio": 0.1, "tiny": 1e-7, "huge": 1e16, "n": -3}},
        {**JOB, "payload": {"big": 2**70}},
    ]
    op, view = api.as_("a-op"), api.as_("a-view")
    ids = [(await api.http.post("/api/v1/jobs", json=b, headers=op)).json()["id"] for b in bodies]
    listed = await api.http.get("/api/v1/jobs", headers=view)
    assert listed.headers["content-type"] == "application/json"
    assert "pw" not in listed.text
    stored = [await api.c.store.jobs.get(job_id=i) for i in reversed(ids)]
    shaped = json.loads(
        json.dumps([{**shapes.job_dict(j), **shapes.listed_facts(j, None)} for j in stored])
    )
    assert listed.json() == {"jobs": shaped, "next": None}
    assert listed.json()["jobs"][0]["payload"] == {"big": 2**70}
    for job_id in ids:
        page = await api.http.get(f"/api/v1/jobs/{job_id}", headers=view)
        assert page.json() == json.loads(json.dumps(shapes.view_dict(await api.c.job(job_id))))


async def test_a_job_s_page_events_logs_explain_and_changes(api: Api) -> None:
    op, view = api.as_("a-op"), api.as_("a-view")
    job = (await api.http.post("/api/v1/jobs", json=JOB, headers=op)).json()
    [c] = await api.c.store.jobs.claim(now=api.c.clock.now(), limit=1, executors=["noop"])
    failed = Finish(c.attempt.id, A.FAILED, 2, "exit 2", model.FailureClass.PERMANENT)
    await api.c.store.attempts.finish(finishes=[failed], now=api.c.clock.now())
    page = (await api.http.get(f"/api/v1/jobs/{job['id']}", headers=view)).json()
    assert page["state"] == "quarantined"
    assert [a["state"] for a in page["attempt_list"]] == ["failed"]
    events = (await api.http.get(f"/api/v1/jobs/{job['id']}/events", headers=view)).json()
    assert events[-1]["to"] == "quarantined"
    logs = (await api.http.get(f"/api/v1/jobs/{job['id']}/logs", headers=view)).json()
    assert [(entry["attempt"], entry["state"]) for entry in logs] == [(1, "failed")]
    said = (await api.http.get(f"/api/v1/jobs/{job['id']}/explain", headers=view)).json()
    assert said["cause"] == "quarantined"
    retried = await api.http.post(f"/api/v1/jobs/{job['id']}/retry", headers=op)
    assert retried.json()["state"] == "queued"
    cancelled = await api.http.post(f"/api/v1/jobs/{job['id']}/cancel", headers=op)
    assert cancelled.json()["state"] == "cancelled"
    rerun = await api.http.post(f"/api/v1/jobs/{job['id']}/rerun", headers=op)
    assert rerun.status_code == 201
    assert rerun.json()["id"] != job["id"]
    actions = [e["action"] for e in (await api.http.get("/api/v1/audit", headers=view)).json()]
    assert actions == ["jobs.rerun", "jobs.cancel", "jobs.retry", "jobs.submit"]


async def test_the_openapi_document_lists_every_route(api: Api) -> None:
    doc = (await api.http.get("/api/v1/openapi.json")).json()
    assert {"/api/v1/jobs", "/api/v1/jobs/{job_id}", "/api/v1/jobs/{job_id}/cancel"} <= set(
        doc["paths"]
    )


async def test_no_route_shows_or_changes_another_tenant_s_job_or_schedule(api: Api) -> None:
    """Generated from the app's route table: every route under /api/v1, called with
    tenant b's operator token about tenant a's job or schedule, answers 404 (a route with
    one in its path) or shows nothing of it (any other). A route this test does not know
    how to call fails it: add it here with its isolation case."""
    job = (
        await api.http.post(
            "/api/v1/jobs", json={**JOB, "queue": "secret-queue"}, headers=api.as_("a-op")
        )
    ).json()
    await api.http.post(f"/api/v1/jobs/{job['id']}/cancel", headers=api.as_("a-op"))
    made = await api.http.post(
        "/api/v1/schedules",
        json={"name": "a-nightly", "every": "1h", **JOB, "queue": "secret-queue"},
        headers=api.as_("a-op"),
    )
    assert made.status_code == 201, made.text
    hook = {"name": "a-nightly", "kind": "webhook", "url": "https://93.184.216.34/secret-queue"}
    made = await api.http.post("/api/v1/alerts/channels", json=hook, headers=api.as_("a-op"))
    assert made.status_code == 201, made.text
    rule = {"name": "a-nightly", "on": ["failed"], "channels": ["a-nightly"]}
    made = await api.http.post("/api/v1/alerts/rules", json=rule, headers=api.as_("a-op"))
    assert made.status_code == 201, made.text
    # A monitor made in the store: these settings have no public_url, which the API wants.
    await api.c.store.monitors.add(
        new=(await _a_monitor(api)), rule=None, most=10, rules_most=10, now=api.c.clock.now()
    )
    flow = {"name": "a-nightly", "rate": "7/1m"}
    made = await api.http.post("/api/v1/flows", json=flow, headers=api.as_("a-op"))
    assert made.status_code == 201, made.text
    # A schedule and a flow apply made (managed): b's apply with prune must not reach them.
    kept = {"kind": "Schedule", "name": "a-applied", "every": "1h", **JOB, "queue": "secret-queue"}
    applied = [kept, {"kind": "Flow", "name": "a-applied", "parallelism": 3}]
    made = await api.http.post(
        "/api/v1/apply", json={"documents": applied}, headers=api.as_("a-op")
    )
    assert made.status_code == 200, made.text
    [a_token] = [t for t in await api.c.store.tokens.list() if t.name == "a-op"]
    bulk = {"action": "cancel", "filter": {"queue": "secret-queue"}, "expect": 0}
    op = (await api.http.post("/api/v1/operations", json=bulk, headers=api.as_("a-op"))).json()
    known = {
        "operation_id": (str(op["id"]), f"no operation {op['id']}"),
        "job_id": (str(job["id"]), f"no job {job['id']}"),
        "name": ("a-nightly", None),
        "token_id": (str(a_token.id), f"no token {a_token.id}"),
    }
    app = api.http._transport.app  # type: ignore[attr-defined]
    table = app.openapi()["paths"]  # every route of the app, but /healthz and /readyz
    checked = 0
    assert PING_ROUTES <= set(table)  # the exception names routes that are
    for path_of, operations in table.items():
        if path_of in PING_ROUTES:
            # The one named exception: a monitor's ping URL is outside /api/v1 and takes no
            # token; its random key is the authority, and reaches one monitor only
            # (tests/integration/test_monitors.py: an unknown or rotated key is 404).
            continue
        for method in (m.upper() for m in operations):
            params = set(re.findall(r"{(\w+)}", path_of))
            if params - set(known):
                pytest.fail(f"{method} {path_of}: no isolation case for {params}")
            path = path_of
            for param in params:
                path = path.replace(f"{{{param}}}", known[param][0])
            if path.endswith("/stream"):
                path += "?follow=false&after=0"  # all of it, then the end
            body = (JOB if not params else {}) if method in ("POST", "PATCH") else None
            if path == "/api/v1/apply":  # b's own documents: none, and prune what it made
                body = {"documents": [], "prune": True}
            who = "b-admin" if "/tokens" in path else "b-op"
            r = await api.http.request(method, path, json=body, headers=api.as_(who))
            if params:
                assert r.status_code == 404, f"{method} {path}: {r.status_code} {r.text}"
                said = known[next(iter(params))][1]
                assert said is None or r.json() == {"error": said}
            else:
                assert r.status_code < 500, f"{method} {path}: {r.status_code} {r.text}"
                assert "secret-queue" not in r.text, f"{method} {path} shows tenant a's"
                assert f'"job_id": {job["id"]}' not in r.text, f"{method} {path} shows a's"
            checked += 1
    assert checked >= 20
    # b's own tenant is all it sees of tenants: a's schedule and job are not counted, and
    # a's numbers are not found, as a tenant that does not exist is not.
    mine = (await api.http.get("/api/v1/tenant", headers=api.as_("b-op"))).json()
    assert mine["tenant"] == "b"
    assert mine["quotas"]["max_schedules"]["use"] == 0
    waiting = (await api.http.get("/api/v1/jobs?state=queued", headers=api.as_("b-op"))).json()
    assert mine["quotas"]["max_queued"]["use"] == len(waiting["jobs"])  # b's own submit
    for name in ("a", "nobody"):
        theirs = await api.http.get(f"/api/v1/tenant?tenant={name}", headers=api.as_("b-op"))
        assert (theirs.status_code, theirs.json()) == (404, {"error": f"no tenant {name!r}"})
    assert (await api.c.store.jobs.get(job_id=job["id"])).state == J.CANCELLED  # untouched by b
    assert (await api.c.schedule("a-nightly", tenant="a")).paused_at is None
    assert [r.name for r in await api.c.tenant_rules("a")] == ["a-nightly"]  # untouched by b
    assert [ch.name for ch in await api.c.tenant_channels("a")] == ["a-nightly"]
    assert (await api.c.monitor("a", "a-nightly")).state == "up"  # untouched by b
    assert [(f.name, str(f.rate)) for f in await api.c.flows("a")] == [
        ("a-applied", "None"),
        ("a-nightly", "7/1m"),
    ]  # untouched by b, the one apply made too
    assert [f.name for f in await api.c.flows("b")] == []
    assert (await api.c.schedule("a-applied", tenant="a")).managed  # not pruned by b
    admin = await api.http.get(f"/api/v1/jobs/{job['id']}", headers=api.as_("admin"))
    assert admin.status_code == 200  # an admin of every tenant sees it
    own = await api.http.get("/api/v1/schedules/a-nightly?tenant=a", headers=api.as_("admin"))
    assert own.status_code == 200


async def _a_monitor(api: Api) -> Any:
    from corral import monitoring

    now = api.c.clock.now()
    return monitoring.Monitor(
        id=0, tenant="a", name="a-nightly", ping_key="", period=timedelta(hours=1), cron=None,
        tz="UTC", grace=timedelta(minutes=5), state="up", state_at=now, basis_at=now,
        expected_at=None, check_at=None, last_ping_at=None, run_started_at=None, created_at=now,
    )  # fmt: skip


async def test_schedules_are_made_changed_fired_and_backfilled(api: Api) -> None:
    op, view = api.as_("a-op"), api.as_("a-view")
    body = {"name": "nightly", "cron": "0 2 * * *", "tz": "Europe/Paris", **JOB, "queue": "n"}
    made = await api.http.post("/api/v1/schedules", json=body, headers=op)
    assert made.status_code == 201, made.text
    assert (made.json()["tenant"], made.json()["cron"]) == ("a", "0 2 * * *")
    assert len(made.json()["upcoming"]) == 5
    again = await api.http.post("/api/v1/schedules", json=body, headers=op)
    assert again.status_code == 409 or again.status_code == 422
    listed = (await api.http.get("/api/v1/schedules", headers=view)).json()
    assert [s["name"] for s in listed] == ["nightly"]
    changed = await api.http.patch(
        "/api/v1/schedules/nightly", json={"cron": "30 3 * * *", "priority": 5}, headers=op
    )
    assert changed.status_code == 200, changed.text
    assert (changed.json()["cron"], changed.json()["template"]["priority"]) == ("30 3 * * *", 5)
    paused = (await api.http.post("/api/v1/schedules/nightly/pause", headers=op)).json()
    assert (paused["paused"], paused["upcoming"]) == (True, [])
    resumed = (await api.http.post("/api/v1/schedules/nightly/resume", headers=op)).json()
    assert resumed["paused"] is False
    fired = await api.http.post("/api/v1/schedules/nightly/trigger", headers=op)
    assert fired.status_code == 201
    page = (await api.http.get(f"/api/v1/jobs/{fired.json()['id']}", headers=view)).json()
    assert page["queue"] == "n"
    preview = (await api.http.get("/api/v1/schedules/nightly/preview?count=3", headers=view)).json()
    assert len(preview) == 3
    assert preview[0]["at"].endswith(":30:00+01:00") or preview[0]["at"].endswith(":30:00+02:00")
    window = {"from": "2026-11-01T00:00:00Z", "to": "2026-11-04T00:00:00Z"}
    filled = await api.http.post("/api/v1/schedules/nightly/backfill", json=window, headers=op)
    assert filled.json() == {"created": 3, "existing": 0, "dry_run": False}
    shown = (await api.http.get("/api/v1/schedules/nightly", headers=view)).json()
    assert len(shown["firings"]) >= 4
    gone = await api.http.delete("/api/v1/schedules/nightly", headers=op)
    assert gone.json()["deleted"] is True
    assert (await api.http.get("/api/v1/schedules/nightly", headers=view)).status_code == 404
    actions = [e["action"] for e in (await api.http.get("/api/v1/audit", headers=view)).json()]
    assert actions[:4] == [
        "schedules.delete",
        "schedules.backfill",
        "schedules.trigger",
        "schedules.resume",
    ]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"every": "1h", **JOB}, "name"),
        ({"name": "x", "every": "1h", **JOB, "catchup_max": "lots"}, "catchup_max"),
        ({"name": "x", "cron": "61 * * * *", **JOB}, "cron"),
        ({"name": "x", "every": "1h", **JOB, "colour": "red"}, "colour"),
        ({"name": "x", "every": "1h", **JOB, "tenant": "b"}, "tenant"),
        ({"name": "x", "every": "1h", "queue": "q"}, "spec"),
    ],
)
async def test_a_bad_schedule_names_the_field(api: Api, body: Any, field: str) -> None:
    r = await api.http.post("/api/v1/schedules", json=body, headers=api.as_("a-op"))
    assert r.status_code == 422, r.text
    assert r.json()["error"].startswith(field)
    assert await api.c.schedules() == []


async def test_pools_and_alert_rules_are_read(api: Api) -> None:
    settings = config.Settings(
        pools={"nightly": 2},
        executors={"http": {"allow_networks": ["127.0.0.0/8:1024-65535"]}},  # type: ignore[arg-type]
        alerts={  # type: ignore[arg-type]
            "channels": {"hook": {"kind": "webhook", "url": "http://127.0.0.1:9/hook"}},
            "rules": {
                "mine": {"on": ["failed"], "channels": ["hook"], "match": {"tenant": "a"}},
                "theirs": {"on": ["failed"], "channels": ["hook"], "match": {"tenant": "b"}},
            },
        },
    )
    c = noop_client(api.c.store, settings=settings, clock_=api.c.clock)
    async with over_http(c) as http:
        made = await http.post(
            "/api/v1/jobs", json={**JOB, "pool": "nightly"}, headers=api.as_("a-op")
        )
        assert made.status_code == 201, made.text
        await c.store.jobs.claim(
            now=c.clock.now(), limit=1, executors=["noop"], pools=settings.pools
        )
        pools = await http.get("/api/v1/pools", headers=api.as_("a-view"))
        assert pools.json() == [{"name": "nightly", "limit": 2, "running": 1}]
        rules = (await http.get("/api/v1/alerts/rules", headers=api.as_("a-view"))).json()
        assert list(rules["rules"]) == ["mine"]  # another tenant's rule is not shown
        assert (await http.get("/api/v1/alerts", headers=api.as_("a-view"))).json() == []


def _sse(text: str) -> list[dict[str, Any]]:
    """The data of each message of a text/event-stream body."""
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]


async def test_a_job_s_events_stream_until_it_ends_and_all_events_resume_by_id(
    api: Api,
) -> None:
    op, view = api.as_("a-op"), api.as_("a-view")
    mine = (await api.http.post("/api/v1/jobs", json=JOB, headers=op)).json()["id"]
    theirs = (await api.http.post("/api/v1/jobs", json=JOB, headers=api.as_("b-op"))).json()
    claimed = await api.c.store.jobs.claim(now=api.c.clock.now(), limit=2, executors=["noop"])
    await api.c.store.attempts.finish(
        finishes=[Finish(c.attempt.id, A.SUCCEEDED, 0, None) for c in claimed],
        now=api.c.clock.now(),
    )
    r = await api.http.get(f"/api/v1/jobs/{mine}/events/stream", headers=view)
    assert r.headers["content-type"].startswith("text/event-stream")
    said = _sse(r.text)
    assert [(e["job_id"], e["to"]) for e in said if e["entity"] == "job"] == [
        (mine, "queued"),
        (mine, "running"),
        (mine, "succeeded"),
    ]
    everything = _sse(
        (await api.http.get("/api/v1/events/stream?follow=false&after=0", headers=view)).text
    )
    assert {e["job_id"] for e in everything} == {mine}  # never tenant b's
    assert theirs["id"] != mine
    resumed = await api.http.get(
        "/api/v1/events/stream?follow=false",
        headers={**view, "Last-Event-ID": str(everything[1]["id"])},
    )
    assert [e["id"] for e in _sse(resumed.text)] == [e["id"] for e in everything[2:]]


async def test_admins_make_list_and_revoke_tokens_of_their_own_tenant_only(api: Api) -> None:
    await api.token("a-admin", "a", "admin")
    made = await api.http.post(
        "/api/v1/tokens",
        json={"name": "ci", "tenant": "a", "role": "viewer", "expires": "90d"},
        headers=api.as_("a-admin"),
    )
    assert made.status_code == 201, made.text
    secret = made.json()["secret"]
    use = {"Authorization": f"Bearer {secret}"}
    assert (await api.http.get("/api/v1/jobs", headers=use)).status_code == 200
    other = await api.http.post(
        "/api/v1/tokens",
        json={"name": "x", "tenant": "b", "role": "admin"},
        headers=api.as_("a-admin"),
    )
    assert other.status_code == 422
    assert other.json()["field"] == "tenant"
    listed = (await api.http.get("/api/v1/tokens", headers=api.as_("a-admin"))).json()
    assert {t["tenant"] for t in listed} == {"a"}
    assert all("secret" not in t for t in listed)
    [theirs] = [t for t in await api.c.store.tokens.list() if t.name == "b-op"]
    refused = await api.http.post(f"/api/v1/tokens/{theirs.id}/revoke", headers=api.as_("a-admin"))
    assert refused.status_code == 404
    assert (await api.http.get("/api/v1/tokens", headers=api.as_("a-op"))).status_code == 403
    gone = await api.http.post(
        f"/api/v1/tokens/{made.json()['id']}/revoke", headers=api.as_("a-admin")
    )
    assert gone.json()["revoked_at"] is not None
    assert (await api.http.get("/api/v1/jobs", headers=use)).status_code == 401


async def test_a_run_at_in_the_past_needs_allow_past_and_delay_sets_one(db: store.Store) -> None:
    """By the injected clock: a run_at more than a second before now is refused unless
    allow_past; `delay` (a duration, a bare number of seconds) sets run_at from now."""
    from corral.testing import FrozenClock
    from tests.support.api import JOB, serving

    clock = FrozenClock()
    async with serving(db, [("op", "a", "operator")], clock_=clock) as api:
        past = (clock.now() - timedelta(hours=3)).isoformat()
        refused = await api.http.post(
            "/api/v1/jobs", json={**JOB, "run_at": past}, headers=api.as_("op")
        )
        assert refused.status_code == 422
        assert refused.json()["field"] == "run_at"
        assert "is 3h before now; send allow_past: true" in refused.json()["error"]
        just = (clock.now() - timedelta(milliseconds=500)).isoformat()  # a clock's skew
        for body in ({"run_at": past, "allow_past": True}, {"run_at": just}):
            taken = await api.http.post("/api/v1/jobs", json={**JOB, **body}, headers=api.as_("op"))
            assert taken.status_code == 201, taken.text
        for delay, seconds in (("10m", 600), (90, 90), ("90", 90)):
            made = await api.http.post(
                "/api/v1/jobs", json={**JOB, "delay": delay}, headers=api.as_("op")
            )
            assert made.status_code == 201, made.text
            run_at = datetime.fromisoformat(made.json()["run_at"])
            assert run_at == clock.now() + timedelta(seconds=seconds)
        both = await api.http.post(
            "/api/v1/jobs", json={**JOB, "delay": "1m", "run_at": past}, headers=api.as_("op")
        )
        assert both.status_code == 422
        assert both.json()["field"] == "delay"
