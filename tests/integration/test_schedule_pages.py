"""A schedule's history, stats and the schedules list over HTTP on both databases: the API's
GET /schedules/{name}/firings (keyset paging, each row's fields), /stats and the list's pages,
bad `before`, `limit` and `after` refused naming the field, another tenant's schedule not
found (404) and not listed; and the dashboard's schedule page (settings, next firings to
the second, stats, charts, history with #older), the list a page at a time with #more, a
viewer without the actions, and another tenant's page not found."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from corral import client, config, launching, model, scheduler, store
from corral.store import Finish
from corral.testing import FrozenClock
from corral.web import schedule_page
from tests.support.api import Api, noop_client, over_http, serving, sign_in
from tests.support.forms import csrf

A, J = model.AttemptState, model.JobState
NOOP = {"spec": {}, "executor": "noop", "max_attempts": 1}
START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
TOKENS = [("a-view", "a", "viewer"), ("b-op", "b", "operator"), ("admin", None, "admin")]


@pytest.fixture
async def api(db: store.Store) -> AsyncIterator[Api]:
    async with serving(db, TOKENS, clock_=FrozenClock(START)) as made:
        yield made


async def fired_and_run(c: client.Client, name: str, times: int, tenant: str = "a") -> list[int]:
    """`times` firings of `name` a minute apart, each job run at once: the odd ones fail
    (exit 3), the even ones succeed (HTTP 200 in 0.25 s); their job ids, oldest first."""
    clock: FrozenClock = c.clock  # type: ignore[assignment]
    ids = []
    for i in range(times):
        await scheduler.Scheduler(store=c.store, clock=clock).pass_once()
        claimed = await c.store.jobs.claim(now=clock.now(), limit=10, executors=["noop"])
        await c.store.attempts.record_running(
            fences=[x.attempt.id for x in claimed], now=clock.now()
        )
        for x in claimed:
            if i % 2:
                end = Finish(x.attempt.id, A.FAILED, 3, "exit 3")
            else:
                log = launching.RunLog(latency=0.25, status=200)
                end = Finish(x.attempt.id, A.SUCCEEDED, 0, None, output=log)
            await c.store.attempts.finish(finishes=[end], now=clock.now())
            ids.append(x.job.id)
        clock.advance(60)
    return ids


async def test_the_firings_of_a_schedule_page_by_keyset_newest_first(api: Api) -> None:
    await api.c.schedule_create("nightly", every="1m", tenant="a", **NOOP)
    ids = await fired_and_run(api.c, "nightly", 5)
    view = api.as_("a-view")
    first = (await api.http.get("/api/v1/schedules/nightly/firings?limit=2", headers=view)).json()
    assert [f["job_id"] for f in first["firings"]] == [ids[4], ids[3]]
    assert first["next"] == "2026-03-01T12:03:00Z"
    newest, failed = first["firings"]
    assert newest == {
        "nominal_at": "2026-03-01T12:04:00Z",
        "outcome": "fired",
        "lateness": 0.0,
        "job_id": ids[4],
        "job_state": "succeeded",
        "status": 200,
        "exit_code": 0,
        "response_time": 0.25,
        "note": None,
    }
    assert (failed["job_state"], failed["status"], failed["exit_code"]) == ("failed", None, 3)
    rest = await api.http.get(
        "/api/v1/schedules/nightly/firings", params={"before": first["next"]}, headers=view
    )
    assert [f["job_id"] for f in rest.json()["firings"]] == [ids[2], ids[1], ids[0]]
    assert rest.json()["next"] is None
    offset = await api.http.get(
        "/api/v1/schedules/nightly/firings",
        params={"before": "2026-03-01T13:03:00+01:00", "limit": 1},
        headers=view,
    )
    assert [f["job_id"] for f in offset.json()["firings"]] == [ids[2]]  # 12:03Z, by offset


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("before=yesterday", "before: 'yesterday' is not an ISO 8601 time"),
        ("before=2026-03-01T12:00:00", "before: must carry a timezone"),
        ("before=0001-01-01T00:00:00Z", "before: must lie from"),
        ("limit=0", "limit: "),
        ("limit=1001", "limit: "),
        ("limit=ten", "limit: "),
    ],
)
async def test_a_bad_before_or_limit_is_refused_naming_it(api: Api, query: str, said: str) -> None:
    await api.c.schedule_create("nightly", every="1m", tenant="a", **NOOP)
    r = await api.http.get(f"/api/v1/schedules/nightly/firings?{query}", headers=api.as_("a-view"))
    assert r.status_code == 422, r.text
    assert r.json()["error"].startswith(said), r.json()
    assert r.json()["field"] == query.partition("=")[0]


async def test_another_tenant_s_history_and_stats_are_not_found(api: Api) -> None:
    await api.c.schedule_create("nightly", every="1m", tenant="a", **NOOP)
    await fired_and_run(api.c, "nightly", 1)
    for path in ("firings", "stats"):
        for query in ("", "?tenant=a"):
            r = await api.http.get(
                f"/api/v1/schedules/nightly/{path}{query}", headers=api.as_("b-op")
            )
            assert (r.status_code, r.json()) == (404, {"error": "no schedule 'nightly'"})
        mine = await api.http.get(
            f"/api/v1/schedules/nightly/{path}?tenant=a", headers=api.as_("admin")
        )
        assert mine.status_code == 200
    listed = await api.http.get("/api/v1/schedules?limit=10", headers=api.as_("b-op"))
    assert listed.json() == {"schedules": [], "next": None}
    assert (await api.http.get("/api/v1/schedules", headers=api.as_("b-op"))).json() == []


async def test_the_stats_say_the_success_rate_and_response_times_by_hour_and_day(
    api: Api,
) -> None:
    await api.c.schedule_create("nightly", every="1m", tenant="a", **NOOP)
    await fired_and_run(api.c, "nightly", 4)
    r = await api.http.get("/api/v1/schedules/nightly/stats", headers=api.as_("a-view"))
    stats = r.json()
    assert (stats["schedule"], stats["tenant"], stats["at"]) == (
        "nightly",
        "a",
        "2026-03-01T12:04:00Z",
    )
    day, hours = stats["last_30d"], stats["last_24h"]
    assert (len(day["buckets"]), day["bucket_seconds"]) == (30, 86400)
    assert (len(hours["buckets"]), hours["bucket_seconds"]) == (24, 3600)
    assert hours["buckets"][-1]["start"] == "2026-03-01T12:00:00Z"
    noon = hours["buckets"][-1]
    assert (noon["firings"], noon["succeeded"], noon["failed"], noon["success_rate"]) == (
        4,
        2,
        2,
        0.5,
    )
    assert noon["outcomes"]["fired"] == 4
    assert noon["response_time"]["max"] == 0.25
    assert day["success_rate"] == 0.5
    assert day["buckets"][-1]["firings"] == 4


async def test_the_list_pages_by_name_and_keeps_its_old_answer_without_paging(api: Api) -> None:
    for i in range(5):
        await api.c.schedule_create(f"s{i}", every="1h", tenant="a", **NOOP)
    await api.c.schedule_create("s0", every="1h", tenant="b", **NOOP)
    view = api.as_("a-view")
    whole = (await api.http.get("/api/v1/schedules", headers=view)).json()
    assert [s["name"] for s in whole] == [f"s{i}" for i in range(5)]
    assert whole[0]["upcoming"]
    page = (await api.http.get("/api/v1/schedules?limit=2", headers=view)).json()
    assert ([s["name"] for s in page["schedules"]], page["next"]) == (["s0", "s1"], "s1")
    rest = (await api.http.get("/api/v1/schedules?after=s1&limit=10", headers=view)).json()
    assert ([s["name"] for s in rest["schedules"]], rest["next"]) == (["s2", "s3", "s4"], None)
    every = api.as_("admin")
    all_of = (await api.http.get("/api/v1/schedules?limit=5", headers=every)).json()
    assert all_of["next"] == "a/s4"
    last = (await api.http.get(f"/api/v1/schedules?after={all_of['next']}", headers=every)).json()
    assert [(s["tenant"], s["name"]) for s in last["schedules"]] == [("b", "s0")]
    bad = await api.http.get("/api/v1/schedules?after=s1", headers=every)
    assert (bad.status_code, bad.json()["field"]) == (422, "after")
    assert (await api.http.get("/api/v1/schedules?limit=0", headers=view)).json()[
        "field"
    ] == "limit"


# --- the dashboard --------------------------------------------------------------------------------


@pytest.fixture
async def c(db: store.Store) -> client.Client:
    made = noop_client(db, clock_=FrozenClock(START))
    await made.user_add("ada", password="correct horse", tenant="a", role="operator")
    await made.user_add("vic", password="correct horse", tenant="a", role="viewer")
    return made


@pytest.fixture
async def http(c: client.Client) -> AsyncIterator[httpx.AsyncClient]:
    async with over_http(c) as made:
        yield made


def part(page: httpx.Response, element_id: str) -> str:
    """The element of `page` with `element_id`, up to its closing tag (tables and divs)."""
    found = re.search(rf'<(\w+)[^>]* id="{element_id}"[^>]*>(.*?)</\1>', page.text, re.S)
    assert found is not None, f"no #{element_id}"
    return found[2]


async def test_a_schedule_s_page_shows_settings_next_firings_stats_and_history(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    await c.schedule_create(
        "ticker", cron="*/1 * * * *", tz="Europe/Paris", tenant="a", labels={"team": "web"}, **NOOP
    )
    ids = await fired_and_run(c, "ticker", 3)  # at 12:00, 12:01, 12:02
    await sign_in(http, name="ada", password="correct horse")
    page = await http.get("/ui/schedules/a/ticker")
    assert page.status_code == 200
    assert "<h1>ticker</h1>" in page.text
    settings = part(page, "settings")
    assert "cron */1 * * * *" in settings
    assert "Europe/Paris" in settings
    assert "team=web" in settings
    assert "noop" in settings
    upcoming = re.findall(
        r"<tr class=\"nominal\">\s*<td>([^<]+)</td>\s*<td>([^<]+)</td>", page.text
    )
    assert upcoming[:2] == [
        ("2026-03-01 13:03:00 CET", "2026-03-01 12:03:00 UTC"),
        ("2026-03-01 13:04:00 CET", "2026-03-01 12:04:00 UTC"),
    ]  # in its zone and in UTC, to the second
    stats = part(page, "stats")
    assert "66.7 %" in stats
    assert "(2 of 3 ended jobs succeeded)" in stats
    for key in ("24h", "30d"):
        chart = part(page, f"chart-{key}")
        assert 'role="img"' in chart
        assert "<title" in chart
        assert "<desc" in chart
    rows = re.findall(r'<tr class="firing">(.*?)</tr>', page.text, re.S)
    assert len(rows) == 3
    assert f'href="/ui/jobs/{ids[-1]}"' in rows[0]
    assert "HTTP 200" in rows[0]
    assert "exit 3" in rows[1]
    assert "failed" in rows[1]
    assert 'id="older"' not in page.text
    assert 'id="actions"' in page.text
    assert ">Pause</button>" in page.text


async def test_a_next_firing_a_clock_change_moved_is_marked(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    """Paris skips 02:00 to 03:00 on 2026-03-29: the 02:30 of that day fires at 03:00."""
    await c.schedule_create(
        "night", cron="30 2 * * *", tz="Europe/Paris", start="2026-03-27", tenant="a", **NOOP
    )
    await sign_in(http, name="vic", password="correct horse")
    page = await http.get("/ui/schedules/a/night")
    rows = re.findall(r'<tr class="nominal">(.*?)</tr>', page.text, re.S)
    cells = [re.findall(r"<td>(.*?)</td>", row, re.S) for row in rows]
    assert [c[0] for c in cells[:3]] == [
        "2026-03-27 02:30:00 CET",
        "2026-03-28 02:30:00 CET",
        "2026-03-29 03:00:00 CEST",
    ]
    assert cells[2][1] == "2026-03-29 01:00:00 UTC"
    assert ">DST</span>" in cells[2][2]
    assert "DST" not in cells[1][2]


async def test_the_page_s_history_pages_by_keyset_and_a_bad_before_is_named(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    await c.schedule_create("dense", every="1s", tenant="a", **NOOP)
    clock: FrozenClock = c.clock  # type: ignore[assignment]
    clock.advance(2 * 60)  # 120 nominal times passed: catch-up records the latest 100 missed
    await scheduler.Scheduler(store=c.store, clock=clock).pass_once()
    await sign_in(http, name="vic", password="correct horse")
    first = await http.get("/ui/schedules/a/dense")
    assert len(re.findall(r'<tr class="firing">', first.text)) == schedule_page.FIRINGS_SHOWN
    older = re.search(r'<a href="([^"]+)" id="older">', first.text)
    assert older is not None
    assert older[1] == "/ui/schedules/a/dense?before=2026-03-01T12%3A01%3A11Z"
    second = await http.get(older[1].replace("&amp;", "&"))
    times = re.findall(r'<tr class="firing">\s*<td>([^<]+)</td>', second.text)
    assert times[0] == "2026-03-01 12:01:10 UTC"
    assert 'id="actions"' not in second.text
    bad = await http.get("/ui/schedules/a/dense?before=soon")
    assert bad.status_code == 422
    assert "before: &#39;soon&#39; is not an ISO 8601 time" in bad.text


async def test_another_tenant_s_schedule_page_is_not_found(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    await c.schedule_create("theirs", every="1h", tenant="b", **NOOP)
    await sign_in(http, name="ada", password="correct horse")
    for path in ("/ui/schedules/b/theirs", "/ui/schedules/a/theirs", "/ui/schedules/a/none"):
        assert (await http.get(path)).status_code == 404, path
    listed = await http.get("/ui/schedules")
    assert "theirs" not in listed.text
    token = csrf(listed)
    paused = await http.post("/ui/schedules/b/theirs/pause", data={"csrf": token})
    assert paused.status_code == 404
    assert (await c.schedule("theirs", tenant="b")).paused_at is None


async def test_the_list_pages_by_name_and_links_each_page(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    for i in range(55):
        await c.schedule_create(f"job-{i:02d}", every="10s", tenant="a", **NOOP)
    await sign_in(http, name="ada", password="correct horse")
    first = await http.get("/ui/schedules")
    rows = re.findall(r'<tr id="schedule-a-(job-\d+)">', first.text)
    assert rows == [f"job-{i:02d}" for i in range(50)]
    assert 'href="/ui/schedules/a/job-00"' in first.text
    assert '<a href="/ui/schedules/new" id="new-schedule">' in first.text
    assert "2026-03-01 12:00:10 UTC<br>2026-03-01 12:00:20 UTC" in first.text  # to the second
    more = re.search(r'<a href="([^"]+)" id="more">', first.text)
    assert more is not None
    assert more[1] == "/ui/schedules?after=job-49"
    second = await http.get(more[1])
    assert re.findall(r'<tr id="schedule-a-(job-\d+)">', second.text) == [
        f"job-{i:02d}" for i in range(50, 55)
    ]
    assert 'id="more"' not in second.text


async def test_pausing_from_the_schedule_s_page_comes_back_to_it(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    await c.schedule_create("nightly", every="1h", tenant="a", **NOOP)
    await sign_in(http, name="ada", password="correct horse")
    page = await http.get("/ui/schedules/a/nightly")
    went = await http.post(
        "/ui/schedules/a/nightly/pause",
        data={"csrf": csrf(page), "next": "/ui/schedules/a/nightly"},
    )
    assert went.status_code == 303
    assert (
        went.headers["location"]
        == "/ui/schedules/a/nightly?note=schedule-changed&name=nightly&did=paused"
    )
    again = await http.get(went.headers["location"])
    assert ">Resume</button>" in again.text
    assert "schedule nightly paused" in again.text
    elsewhere = await http.post(
        "/ui/schedules/a/nightly/resume", data={"csrf": csrf(page), "next": "https://evil.example/"}
    )
    assert elsewhere.headers["location"].startswith("/ui/?note=")  # never another site
    audited = await c.store.tokens.audit_list(tenant="a")
    assert [a.action for a in audited] == ["schedules.resume", "schedules.pause"]


def test_an_http_job_s_settings_show_its_request_with_secrets_redacted() -> None:
    """And what it asserts of the response, and where its result goes (callbacks)."""
    template: dict[str, Any] = {
        "executor": "http",
        "spec": {
            "method": "POST",
            "url": "https://user:pw@example.com/hook?token=s3cret&page=2",
            "headers": {"Authorization": "Bearer s3cret", "X-Team": "web"},
            "json": {"a": 1},
            "expect": ["2xx", "304"],
            "expect_body": "done",
            "expect_json": ["$.ok == true"],
            "max_response_time": "2s",
        },
        "callback": "https://example.com/done?token=s3cret",
        "policy": {"limits": {"http_request_timeout": "5s"}},
        "queue": "hooks",
        "priority": 3,
        "labels": {"team": "web"},
    }
    rows = dict(schedule_page.job_rows(template, config.Settings()))
    assert rows["method"] == "POST"
    assert rows["URL"] == "https://[redacted]@example.com/hook?token=[redacted]&page=2"
    assert rows["headers"] == ["Authorization: [redacted]", "X-Team: web"]
    assert rows["expected statuses"] == "2xx, 304"
    assert rows["assertions"] == ["body matches done", "JSON $.ok == true", "response within 2s"]
    assert rows["callback"] == "https://example.com/done?token=[redacted]"
    assert "failure callback" not in rows
    assert rows["request timeout"] == "5s"
    assert rows["deadline"].endswith("(default)")
    assert (rows["queue"], rows["priority"], rows["labels"]) == ("hooks", "3", ["team=web"])
    assert "s3cret" not in repr(rows)
