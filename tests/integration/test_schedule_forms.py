"""The schedule form and a schedule's actions on the dashboard, over HTTP on both databases:
made and changed as the API would make them, each refusal beside its field, the preview of
next firings (live and without JavaScript), secrets shown redacted and kept unless
replaced, pause, resume, run now, duplicate and delete, another tenant's schedule not found
on every route, and a viewer refused every form."""

from __future__ import annotations

import html
import json
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from corral import client, store
from corral.tenancy import TenantSettings
from tests.support.api import over_http
from tests.support.forms import SETTINGS, error_of, forms_client, post, signed, values

SECRET = "s3cret-of-the-hook"
FORM = {
    "name": "nightly-report",
    "method": "POST",
    "url": f"https://hooks.example.com/report?token={SECRET}&team=data",
    "headers": f"Authorization: Bearer {SECRET}\r\nX-Team: data",
    "json": '{"report": "daily"}',
    "expect": "200,204",
    "expect_body": '"queued": *true',
    "expect_json": "$.ok==true\r\n$.rows > 0",
    "max_response_time": "2000ms",
    "when": "cron",
    "cron": "30 2 * * *",
    "tz": "Europe/Paris",
    "start": "2026-06-01T00:00",
    "until": "2027-06-01T00:00",
    "max_attempts": "4",
    "retry_base": "10s",
    "retry_cap": "5m",
    "http_request_timeout": "20s",
    "attempt_deadline": "1m",
    "sla": "15m",
    "catchup": "all",
    "catchup_window": "2d",
    "catchup_max": "10",
    "overlap": "forbid",
    "jitter": "30s",
    "pause_after": "5",
    "queue": "hooks",
    "pool": "nightly",
    "priority": "5",
    "labels": "team=data\r\nkind=report",
    "payload": '{"format": "pdf"}',
    "code_version": "v1.2.3",
    "policy": '{"quarantine_after": 3}',
}
"""A schedule's form with every field filled."""
BODY = {
    "name": "nightly-report",
    "executor": "http",
    "spec": {
        "method": "POST",
        "url": FORM["url"],
        "headers": {"Authorization": f"Bearer {SECRET}", "X-Team": "data"},
        "json": {"report": "daily"},
        "expect": "200,204",
        "expect_body": '"queued": *true',
        "expect_json": ["$.ok == true", "$.rows > 0"],
        "max_response_time": "2s",
    },
    "cron": "30 2 * * *",
    "tz": "Europe/Paris",
    "start": "2026-06-01T00:00",
    "until": "2027-06-01T00:00",
    "max_attempts": 4,
    "policy": {
        "retry": {"base": "10s", "cap": "5m"},
        "limits": {"http_request_timeout": "20s", "attempt_deadline": "1m"},
        "sla": "15m",
        "quarantine_after": 3,
    },
    "catchup": "all",
    "catchup_window": "2d",
    "catchup_max": 10,
    "overlap": "forbid",
    "jitter": "30s",
    "pause_after": 5,
    "queue": "hooks",
    "pool": "nightly",
    "priority": 5,
    "labels": {"team": "data", "kind": "report"},
    "payload": {"format": "pdf"},
    "code_version": "v1.2.3",
}
"""The same schedule as `POST /api/v1/schedules` takes it."""


@pytest.fixture
async def c(db: store.Store) -> client.Client:
    return await forms_client(db)


@pytest.fixture
async def http(c: client.Client) -> AsyncIterator[httpx.AsyncClient]:
    async with over_http(c) as made:
        yield made


def stored(s: Any) -> tuple[Any, ...]:
    """What a schedule is, but its name and times of its own."""
    return (
        s.tenant, s.cron, s.tz, s.every_seconds, s.anchor, s.until, s.catchup, s.overlap,
        s.catchup_window_seconds, s.catchup_max, s.jitter_seconds, s.tenant_made, s.pause_after,
        {k: v for k, v in s.template.items()},
    )  # fmt: skip


