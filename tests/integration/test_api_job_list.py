"""GET /api/v1/jobs as a cron user reads it, on both databases: what each job does (its
method and URL, secrets redacted, or its command, task or image), its schedule, its last
attempt's status, exit code and response time, when it runs next; the URL search and the
schedule filter; a wrong filter named; and a tenant that never lists another's job,
whatever it asks for."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from corral import launching, model, python_tasks, scheduling, store
from corral.store import Finish
from tests.support.api import Api, serving

A, J = model.AttemptState, model.JobState
TOKENS = [
    ("a-view", "a", "viewer"),
    ("b-view", "b", "viewer"),
    ("admin", None, "admin"),
]
HOOK = "https://ops:hunter2@hooks.example.com/v1/ping?token=abc123&region=eu"
SHOWN = "https://[redacted]@hooks.example.com/v1/ping?token=[redacted]&region=eu"


@pytest.fixture
async def api(db: store.Store) -> AsyncIterator[Api]:
    async with serving(db, TOKENS) as made:
        yield made


def new(executor: str, spec: dict[str, Any], *, tenant: str = "a", **more: Any) -> model.NewJob:
    return model.NewJob(executor=executor, spec=spec, tenant=tenant, **more)


def fired(schedule: str) -> dict[str, Any]:
    return {scheduling.FIRING: {"schedule": schedule, "nominal_time": "2026-12-01T00:00:00Z"}}


async def store_jobs(api: Api, *jobs: model.NewJob) -> list[int]:
    made = await api.c.store.jobs.submit(new=list(jobs), now=api.c.clock.now())
    return [job_id for job_id, _ in made]


async def listed(api: Api, token: str, **query: Any) -> dict[str, Any]:
    r = await api.http.get("/api/v1/jobs", params=query, headers=api.as_(token))
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def test_each_job_says_what_it_does_its_last_run_and_when_it_runs_next(api: Api) -> None:
    now = api.c.clock.now()
    later = now + timedelta(days=1)
    ids = await store_jobs(
        api,
        new("http", {"method": "POST", "url": HOOK}, payload=fired("nightly")),
        new("process", {"command": ["curl", "-s", "https://u:pw@x.test/a b"]}),
        new(python_tasks.PYTHON, {"task": "send_mail", "version": 2}),
        new("kubernetes", {"image": "ghcr.io/acme/etl:1.4", "command": ["python", "-m", "etl"]}),
        new("http", {"method": "GET", "url": "https://later.test/"}, run_at=later),
    )
    hook, cmd, task, pod, waits = ids
    claimed = await api.c.store.jobs.claim(now=now, limit=5, executors=["http", "process"])
    fence = {c.job.id: c.attempt.id for c in claimed}
    api.c.clock.advance(4)  # type: ignore[attr-defined]
    log = launching.RunLog(streams=(), latency=0.123, status=204)
    await api.c.store.attempts.finish(
        finishes=[
            Finish(fence[hook], A.SUCCEEDED, None, "HTTP 204", output=log),
            Finish(fence[cmd], A.FAILED, 7, "exited with code 7"),
        ],
        now=api.c.clock.now(),
    )
    jobs = {j["id"]: j for j in (await listed(api, "a-view"))["jobs"]}
    assert list(jobs) == ids[::-1]
    for secret in ("hunter2", "abc123", ":pw@"):
        assert secret not in str(jobs)
    assert jobs[hook]["target"] == {"kind": "http", "method": "POST", "url": SHOWN}
    assert (jobs[hook]["schedule"], jobs[hook]["last_status"]) == ("nightly", 204)
    assert (jobs[hook]["response_time"], jobs[hook]["next_run"]) == (0.123, None)
    assert jobs[cmd]["target"] == {
        "kind": "command",
        "command": "curl -s 'https://[redacted]@x.test/a b'",
    }
    assert (jobs[cmd]["last_exit_code"], jobs[cmd]["last_status"]) == (7, None)
    assert jobs[cmd]["response_time"] is None, "recorded running never: no start to count from"
    assert jobs[task]["target"] == {"kind": "task", "task": "send_mail", "version": 2}
    assert jobs[pod]["target"] == {
        "kind": "kubernetes",
        "image": "ghcr.io/acme/etl:1.4",
        "command": "python -m etl",
    }
    assert jobs[task]["next_run"] == now.isoformat(), "queued: due at once"
    assert jobs[waits]["state"] == "scheduled"
    assert jobs[waits]["next_run"] == later.isoformat()
    assert jobs[waits]["schedule"] is None
    assert jobs[waits]["last_status"] is jobs[waits]["last_exit_code"] is None
    assert jobs[hook]["spec"]["url"] == SHOWN, "the fields of before, as they were"


async def test_the_url_search_and_the_schedule_filter_page_by_keyset(api: Api) -> None:
    ids = await store_jobs(
        api,
        *(
            new(
                "http",
                {"url": f"https://{('orders', 'billing')[n % 2]}.test/{n}?token=orders{n}"},
                payload=fired(("hourly", "nightly")[n % 3 == 0]),
            )
            for n in range(9)
        ),
    )
    orders = [i for n, i in enumerate(ids) if n % 2 == 0][::-1]
    assert [j["id"] for j in (await listed(api, "a-view", url="ORDERS.test"))["jobs"]] == orders
    read, before = [], None
    while True:
        query = {"url": "orders", "limit": 2, **({"before": before} if before else {})}
        page = await listed(api, "a-view", **query)
        read += [j["id"] for j in page["jobs"]]
        if (before := page["next"]) is None:
            break
    assert read == orders, "each once, newest first; never by the token's value"
    nightly = [i for n, i in enumerate(ids) if n % 3 == 0][::-1]
    assert [j["id"] for j in (await listed(api, "a-view", schedule="nightly"))["jobs"]] == nightly
    both = await listed(api, "a-view", schedule="nightly", url="orders")
    assert [j["id"] for j in both["jobs"]] == [i for i in nightly if i in orders]


@pytest.mark.parametrize(
    ("query", "field", "said"),
    [
        ({"url": "ab"}, "url", "at least three letters or digits"),
        ({"url": "/-/"}, "url", "at least three letters or digits"),
        ({"url": "x" * 201}, "url", "at most 200"),
        ({"url": "abc\x01"}, "url", "control character"),
        ({"state": "sleeping"}, "state", "not a job state"),
        ({"label": "team"}, "label", "KEY=VALUE"),
    ],
)
async def test_a_wrong_filter_is_named(
    api: Api, query: dict[str, str], field: str, said: str
) -> None:
    r = await api.http.get("/api/v1/jobs", params=query, headers=api.as_("a-view"))
    assert r.status_code == 422
    assert r.json()["field"] == field
    assert said in r.text


async def test_a_tenant_never_lists_another_s_job_whatever_it_asks_for(api: Api) -> None:
    """Tenants a and b each have a job of the same URL, schedule, label and queue: a's
    viewer lists only a's with every filter, and nothing when it names tenant b."""
    same: dict[str, Any] = {"payload": fired("nightly"), "labels": {"team": "x"}, "queue": "q"}
    spec = {"method": "POST", "url": "https://shared.test/hook"}
    mine, theirs = await store_jobs(
        api, new("http", spec, tenant="a", **same), new("http", spec, tenant="b", **same)
    )
    filters: list[dict[str, Any]] = [
        {},
        {"url": "shared"},
        {"schedule": "nightly"},
        {"label": "team=x"},
        {"queue": "q"},
        {"state": "queued"},
        {"executor": "http"},
        {"url": "shared", "schedule": "nightly", "label": "team=x", "state": "queued"},
    ]
    for query in filters:
        for token, own in (("a-view", mine), ("b-view", theirs)):
            assert [j["id"] for j in (await listed(api, token, **query))["jobs"]] == [own], query
        assert (await listed(api, "a-view", **query, tenant="b"))["jobs"] == [], query
        every = await listed(api, "admin", **query)
        assert [j["id"] for j in every["jobs"]] == [theirs, mine], query
