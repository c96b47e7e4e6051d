"""The one-off HTTP job form and a job's rerun on the dashboard, over HTTP on both
databases: made as `POST /api/v1/jobs` would make it (now, at a time in a zone, after a
delay), each refusal beside its field, the tenant's quotas said on the form, a copy filled
from a job with its secrets redacted and kept, a failed job run again, another tenant's
job not found."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from corral import client, model, store
from corral.store import Finish
from corral.tenancy import TenantSettings
from tests.support.api import over_http
from tests.support.forms import SETTINGS, error_of, forms_client, post, signed, values

SECRET = "hunter2-of-the-hook"
FORM = {
    "method": "POST",
    "url": "https://hooks.example.com/carts/42",
    "headers": f"Authorization: Bearer {SECRET}\r\nX-Team: shop",
    "json": '{"cart": 42}',
    "expect": "200,204",
    "when": "now",
    "tz": "UTC",
    "max_attempts": "3",
    "retry_base": "5s",
    "attempt_deadline": "30s",
    "queue": "hooks",
    "priority": "2",
    "labels": "team=shop",
    "idempotency_key": "cart-42-expired",
}
BODY = {
    "executor": "http",
    "spec": {
        "method": "POST",
        "url": FORM["url"],
        "headers": {"Authorization": f"Bearer {SECRET}", "X-Team": "shop"},
        "json": {"cart": 42},
        "expect": "200,204",
    },
    "max_attempts": 3,
    "policy": {"retry": {"base": "5s"}, "limits": {"attempt_deadline": "30s"}},
    "queue": "hooks",
    "priority": 2,
    "labels": {"team": "shop"},
}
"""The same job as `POST /api/v1/jobs` takes it (but its idempotency key)."""


@pytest.fixture
async def c(db: store.Store) -> client.Client:
    return await forms_client(db)


@pytest.fixture
async def http(c: client.Client) -> AsyncIterator[httpx.AsyncClient]:
    async with over_http(c) as made:
        yield made


def job_of(answer: httpx.Response) -> int:
    found = re.fullmatch(r"/ui/jobs/(\d+)", answer.headers["location"])
    assert found is not None, answer.headers["location"]
    return int(found[1])


def what(job: model.Job) -> tuple[object, ...]:
    return (
        job.tenant, job.executor, job.spec, job.queue, job.priority, job.max_attempts,
        job.labels, job.policy, job.tenant_made,
    )  # fmt: skip


async def test_the_form_makes_the_job_the_api_would_make(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    token = await signed(http, c)
    page = await http.get("/ui/jobs/new")
    assert page.status_code == 200
    assert 'id="job-form"' in page.text
    made = await post(http, "/ui/jobs/http", token, **FORM)
    assert made.status_code == 303, made.text
    job = (await c.job(job_of(made))).job
    _, secret = await c.token_create(name="a-op", tenant="a", role="operator")
    by_api = await http.post(
        "/api/v1/jobs", json=BODY, headers={"Authorization": f"Bearer {secret}"}
    )
    assert by_api.status_code == 201, by_api.text
    assert what(job) == what((await c.job(by_api.json()["id"])).job)
    assert (job.state, job.idempotency_key) == (model.JobState.QUEUED, "cart-42-expired")
    again = await post(http, "/ui/jobs/http", token, **FORM)
    assert again.headers["location"] == f"/ui/jobs/{job.id}?note=job-kept&job={job.id}"
    audited = [(a.action, a.target) for a in await c.store.tokens.audit_list(tenant="a")]
    assert ("jobs.submit", str(job.id)) in audited


async def test_a_job_is_sent_at_a_time_in_a_zone_or_after_a_delay(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    token = await signed(http, c)
    at = {**FORM, "idempotency_key": "", "when": "at", "run_at": "2026-07-01T09:00",
          "tz": "Europe/Paris"}  # fmt: skip
    made = (await c.job(job_of(await post(http, "/ui/jobs/http", token, **at)))).job
    assert made.run_at == datetime(2026, 7, 1, 7, tzinfo=UTC)
    assert made.state == model.JobState.SCHEDULED
    later = {**FORM, "idempotency_key": "", "when": "delay", "delay": "1h30m"}
    delayed = (await c.job(job_of(await post(http, "/ui/jobs/http", token, **later)))).job
    assert delayed.run_at == c.clock.now() + timedelta(minutes=90)
    past = {**at, "run_at": "2025-12-31T09:00"}
    refused = await post(http, "/ui/jobs/http", token, **past)
    assert refused.status_code == 422
    assert "before now; send allow_past: true" in error_of(refused, "run_at")
    allowed = await post(http, "/ui/jobs/http", token, **past, allow_past="yes")
    assert (await c.job(job_of(allowed))).job.state == model.JobState.QUEUED


@pytest.mark.parametrize(
    ("changes", "field", "said"),
    [
        ({"url": "ftp://hooks.example.com/x"}, "url", "url: must start with http:// or https://"),
        ({"headers": "X-Team"}, "headers", "headers: line 1, 'X-Team': write 'Name: value'"),
        ({"json": "{"}, "json", "json: not valid JSON"),
        ({"expect": "2yy"}, "expect", "expect: must be statuses"),
        ({"when": "at", "run_at": ""}, "run_at", "run_at: give the time to run at"),
        ({"when": "at", "run_at": "soon"}, "run_at", "run_at: 'soon' is not an ISO 8601"),
        ({"when": "at", "run_at": "2026-07-01T09:00", "tz": "Nowhere"}, "tz", "tz: 'Nowhere'"),
        ({"when": "delay", "delay": "a while"}, "delay", "delay: 'a while' is not a duration"),
        ({"max_attempts": "1001"}, "max_attempts", "max_attempts: 1001 must be between"),
        ({"retry_base": "later"}, "retry_base", "policy.retry.base: 'later' is not a duration"),
        ({"pool": "nope"}, "pool", "pool: 'nope' is not a configured pool"),
        ({"labels": "=x"}, "labels", "labels: line 1, '=x': write key=value"),
        ({"idempotency_key": "k" * 501}, "idempotency_key", "idempotency_key: must be 1-500"),
        ({"payload": "{"}, "payload", "payload: not valid JSON"),
    ],
)
async def test_each_refusal_is_beside_its_field(
    http: httpx.AsyncClient, c: client.Client, changes: dict[str, str], field: str, said: str
) -> None:
    token = await signed(http, c)
    refused = await post(http, "/ui/jobs/http", token, **{**FORM, **changes})
    assert refused.status_code == 422, refused.text
    assert said in error_of(refused, field)
    assert values(refused, "job-form")["url"] == {**FORM, **changes}["url"]
    assert await c.jobs(model.JobFilter()) == []


async def test_the_tenant_s_quotas_are_said_on_the_form(db: store.Store) -> None:
    full = SETTINGS.model_copy(update={"tenants": {"a": TenantSettings(max_queued=0)}})
    c = await forms_client(db, full)
    async with over_http(c) as http:
        token = await signed(http, c)
        refused = await post(http, "/ui/jobs/http", token, **FORM)
    assert refused.status_code == 403
    assert "max_queued" in error_of_form(refused)
    slow = SETTINGS.model_copy(update={"tenants": {"a": TenantSettings(submit_rate=1)}})
    c = await forms_client(db, slow)
    async with over_http(c) as http:
        token = await signed(http, c)
        first = await post(http, "/ui/jobs/http", token, **{**FORM, "idempotency_key": "1"})
        assert first.status_code == 303
        second = await post(http, "/ui/jobs/http", token, **{**FORM, "idempotency_key": "2"})
    assert second.status_code == 429
    assert int(second.headers["Retry-After"]) >= 1
    assert "submit_rate" in error_of_form(second)


def error_of_form(page: httpx.Response) -> str:
    found = re.search(r'<p class="error" id="error-form">(.*?)</p>', page.text, re.S)
    assert found is not None, page.text
    return found[1]


async def test_a_copy_is_filled_from_a_job_and_keeps_its_secrets(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    token = await signed(http, c)
    original = job_of(await post(http, "/ui/jobs/http", token, **FORM))
    page = await http.get(f"/ui/jobs/{original}")
    assert f'href="/ui/jobs/new?copy={original}"' in page.text
    form = await http.get(f"/ui/jobs/new?copy={original}")
    assert form.status_code == 200
    assert SECRET not in form.text
    shown = values(form, "job-form")
    assert sorted(shown["headers"].split("\n")) == ["Authorization: [redacted]", "X-Team: shop"]
    assert (shown["copy"], shown["url"], shown["attempt_deadline"]) == (
        str(original), FORM["url"], "30s",
    )  # fmt: skip
    copied = await post(http, "/ui/jobs/http", token, **{**shown, "idempotency_key": "again"})
    copy = (await c.job(job_of(copied))).job
    assert copy.spec["headers"]["Authorization"] == f"Bearer {SECRET}"
    assert what(copy)[:-1] == what((await c.job(original)).job)[:-1]


async def test_a_failed_job_runs_again_and_others_say_why_not(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    token = await signed(http, c)
    job_id = job_of(await post(http, "/ui/jobs/http", token, **FORM))
    assert "Rerun</button>" not in (await http.get(f"/ui/jobs/{job_id}")).text
    kept = await post(http, f"/ui/jobs/{job_id}/rerun", token)
    assert kept.headers["location"] == (
        f"/ui/jobs/{job_id}?note=job-unchanged&job={job_id}&did=run+again&state=queued"
    )
    [claimed] = await c.store.jobs.claim(now=c.clock.now(), limit=1, executors=["http"])
    await c.store.attempts.finish(
        finishes=[Finish(claimed.attempt.id, model.AttemptState.FAILED, None, "gone")],
        now=c.clock.now(),
    )
    failed = await c.job(job_id)
    if failed.job.state != model.JobState.FAILED:  # retries left: it waits for them
        await c.cancel(job_id, reason="test")
    assert "Rerun</button>" in (await http.get(f"/ui/jobs/{job_id}")).text
    again = await post(http, f"/ui/jobs/{job_id}/rerun", token)
    found = re.fullmatch(rf"/ui/jobs/(\d+)\?note=job-rerun&job=\d+&old={job_id}",
                         again.headers["location"])  # fmt: skip
    assert found is not None
    rerun = (await c.job(int(found[1]))).job
    assert rerun.labels["rerun-of"] == str(job_id)
    assert rerun.spec == (await c.job(job_id)).job.spec


async def test_another_tenant_s_job_is_neither_copied_nor_run_again(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    theirs, _ = await c.submit(executor="http", spec={"url": "https://b.example.com/x"},
                               tenant="b")  # fmt: skip
    await c.cancel(theirs, reason="test")
    noop, _ = await c.submit(executor="noop", spec={}, tenant="a")
    token = await signed(http, c)
    assert (await http.get(f"/ui/jobs/new?copy={theirs}")).status_code == 404
    assert (await http.get(f"/ui/jobs/new?copy={noop}")).status_code == 404
    assert (await post(http, f"/ui/jobs/{theirs}/rerun", token)).status_code == 404
    refused = await post(http, "/ui/jobs/http", token, **{**FORM, "copy": str(theirs)})
    assert refused.status_code == 404
    assert [j.id for j in await c.jobs(model.JobFilter())] == [noop, theirs]