async def test_the_form_makes_the_schedule_the_api_would_make(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    token = await signed(http, c)
    page = await http.get("/ui/schedules/new")
    assert page.status_code == 200
    assert 'id="schedule-form"' in page.text
    assert "<summary>More</summary>" in page.text
    made = await post(http, "/ui/schedules", token, **FORM)
    assert made.status_code == 303, made.text
    assert made.headers["location"] == (
        "/ui/schedules/a/nightly-report?note=schedule-made&name=nightly-report"
    )
    _, secret = await c.token_create(name="a-op", tenant="a", role="operator")
    by_api = await http.post(
        "/api/v1/schedules",
        json={**BODY, "name": "by-api"},
        headers={"Authorization": f"Bearer {secret}"},
    )
    assert by_api.status_code == 201, by_api.text
    form_made, api_made = [await c.schedule(n, tenant="a") for n in ("nightly-report", "by-api")]
    assert stored(form_made) == stored(api_made)
    audited = await c.store.tokens.audit_list(tenant="a")
    assert ("schedules.create", "a/nightly-report", "token 1 (ada)", "dashboard") in [
        (a.action, a.target, a.details.get("by"), a.details.get("via")) for a in audited
    ]


@pytest.mark.parametrize(
    ("changes", "field", "said"),
    [
        ({"name": "no spaces"}, "name", "name: 'no spaces' must be"),
        ({"url": "hooks.example.com/x"}, "url", "url: must start with http://"),
        ({"method": "FETCH"}, "method", "method: must be one of"),
        ({"headers": "Authorization Bearer x"}, "headers", "write 'Name: value'"),
        ({"headers": "Host: example.com"}, "headers", "Host is set by corral"),
        ({"json": "{not json"}, "json", "json: not valid JSON"),
        ({"body": "text", "json": "{}"}, "body", "give body or json, not both"),
        ({"expect": "ok"}, "expect", "expect: must be statuses"),
        ({"expect_body": "(?=x)"}, "expect_body", "expect_body: invalid perl operator"),
        ({"expect_json": "$.ok\r\n"}, "expect_json", "expect_json: '$.ok': after the path"),
        ({"max_response_time": "soon"}, "max_response_time", "max_response_time: 'soon' is not"),
        ({"cron": "61 * * * *"}, "cron", "cron: '61 * * * *' is not a valid cron"),
        ({"tz": "Mars/Olympus"}, "tz", "tz: 'Mars/Olympus' is not a known time zone"),
        ({"when": "every", "every": "half an hour"}, "every", "every: 'half an hour'"),
        ({"start": "tomorrow"}, "start", "start: 'tomorrow' is not an ISO 8601 time"),
        ({"until": "2026-01-01T00:00"}, "until", "is not after the start"),
        ({"max_attempts": "many"}, "max_attempts", "max_attempts: 'many' is not a whole"),
        ({"max_attempts": "0"}, "max_attempts", "max_attempts: 0 must be between 1 and 1000"),
        ({"retry_base": "3x"}, "retry_base", "policy.retry.base: '3x' is not a duration"),
        ({"retry_base": "10m"}, "retry_base", "must not be longer than policy.retry.cap"),
        ({"attempt_deadline": "3650d"}, "attempt_deadline", "policy.limits.attempt_deadline"),
        (
            {"attempt_deadline": "10s", "http_request_timeout": "9s"},
            "http_request_timeout",
            "policy.limits: with this job's limits",
        ),
        ({"sla": "soon"}, "sla", "policy.sla: 'soon' is not a duration"),
        ({"catchup_window": "a week"}, "catchup_window", "catchup_window: 'a week'"),
        ({"catchup_max": "0"}, "catchup_max", "catchup_max: 0 must be between 1 and 10000"),
        ({"jitter": "a bit"}, "jitter", "jitter: 'a bit' is not a duration"),
        ({"pause_after": "-1"}, "pause_after", "pause_after: -1 must be a whole number, 0 or"),
        ({"pause_after": "often"}, "pause_after", "pause_after: 'often' is not a whole"),
        ({"queue": "no spaces"}, "queue", "queue: 'no spaces' must be"),
        ({"pool": "backfill"}, "pool", "pool: 'backfill' is not a configured pool"),
        ({"priority": "5000"}, "priority", "priority: 5000 must be between -1000 and 1000"),
        ({"labels": "team data"}, "labels", "labels: line 1, 'team data': write key=value"),
        ({"labels": "bad key!=x"}, "labels", "label key 'bad key!'"),
        ({"payload": "[1, 2]"}, "payload", "payload: a schedule's payload must be a JSON object"),
        ({"policy": "[]"}, "policy", "policy: must be a JSON object"),
        ({"policy": '{"colour": 1}'}, "policy", "policy.colour: unknown field"),
        ({"policy": '{"sla": "1m"}'}, "policy", "policy: sla is sla's: give it there"),
    ],
)
async def test_each_refusal_is_beside_its_field_and_the_form_keeps_what_was_typed(
    http: httpx.AsyncClient, c: client.Client, changes: dict[str, str], field: str, said: str
) -> None:
    token = await signed(http, c)
    sent = {**FORM, **changes}
    refused = await post(http, "/ui/schedules", token, **sent)
    assert refused.status_code == 422, refused.text
    assert said in error_of(refused, field)
    assert 'id="form-errors"' in refused.text
    kept = values(refused, "schedule-form")
    for name in ("name", "cron", "tz", "queue", "jitter", "labels", "json"):
        assert kept[name] == sent[name].replace("\r\n", "\n"), name
    more = {"retry_base", "attempt_deadline", "http_request_timeout", "sla", "catchup_window",
            "catchup_max", "jitter", "pause_after", "queue", "pool", "priority", "labels",
            "payload", "policy"}  # fmt: skip
    assert ("<details open>" in refused.text) == (field in more)
    assert await c.schedules() == []


async def test_a_name_taken_is_409_beside_the_name(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    token = await signed(http, c)
    assert (await post(http, "/ui/schedules", token, **FORM)).status_code == 303
    again = await post(http, "/ui/schedules", token, **FORM)
    assert again.status_code == 409
    assert "a schedule named 'nightly-report' exists" in error_of(again, "name")


async def test_past_max_schedules_the_form_says_so(db: store.Store) -> None:
    limited = SETTINGS.model_copy(update={"tenants": {"a": TenantSettings(max_schedules=0)}})
    c = await forms_client(db, limited)
    async with over_http(c) as http:
        token = await signed(http, c)
        refused = await post(http, "/ui/schedules", token, **FORM)
    assert refused.status_code == 403
    assert "max_schedules" in refused.text
    assert 'id="error-form"' in refused.text
    assert await c.schedules() == []


async def test_a_tenant_not_granted_http_is_told_so_above_the_form(db: store.Store) -> None:
    python_only = SETTINGS.model_copy(
        update={"tenants": {"a": TenantSettings(executors=("python",))}}
    )
    c = await forms_client(db, python_only)
    async with over_http(c) as http:
        token = await signed(http, c)
        refused = await post(http, "/ui/schedules", token, **FORM)
    assert refused.status_code == 403
    found = re.search(r'<p class="error" id="error-form">(.*?)</p>', refused.text)
    assert found is not None
    assert "tenant &#39;a&#39; is not granted &#39;http&#39;" in found[1]
    assert await c.schedules() == []


async def test_the_preview_shows_next_firings_to_the_second_with_dst_moves_marked(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    token = await signed(http, c)
    rule = {"when": "cron", "cron": "30 2 * * *", "tz": "Europe/Paris", "start": "2027-03-27"}
    shown = await post(http, "/ui/schedules/preview", token, **rule)
    assert shown.status_code == 200
    assert "<html" not in shown.text  # a fragment, for htmx to swap in
    rows = re.findall(r'<tr class="upcoming">(.*?)</tr>', shown.text, re.S)
    assert len(rows) == 5
    assert "2027-03-27 02:30:00 CET" in rows[0]
    assert "2027-03-27 01:30:00 UTC" in rows[0]
    assert "DST" in rows[1]
    assert "does not exist on 2027-03-28" in rows[1]
    assert "DST" not in rows[2]
    every = {"when": "every", "every": "10s", "start": "2026-01-01T00:00:05Z", "tz": "UTC"}
    ticks = await post(http, "/ui/schedules/preview", token, **every)
    assert "00:00:05 UTC" in ticks.text
    assert "00:00:15 UTC" in ticks.text
    wrong = await post(http, "/ui/schedules/preview", token, cron="* * *", tz="UTC")
    assert wrong.status_code == 200  # htmx swaps only a 2xx
    assert 'id="preview-error"' in wrong.text
    assert "cron: '* * *'" in html.unescape(wrong.text)
    api = await c.token_create(name="a-view", tenant="a", role="viewer")
    by_api = await http.post(
        "/api/v1/schedules/preview",
        json={"cron": "30 2 * * *", "tz": "Europe/Paris", "start": "2027-03-27", "count": 2},
        headers={"Authorization": f"Bearer {api[1]}"},
    )
    assert [n["utc"] for n in by_api.json()] == [
        "2027-03-27T01:30:00+00:00",
        "2027-03-28T01:00:00+00:00",
    ]


async def test_the_preview_button_draws_the_form_again_and_saves_nothing(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    token = await signed(http, c)
    shown = await post(http, "/ui/schedules", token, **{**FORM, "do": "preview"})
    assert shown.status_code == 200
    assert 'id="preview-firings"' in shown.text
    assert "2026-06-01 02:30:00 CEST" in shown.text
    assert values(shown, "schedule-form")["url"] == FORM["url"]
    assert await c.schedules() == []
    live = re.search(r'<fieldset id="when"[^>]*>', shown.text)
    assert live is not None
    assert 'hx-post="/ui/schedules/preview"' in live[0]
    assert "delay:" in live[0]  # debounced as it is typed


async def test_once_makes_a_one_off_job_at_that_time(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    token = await signed(http, c)
    once = {**FORM, "when": "once", "run_at": "2026-12-24T09:00", "tz": "Europe/Paris"}
    made = await post(http, "/ui/schedules", token, **once)
    assert made.status_code == 303, made.text
    found = re.fullmatch(r"/ui/jobs/(\d+)\?note=job-once&job=\d+", made.headers["location"])
    assert found is not None
    job = (await c.job(int(found[1]))).job
    assert job.run_at == datetime(2026, 12, 24, 8, tzinfo=UTC)
    assert (job.executor, job.spec["url"], job.tenant) == ("http", FORM["url"], "a")
    assert await c.schedules() == []


async def test_a_session_of_every_tenant_names_the_tenant(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    token = await signed(http, c, "root")
    form = (await http.get("/ui/schedules/new")).text
    assert 'name="tenant"' in form
    made = await post(http, "/ui/schedules", token, **{**FORM, "tenant": "b"})
    assert made.status_code == 303
    assert made.headers["location"].startswith("/ui/schedules/b/nightly-report?")
    assert (await c.schedule("nightly-report", tenant="b")).tenant_made is True


async def test_an_edit_shows_secrets_redacted_and_keeps_them_unless_replaced(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    token = await signed(http, c)
    assert (await post(http, "/ui/schedules", token, **FORM)).status_code == 303
    edit = await http.get("/ui/schedules/a/nightly-report/edit")
    assert edit.status_code == 200
    assert SECRET not in edit.text
    shown = values(edit, "schedule-form")
    assert shown["url"] == "https://hooks.example.com/report?token=[redacted]&team=data"
    # (PostgreSQL's jsonb keeps an object's keys in an order of its own.)
    assert sorted(shown["headers"].split("\n")) == ["Authorization: [redacted]", "X-Team: data"]
    assert (shown["cron"], shown["tz"], shown["start"]) == (
        "30 2 * * *", "Europe/Paris", "2026-06-01T00:00:00+02:00",
    )  # fmt: skip
    assert (shown["attempt_deadline"], shown["http_request_timeout"], shown["retry_base"]) == (
        "1m", "20s", "10s",
    )  # fmt: skip
    assert json.loads(shown["policy"]) == {"quarantine_after": 3}
    assert shown["pause_after"] == "5"
    assert (shown["expect_json"], shown["max_response_time"]) == ("$.ok == true\n$.rows > 0", "2s")
    # Sent back as shown, with the path and a header changed: the secrets stay.
    moved = shown["url"].replace("/report", "/report-v2")
    saved = await post(http, "/ui/schedules/a/nightly-report/edit", token,
                       **{**shown, "url": moved, "headers": shown["headers"] + "\nX-Run: 2"})  # fmt: skip
    assert saved.status_code == 303, saved.text
    assert saved.headers["location"] == (
        "/ui/schedules/a/nightly-report?note=schedule-saved&name=nightly-report"
    )
    spec = (await c.schedule("nightly-report", tenant="a")).template["spec"]
    assert spec["url"] == f"https://hooks.example.com/report-v2?token={SECRET}&team=data"
    assert spec["expect_json"] == ["$.ok == true", "$.rows > 0"]  # kept through the edit
    assert spec["headers"] == {
        "Authorization": f"Bearer {SECRET}", "X-Team": "data", "X-Run": "2",
    }  # fmt: skip
    # A new value replaces the secret.
    again = values(await http.get("/ui/schedules/a/nightly-report/edit"), "schedule-form")
    new = again["headers"].replace("[redacted]", "Bearer rotated")
    assert (await post(http, "/ui/schedules/a/nightly-report/edit", token,
                       **{**again, "headers": new})).status_code == 303  # fmt: skip
    spec = (await c.schedule("nightly-report", tenant="a")).template["spec"]
    assert spec["headers"]["Authorization"] == "Bearer rotated"
    assert SECRET in spec["url"]


async def test_a_kept_secret_goes_nowhere_else(http: httpx.AsyncClient, c: client.Client) -> None:
    token = await signed(http, c)
    assert (await post(http, "/ui/schedules", token, **FORM)).status_code == 303
    shown = values(await http.get("/ui/schedules/a/nightly-report/edit"), "schedule-form")
    elsewhere = shown["url"].replace("hooks.example.com", "attacker.example.net")
    refused = await post(http, "/ui/schedules/a/nightly-report/edit", token,
                         **{**shown, "url": elsewhere})  # fmt: skip
    assert refused.status_code == 422
    assert "keeps a stored secret only while the request goes where it went" in error_of(
        refused, "headers"
    )
    assert "type the secret again" in error_of(refused, "url")
    assert SECRET not in refused.text
    unknown = await post(http, "/ui/schedules", token,
                         **{**FORM, "name": "other", "headers": "X-Api-Key: [redacted]"})  # fmt: skip
    assert "there is none here: type the value" in error_of(unknown, "headers")
    spec = (await c.schedule("nightly-report", tenant="a")).template["spec"]
    assert spec["url"].startswith("https://hooks.example.com/report?")


async def test_no_page_shows_a_stored_secret(http: httpx.AsyncClient, c: client.Client) -> None:
    token = await signed(http, c)
    assert (await post(http, "/ui/schedules", token, **FORM)).status_code == 303
    job_id = await c.schedule_trigger("nightly-report", tenant="a")
    pages = [
        "/ui/schedules", "/ui/schedules/a/nightly-report/edit", f"/ui/jobs/{job_id}",
        f"/ui/jobs/new?copy={job_id}", "/ui/jobs", "/ui/",
    ]  # fmt: skip
    for path in pages:
        page = await http.get(path)
        assert page.status_code == 200, path
        assert SECRET not in page.text, path
    bad = await post(http, "/ui/schedules/a/nightly-report/edit", token, cron="nope")
    assert bad.status_code == 422
    assert SECRET not in bad.text


async def test_a_schedule_of_another_executor_is_not_edited_here(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    await c.schedule_create("noop-nightly", every="1h", executor="noop", spec={}, tenant="a")
    token = await signed(http, c)
    shown = await http.get("/ui/schedules/a/noop-nightly/edit")
    assert shown.status_code == 409
    assert "corral schedules update" in shown.text
    saved = await post(http, "/ui/schedules/a/noop-nightly/edit", token, **FORM)
    assert saved.status_code == 409


async def test_pause_resume_run_now_duplicate_and_delete(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    token = await signed(http, c)
    assert (await post(http, "/ui/schedules", token, **FORM)).status_code == 303
    here = "/ui/schedules/a/nightly-report"
    paused = await post(http, f"{here}/pause", token, next=here)
    assert (
        paused.headers["location"] == f"{here}?note=schedule-changed&name=nightly-report&did=paused"
    )
    assert (await c.schedule("nightly-report", tenant="a")).paused_at is not None
    resumed = await post(http, f"{here}/resume", token)
    assert resumed.headers["location"].startswith("/ui/schedules?note=schedule-changed")
    assert (await c.schedule("nightly-report", tenant="a")).paused_at is None
    fired = await post(http, f"{here}/trigger", token)
    found = re.fullmatch(rf"{here}\?note=schedule-fired&name=nightly-report&job=(\d+)",
                         fired.headers["location"])  # fmt: skip
    assert found is not None
    job = (await c.job(int(found[1]))).job
    assert (job.tenant, job.spec["url"]) == ("a", FORM["url"])
    copied = await post(http, f"{here}/duplicate", token, new_name="nightly-copy")
    assert copied.headers["location"] == (
        "/ui/schedules/a/nightly-copy?note=schedule-copied&name=nightly-copy&source=nightly-report"
    )
    original, copy = [await c.schedule(n, tenant="a") for n in ("nightly-report", "nightly-copy")]
    assert stored(copy) == stored(original)
    taken = await post(http, f"{here}/duplicate", token, new_name="nightly-copy")
    assert taken.status_code == 409
    assert "new_name: a schedule named 'nightly-copy' exists" in error_of(taken, "new_name")
    asked = await post(http, f"{here}/delete", token)
    assert asked.status_code == 200
    assert 'id="delete-form"' in asked.text
    assert 'name="confirmed" value="yes"' in asked.text
    await c.schedule("nightly-report", tenant="a")  # still there
    gone = await post(http, f"{here}/delete", token, confirmed="yes")
    assert gone.headers["location"] == "/ui/schedules?note=schedule-deleted&name=nightly-report"
    assert [s.name for s in await c.schedules(tenant="a")] == ["nightly-copy"]
    audited = [(a.action, a.target) for a in await c.store.tokens.audit_list(tenant="a")]
    for action in ("pause", "resume", "trigger", "duplicate", "delete"):
        assert any(done == f"schedules.{action}" for done, _ in audited), action


async def test_another_tenant_s_schedule_is_not_found_on_every_route(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    await c.schedule_create(
        "theirs", every="1h", executor="http", spec={"url": "https://b.example.com/x"},
        tenant="b",
    )  # fmt: skip
    token = await signed(http, c)
    there = "/ui/schedules/b/theirs"
    assert (await http.get(f"{there}/edit")).status_code == 404
    for action, fields in [
        ("edit", FORM), ("pause", {}), ("resume", {}), ("trigger", {}),
        ("duplicate", {"new_name": "mine"}), ("delete", {}), ("delete", {"confirmed": "yes"}),
    ]:  # fmt: skip
        answer = await post(http, f"{there}/{action}", token, **fields)
        assert answer.status_code == 404, action
    theirs = await c.schedule("theirs", tenant="b")
    assert theirs.paused_at is None
    assert theirs.last_job_id is None
    assert [s.name for s in await c.schedules()] == ["theirs"]


async def test_a_viewer_sees_no_form_and_every_post_is_refused(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    await c.schedule_create(
        "mine", every="1h", executor="http", spec={"url": "https://a.example.com/x"}, tenant="a"
    )
    job_id, _ = await c.submit(executor="http", spec={"url": "https://a.example.com/x"},
                               tenant="a")  # fmt: skip
    token = await signed(http, c, "vic")
    for path in ("/ui/schedules/new", "/ui/schedules/a/mine/edit", "/ui/jobs/new",
                 f"/ui/jobs/new?copy={job_id}"):  # fmt: skip
        shown = await http.get(path)
        assert shown.status_code == 403, path
        assert '<form method="post" action="/ui/schedules' not in shown.text
    job_page = await http.get(f"/ui/jobs/{job_id}")
    assert "Duplicate" not in job_page.text
    assert "Rerun" not in job_page.text
    here = "/ui/schedules/a/mine"
    for path in ("/ui/schedules", "/ui/schedules/preview", f"{here}/edit", f"{here}/pause",
                 f"{here}/resume", f"{here}/trigger", f"{here}/duplicate", f"{here}/delete",
                 "/ui/jobs/http", f"/ui/jobs/{job_id}/rerun"):  # fmt: skip
        refused = await post(http, path, token, **FORM, confirmed="yes", new_name="x")
        assert refused.status_code == 403, path
        assert "takes an operator" in refused.text
    assert [s.name for s in await c.schedules()] == ["mine"]
    assert (await c.schedule("mine", tenant="a")).paused_at is None
