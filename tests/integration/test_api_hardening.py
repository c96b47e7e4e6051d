"""The REST API at its edges, on both databases: input the databases cannot hold or that
would overflow is refused naming the field, a backfill is bounded, the audit log says
whose change it was, no count leaks another tenant's jobs, event streams end and are
limited, the body limit holds for chunked bodies, and state conflicts are 409."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from corral import config, errors, model, store
from corral.api import MAX_BODY, streams
from corral.store import Finish
from corral.testing import PausedClock
from tests.integration.test_api import _sse
from tests.support.api import JOB, Api, serving
from tests.support.wait import eventually

A, J = model.AttemptState, model.JobState
SETTINGS = config.Settings(pools={"nightly": 1})


TOKENS = [
    ("a-op", "a", "operator"),
    ("a-view", "a", "viewer"),
    ("b-op", "b", "operator"),
    ("a-admin", "a", "admin"),
    ("admin", None, "admin"),
]


@pytest.fixture
async def api(db: store.Store) -> AsyncIterator[Api]:
    async with serving(db, TOKENS, settings=SETTINGS) as made:
        yield made


@pytest.fixture
async def paused(db: store.Store) -> AsyncIterator[Api]:
    """The API on a clock whose sleeps take real (short) time and move it not at all."""
    async with serving(db, TOKENS, settings=SETTINGS, clock_=PausedClock()) as made:
        yield made


async def _submit(api: Api, who: str, **body: Any) -> dict[str, Any]:
    r = await api.http.post("/api/v1/jobs", json={**JOB, **body}, headers=api.as_(who))
    assert r.status_code == 201, r.text
    made: dict[str, Any] = r.json()
    return made


async def _audit(api: Api, who: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = (await api.http.get("/api/v1/audit", headers=api.as_(who))).json()
    return found


# --- 1. backfill ------------------------------------------------------------------------


@pytest.mark.parametrize("dry_run", ["true", "false"])
async def test_a_backfill_past_10000_firings_is_refused_before_anything_is_made(
    api: Api, dry_run: str
) -> None:
    body = {"name": "often", "every": "1m", **JOB}
    assert (await api.http.post("/api/v1/schedules", json=body, headers=api.as_("a-op"))).is_success
    now = api.c.clock.now()
    year = {"from": now.isoformat(), "to": (now + timedelta(days=365)).isoformat()}
    r = await api.http.post(
        f"/api/v1/schedules/often/backfill?dry_run={dry_run}", json=year, headers=api.as_("a-op")
    )
    assert r.status_code == 422, r.text
    assert r.json()["field"] == "to"
    assert "10000 firings" in r.json()["error"]
    assert await api.c.store.jobs.list() == []
    week = {"from": now.isoformat(), "to": (now + timedelta(days=6)).isoformat()}
    counted = await api.http.post(
        "/api/v1/schedules/often/backfill?dry_run=true", json=week, headers=api.as_("a-op")
    )
    assert counted.json() == {"created": 6 * 24 * 60, "existing": 0, "dry_run": True}


@pytest.mark.parametrize(
    ("window", "field"),
    [
        ({"from": "2025-01-01T00:00:00Z", "to": "9999-12-31T23:59:59-05:00"}, "to"),
        ({"from": "2025-01-01T00:00:00Z", "to": "9999-12-31T23:59:59"}, "to"),
        ({"from": "0001-01-01T00:00:00+05:00", "to": "2025-01-01T00:00:00Z"}, "from"),
        ({"from": "2025-01-02T00:00:00Z", "to": "2025-01-01T00:00:00Z"}, "to"),
    ],
)
async def test_a_backfill_out_of_range_names_the_field(
    api: Api, window: dict[str, str], field: str
) -> None:
    body = {"name": "daily", "cron": "0 0 * * *", **JOB}
    assert (await api.http.post("/api/v1/schedules", json=body, headers=api.as_("a-op"))).is_success
    r = await api.http.post(
        "/api/v1/schedules/daily/backfill?dry_run=true", json=window, headers=api.as_("a-op")
    )
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field


# --- 2. bulk submit and its audit -------------------------------------------------------


async def test_a_submit_of_1000_jobs_is_audited_with_their_ids_in_details(api: Api) -> None:
    r = await api.http.post("/api/v1/jobs", json=[JOB] * 1000, headers=api.as_("a-op"))
    assert r.status_code == 201, r.text[:300]
    ids = [j["id"] for j in r.json()]
    [entry] = await _audit(api, "a-view")
    assert (entry["target"], entry["details"]) == ("1000 jobs", {"count": 1000, "ids": ids})


async def test_jobs_are_not_stored_when_their_audit_cannot_be(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_: Any, **__: Any) -> None:
        raise errors.StoreError("the audit table is unwritable")

    monkeypatch.setattr(store.tokens, "audit_add", broken)
    with pytest.raises(errors.StoreError):  # the client is answered 500
        await api.http.post("/api/v1/jobs", json=[JOB, JOB], headers=api.as_("a-op"))
    assert await api.c.store.jobs.list() == []


# --- 3. whose audit row -----------------------------------------------------------------


async def test_an_admin_s_change_is_audited_in_the_tenant_of_what_it_changed(api: Api) -> None:
    job = await _submit(api, "admin", tenant="a")
    r = await api.http.post(f"/api/v1/jobs/{job['id']}/cancel", headers=api.as_("admin"))
    assert r.status_code == 200, r.text
    body = {"name": "n", "every": "1h", "tenant": "a", **JOB}
    assert (
        await api.http.post("/api/v1/schedules", json=body, headers=api.as_("admin"))
    ).is_success
    token = await api.http.post(
        "/api/v1/tokens",
        json={"name": "t", "tenant": "a", "role": "viewer"},
        headers=api.as_("admin"),
    )
    assert token.status_code == 201, token.text
    seen = [(e["action"], e["tenant"]) for e in await _audit(api, "a-view")]
    assert seen == [
        ("tokens.create", "a"),
        ("schedules.create", "a"),
        ("jobs.cancel", "a"),
        ("jobs.submit", "a"),
    ]


async def test_a_cancel_of_an_ended_job_is_not_audited(api: Api) -> None:
    job = await _submit(api, "a-op")
    for _ in range(2):
        r = await api.http.post(f"/api/v1/jobs/{job['id']}/cancel", headers=api.as_("a-op"))
        assert (r.status_code, r.json()["state"]) == (200, "cancelled")
    done = await _submit(api, "a-op")
    [claimed] = await api.c.store.jobs.claim(now=api.c.clock.now(), limit=1, executors=["noop"])
    await api.c.store.attempts.finish(
        finishes=[Finish(claimed.attempt.id, A.SUCCEEDED, 0, None)], now=api.c.clock.now()
    )
    r = await api.http.post(f"/api/v1/jobs/{done['id']}/cancel", headers=api.as_("a-op"))
    assert r.status_code == 409, r.text
    actions = [e["action"] for e in await _audit(api, "a-view")]
    assert actions == ["jobs.submit", "jobs.cancel", "jobs.submit"]


# --- 4. bad input is 422 naming the field -----------------------------------------------


@pytest.mark.parametrize("field", ["tz", "catchup_max", "catchup_window", "catchup", "overlap"])
async def test_a_null_schedule_option_names_the_field(api: Api, field: str) -> None:
    body = {"name": "x", "every": "1h", **JOB, field: None}
    r = await api.http.post("/api/v1/schedules", json=body, headers=api.as_("a-op"))
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("since=2026-01-01T00:00:00", "since"),
        ("until=9999-12-31T23:00:00-05:00", "until"),
        ("since=0001-01-01T00:00:00%2B05:00", "since"),
        ("queue=q%00", "queue"),
    ],
)
async def test_a_bad_time_or_a_nul_in_a_query_names_the_field(
    api: Api, query: str, field: str
) -> None:
    r = await api.http.get(f"/api/v1/jobs?{query}", headers=api.as_("a-view"))
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"run_at": "9999-12-31T23:00:00-05:00"}, "run_at"),
        ({"run_at": "2026-12-01T09:00:00"}, "run_at"),
        ({"queue": "q\x00"}, "queue"),
        ({"labels": {"k": "v\x00"}}, "labels.k"),
        ({"payload": {"a": ["\x00"]}}, "payload.a.0"),
        ({"spec": {"command": ["echo", "\x00"]}}, "spec.command.1"),
        ({"idempotency_key": "k\x00"}, "idempotency_key"),
    ],
)
async def test_what_the_databases_cannot_hold_names_the_field(
    api: Api, body: dict[str, Any], field: str
) -> None:
    r = await api.http.post("/api/v1/jobs", json={**JOB, **body}, headers=api.as_("a-op"))
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field
    schedule = {"name": "s", "every": "1h", **JOB, **body}
    schedule.pop("run_at", None)
    if "run_at" not in body and "idempotency_key" not in body:
        r = await api.http.post("/api/v1/schedules", json=schedule, headers=api.as_("a-op"))
        assert r.status_code == 422, r.text
        assert r.json()["field"] == field
    assert await api.c.store.jobs.list() == []


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('{"executor": "noop", "spec": {"n": NaN}}', "spec.n"),
        ('{"executor": "noop", "spec": {}, "payload": [Infinity]}', "payload.0"),
    ],
)
async def test_nan_or_infinity_names_the_field(api: Api, text: str, field: str) -> None:
    headers = {**api.as_("a-op"), "content-type": "application/json"}
    r = await api.http.post("/api/v1/jobs", content=text, headers=headers)
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field


@pytest.mark.parametrize(
    "given",
    [b"\xb2", "\u0661\u0662".encode(), b"99999999999999999999", b"-1", b"x"],
    ids=["superscript-two", "arabic-indic", "past-64-bits", "negative", "letter"],
)
async def test_a_last_event_id_that_is_no_event_id_names_the_header(api: Api, given: bytes) -> None:
    headers: dict[str, Any] = {**api.as_("a-view"), "Last-Event-ID": given}
    r = await api.http.get("/api/v1/events/stream?follow=false", headers=headers)
    assert r.status_code == 422, r.text
    assert r.json()["field"] == "Last-Event-ID"


# --- 5. counts of one tenant only -------------------------------------------------------


async def test_pools_and_explain_count_the_token_s_tenant_only(api: Api) -> None:
    await _submit(api, "b-op", pool="nightly")
    await api.c.store.jobs.claim(
        now=api.c.clock.now(), limit=1, executors=["noop"], pools=SETTINGS.pools
    )
    mine = await _submit(api, "a-op", pool="nightly")
    pools = await api.http.get("/api/v1/pools", headers=api.as_("a-view"))
    assert pools.json() == [{"name": "nightly", "limit": 1, "running": 0}]
    everyone = await api.http.get("/api/v1/pools", headers=api.as_("admin"))
    assert everyone.json() == [{"name": "nightly", "limit": 1, "running": 1}]
    said = await api.http.get(f"/api/v1/jobs/{mine['id']}/explain", headers=api.as_("a-view"))
    assert said.json()["cause"] != "pool full", said.text  # b's running job is not counted


async def test_alert_history_of_a_tenant_is_filtered_in_the_query(api: Api) -> None:
    def message(tenant: str, n: int) -> dict[str, Any]:
        return {
            "dedupe_key": f"{tenant}-{n}",
            "rule": "r",
            "channel": "hook",
            "kind": "alert",
            "cause": "failed",
            "subject": "queue:default",
            "job_id": None,
            "details": {"tenant": tenant},
            "due_at": api.c.clock.now(),
        }

    await api.c.store.alerts.add(message=message("a", 0), now=api.c.clock.now())
    for n in range(1001):  # newer than tenant a's, and more than a page of them
        await api.c.store.alerts.add(message=message("b", n), now=api.c.clock.now())
    mine = (await api.http.get("/api/v1/alerts", headers=api.as_("a-view"))).json()
    assert [a["subject"] for a in mine] == ["queue:default"]
    everyone = await api.http.get("/api/v1/alerts?limit=5", headers=api.as_("admin"))
    assert len(everyone.json()) == 5


# --- 6. event streams end, and are limited ----------------------------------------------


async def test_a_quarantined_job_s_stream_ends(api: Api) -> None:
    job = await _submit(api, "a-op")
    [c] = await api.c.store.jobs.claim(now=api.c.clock.now(), limit=1, executors=["noop"])
    failed = Finish(c.attempt.id, A.FAILED, 2, "exit 2", model.FailureClass.PERMANENT)
    await api.c.store.attempts.finish(finishes=[failed], now=api.c.clock.now())
    r = await api.http.get(f"/api/v1/jobs/{job['id']}/events/stream", headers=api.as_("a-view"))
    assert [e["to"] for e in _sse(r.text) if e["entity"] == "job"][-1] == "quarantined"


async def test_a_stream_of_a_job_scheduled_far_ahead_ends_after_its_longest(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(streams, "MAX_SECONDS", 5.0)  # the clock's sleeps move it at once
    later = (api.c.clock.now() + timedelta(days=365)).isoformat()
    job = await _submit(api, "a-op", run_at=later)
    r = await api.http.get(f"/api/v1/jobs/{job['id']}/events/stream", headers=api.as_("a-view"))
    assert [e["to"] for e in _sse(r.text)] == ["scheduled"]


async def test_a_stream_of_a_job_gone_meanwhile_ends(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = await _submit(api, "a-op")
    url = f"/api/v1/jobs/{job['id']}/events/stream"
    real = api.c.store.jobs.get
    calls = 0

    async def forgotten(*, job_id: int) -> model.Job:
        nonlocal calls
        calls += 1
        if calls > 1:  # the first look is the route's own, before the stream begins
            raise errors.NotFound(f"no job with id {job_id}")
        return await real(job_id=job_id)

    monkeypatch.setattr(api.c.store.jobs, "get", forgotten)
    r = await api.http.get(url, headers=api.as_("a-view"))
    assert r.status_code == 200
    assert [e["to"] for e in _sse(r.text)] == ["queued"]


async def test_streams_past_the_limit_are_429_until_one_ends(
    paused: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = paused
    monkeypatch.setattr(streams, "MAX_STREAMS", 1)
    job = await _submit(api, "a-op")
    url = f"/api/v1/jobs/{job['id']}/events/stream"
    first = asyncio.create_task(api.http.get(url, headers=api.as_("a-view")))
    app = api.http._transport.app  # type: ignore[attr-defined]
    await eventually(
        lambda: getattr(app.state, "stream_slots", None) and app.state.stream_slots.taken == 1,
        what="the first stream holds the slot",
    )
    refused = await api.http.get("/api/v1/events/stream?follow=false", headers=api.as_("a-view"))
    assert refused.status_code == 429, refused.text
    assert refused.headers["retry-after"] == "5"
    await api.http.post(f"/api/v1/jobs/{job['id']}/cancel", headers=api.as_("a-op"))
    assert (await first).status_code == 200
    await eventually(lambda: app.state.stream_slots.taken == 0, what="the slot is given back")
    after = await api.http.get("/api/v1/events/stream?follow=false", headers=api.as_("a-view"))
    assert after.status_code == 200


# --- 7. the body limit, chunked ---------------------------------------------------------


async def _chunks(total: int, size: int = 64 * 1024) -> AsyncIterator[bytes]:
    head = b'{"executor": "noop", "spec": {}, "payload": "'
    yield head
    left = total
    while left > 0:
        yield b"x" * min(size, left)
        left -= size
    yield b'"}'


async def test_a_chunked_body_past_the_limit_is_413(api: Api) -> None:
    headers = {**api.as_("a-op"), "content-type": "application/json"}
    r = await api.http.post("/api/v1/jobs", content=_chunks(MAX_BODY + 1), headers=headers)
    assert "content-length" not in r.request.headers
    assert r.status_code == 413, r.text
    assert r.json()["field"] == "body"
    assert await api.c.store.jobs.list() == []
    small = await api.http.post("/api/v1/jobs", content=_chunks(10), headers=headers)
    assert small.status_code == 201, small.text


# --- 8. conflicts, wording, and a tenant admin's tokens ---------------------------------


async def test_state_conflicts_are_409(api: Api) -> None:
    job = await _submit(api, "a-op")
    for action in ("retry", "discard", "rerun"):
        r = await api.http.post(f"/api/v1/jobs/{job['id']}/{action}", headers=api.as_("a-op"))
        assert r.status_code == 409, (action, r.text)
    body = {"name": "n", "every": "1h", **JOB}
    assert (await api.http.post("/api/v1/schedules", json=body, headers=api.as_("a-op"))).is_success
    again = await api.http.post("/api/v1/schedules", json=body, headers=api.as_("a-op"))
    assert again.status_code == 409
    resumed = await api.http.post("/api/v1/schedules/n/resume", headers=api.as_("a-op"))
    assert resumed.status_code == 409, resumed.text
    assert (await api.http.post("/api/v1/schedules/n/pause", headers=api.as_("a-op"))).is_success
    paused = await api.http.post("/api/v1/schedules/n/pause", headers=api.as_("a-op"))
    assert paused.status_code == 409, paused.text
    actions = [e["action"] for e in await _audit(api, "a-view")]
    assert actions == ["schedules.pause", "schedules.create", "jobs.submit"]


async def test_not_found_reads_the_same_however_it_is_asked(api: Api) -> None:
    body = {"name": "mine", "every": "1h", **JOB}
    assert (await api.http.post("/api/v1/schedules", json=body, headers=api.as_("a-op"))).is_success
    for url in ("/api/v1/schedules/mine", "/api/v1/schedules/mine?tenant=a"):
        r = await api.http.get(url, headers=api.as_("b-op"))
        assert (r.status_code, r.json()) == (404, {"error": "no schedule 'mine'"}), url


async def test_a_tenant_admin_s_token_without_a_tenant_is_of_its_own(api: Api) -> None:
    made = await api.http.post(
        "/api/v1/tokens", json={"name": "ci", "role": "viewer"}, headers=api.as_("a-admin")
    )
    assert made.status_code == 201, made.text
    assert made.json()["tenant"] == "a"
    everyone = await api.http.post(
        "/api/v1/tokens", json={"name": "all", "role": "viewer"}, headers=api.as_("admin")
    )
    assert everyone.json()["tenant"] is None
