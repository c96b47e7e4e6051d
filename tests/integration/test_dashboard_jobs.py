"""The dashboard's jobs pages as a cron user reads them, over HTTP on both databases: the
list's columns (what each job does, its schedule, last status, response time, next run),
its filters with their errors beside their fields and keyset paging kept through them, a
tenant that never lists another's job; a job still to run showing what it will send and
when; the quarantined page in its own words."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest

from corral import client, launching, model, scheduling, store
from corral.store import Finish
from corral.web import jobs as web_jobs
from tests.support.api import noop_client, over_http, sign_in

A, J = model.AttemptState, model.JobState
HOOK = "https://ops:hunter2@hooks.example.com/v1/ping?token=abc123&region=eu"
SHOWN = "https://[redacted]@hooks.example.com/v1/ping?token=[redacted]&amp;region=eu"


@pytest.fixture
async def c(db: store.Store) -> client.Client:
    made = noop_client(db)
    await made.user_add("ada", password="correct horse", tenant="a", role="operator")
    await made.user_add("vic", password="correct horse", tenant="a", role="viewer")
    await made.user_add("bob", password="correct horse", tenant="b", role="operator")
    return made


@pytest.fixture
async def http(c: client.Client) -> AsyncIterator[httpx.AsyncClient]:
    async with over_http(c) as made:
        yield made


def hook(
    url: str = HOOK, *, tenant: str = "a", schedule: str | None = None, **more: Any
) -> model.NewJob:
    spec = {"method": "POST", "url": url, "headers": {}, "expect": ["2xx"], **more.pop("spec", {})}
    payload = {scheduling.FIRING: {"schedule": schedule}} if schedule else None
    return model.NewJob(executor="http", spec=spec, payload=payload, tenant=tenant, **more)


async def stored(c: client.Client, *jobs: model.NewJob) -> list[int]:
    made = await c.store.jobs.submit(new=list(jobs), now=c.clock.now())
    return [job_id for job_id, _ in made]


def rows(page: str) -> dict[int, str]:
    """The #jobs table's rows, by job id: each row's HTML."""
    table = page.split('<table id="jobs">', 1)[1].split("</table>", 1)[0]
    return {int(m[1]): m[0] for m in re.finditer(r'<tr id="job-(\d+)">.*?</tr>', table, re.S)}


def cells(row: str) -> list[str]:
    return [re.sub(r"\s+", " ", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]


async def test_the_list_shows_what_each_job_does_its_last_run_and_its_next(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    later = c.clock.now() + timedelta(minutes=5)
    fired, cmd, waits = await stored(
        c,
        hook(schedule="nightly"),
        model.NewJob(executor="noop", spec={"command": ["echo", "hi there"]}, tenant="a"),
        hook("https://later.test/x", run_at=later),
    )
    claimed = await c.store.jobs.claim(now=c.clock.now(), limit=5, executors=["http", "noop"])
    fence = {x.job.id: x.attempt.id for x in claimed}
    log = launching.RunLog(streams=(), latency=0.123, status=204)
    await c.store.attempts.finish(
        finishes=[
            Finish(fence[fired], A.SUCCEEDED, None, "HTTP 204", output=log),
            Finish(fence[cmd], A.FAILED, 7, "exited with code 7"),
        ],
        now=c.clock.now(),
    )
    await sign_in(http, name="ada", password="correct horse")
    page = (await http.get("/ui/jobs")).text
    heads = re.findall(r'<th scope="col">([^<]+)</th>', page)
    assert heads == [
        "job", "state", "what", "schedule", "last status", "response time", "next run",
        "created",
    ]  # fmt: skip
    shown = rows(page)
    assert list(shown) == [waits, cmd, fired]
    assert cells(shown[fired])[2:6] == [
        f"<b>POST</b> <code>{SHOWN}</code>",
        '<a href="/ui/schedules/a/nightly">nightly</a>',
        "HTTP 204",
        "0.123 s",
    ]
    assert cells(shown[cmd])[2:5] == ["<code>echo &#39;hi there&#39;</code>", "-", "exit 7"]
    assert cells(shown[waits])[6] == later.strftime("%Y-%m-%d %H:%M:%S UTC")
    assert cells(shown[fired])[6] == "-", "it has run: no next run"
    for secret in ("hunter2", "abc123"):
        assert secret not in page
    assert '<a href="/ui/jobs/new" id="new-job">' in page
    await sign_in(http, name="vic", password="correct horse")
    assert 'id="new-job"' not in (await http.get("/ui/jobs")).text, "a viewer makes no job"


async def test_each_filter_lists_its_jobs_and_paging_keeps_it(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    orders = await stored(
        c, *(hook(f"https://Orders.test/{n}?token=zzz{n}", schedule="hourly") for n in range(55))
    )
    others = await stored(
        c,
        hook("https://billing.test/1", labels={"team": "pay"}, queue="slow"),
        hook("https://billing.test/2?token=orders"),
    )
    await sign_in(http, name="ada", password="correct horse")
    first = await http.get("/ui/jobs", params={"url": "orders.TEST"})
    assert list(rows(first.text)) == orders[::-1][: web_jobs.JOBS_PAGE]
    older = re.search(r'<a href="/ui/jobs\?([^"]+)" id="older">', first.text)
    assert older is not None
    link = older[1].replace("&amp;", "&")
    assert link == f"url=orders.TEST&before={orders[::-1][web_jobs.JOBS_PAGE - 1]}"
    rest = await http.get(f"/ui/jobs?{link}")
    assert list(rows(rest.text)) == orders[::-1][web_jobs.JOBS_PAGE :]
    assert 'id="older"' not in rest.text
    assert 'value="orders.TEST"' in rest.text, "the filter is kept in its field"
    for query, expected in (
        ({"schedule": "hourly", "url": "orders.test/54?"}, [orders[54]]),
        ({"label": "team=pay"}, [others[0]]),
        ({"queue": "slow", "state": "queued"}, [others[0]]),
        ({"url": "zzz"}, []),  # only in the tokens: never found
        ({"url": "billing", "state": "running"}, []),
    ):
        assert list(rows((await http.get("/ui/jobs", params=query)).text)) == expected, query


@pytest.mark.parametrize(
    ("query", "field", "said"),
    [
        ({"url": "ab"}, "url", "url: &#39;ab&#39; is too short"),
        ({"state": "sleeping"}, "state", "state: &#39;sleeping&#39; is not a job state"),
        ({"label": "team"}, "label", "label: &#39;team&#39; is not KEY=VALUE"),
    ],
)
async def test_a_wrong_filter_is_named_beside_its_field(
    http: httpx.AsyncClient, c: client.Client, query: dict[str, str], field: str, said: str
) -> None:
    await stored(c, hook())
    await sign_in(http, name="ada", password="correct horse")
    page = (await http.get("/ui/jobs", params=query)).text
    beside = re.search(  # the error follows its field (a select: its options), no other
        rf'id="filter-{field}"[^>]*aria-invalid="true" aria-describedby="error-{field}">'
        rf'(?:(?!<label).)*?<div id="error-{field}" class="warning">{said}',
        page,
        re.S,
    )
    assert beside, page
    assert rows(page) == {}
    assert 'id="bulk"' not in page


async def test_bulk_links_carry_only_the_filters_a_bulk_action_takes(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    await stored(c, hook(schedule="nightly"))
    await sign_in(http, name="ada", password="correct horse")
    plain = (await http.get("/ui/jobs", params={"state": "queued", "queue": "q"})).text
    assert 'href="/ui/bulk?state=queued&amp;queue=q&amp;action=cancel"' in plain
    for query in ({"url": "hooks"}, {"schedule": "nightly"}):
        page = (await http.get("/ui/jobs", params=query)).text
        assert "/ui/bulk?" not in page, "a bulk action would act on more than the list shows"
        assert "clear the schedule and URL ones" in page


async def test_a_tenant_never_lists_another_s_job_whatever_it_filters_by(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    same: dict[str, Any] = {"schedule": "nightly", "labels": {"team": "x"}, "queue": "q"}
    mine, theirs = await stored(
        c, hook("https://shared.test/h", **same), hook("https://shared.test/h", tenant="b", **same)
    )
    queries: list[dict[str, str]] = [
        {},
        {"url": "shared"},
        {"schedule": "nightly"},
        {"label": "team=x"},
        {"queue": "q"},
        {"state": "queued"},
        {
            "url": "shared",
            "schedule": "nightly",
            "label": "team=x",
            "queue": "q",
            "state": "queued",
        },
    ]
    for name, own in (("ada", mine), ("bob", theirs)):
        await sign_in(http, name=name, password="correct horse")
        for query in queries:
            page = (await http.get("/ui/jobs", params=query)).text
            assert list(rows(page)) == [own], (name, query)
            assert f"/ui/jobs/{theirs if own == mine else mine}" not in page


async def test_a_job_still_to_run_shows_what_it_will_send_and_when(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    at = c.clock.now() + timedelta(minutes=5)
    headers = {"Authorization": "Bearer t0ken", "X-Team": "ops"}
    body = {"password": "pa55", "n": 1, "callback": "https://u:pw@cb.test/?sig=xyz"}
    sent, form, cmd = await stored(
        c,
        hook(
            run_at=at,
            spec={"headers": headers, "json": body, "expect": ["200", "204"]}
            | {"expect_json": ["$.ok == true"], "max_response_time": "2s"},
            failure_callback="https://cb.test/failed?token=hunter2",
        ),
        hook("https://form.test/", spec={"body": "grant=x&client_secret=s3c&scope=a+b"}),
        model.NewJob(executor="noop", spec={"command": ["backup", "--all"]}, tenant="a"),
    )
    await sign_in(http, name="vic", password="correct horse")
    page = (await http.get(f"/ui/jobs/{sent}")).text
    request = page.split('<table id="request">', 1)[1].split("</table>", 1)[0]
    said = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", request))
    for shown in (
        "method POST",
        f"URL {SHOWN}",
        "Authorization: [redacted]",
        "X-Team: ops",
        "&#34;password&#34;: &#34;[redacted]&#34;",
        "&#34;n&#34;: 1",
        "https://[redacted]@cb.test/?sig=[redacted]",
        "expected statuses 200, 204",
        "assertions JSON $.ok == true response within 2s",
    ):
        assert shown in said, (shown, said)
    assert (
        '<th>failure callback</th><td colspan="5"><code>https://cb.test/failed?token=[redacted]'
        in page
    )
    for secret in ("hunter2", "abc123", "t0ken", "pa55", "xyz", ":pw@"):
        assert secret not in page
    assert "What it will send" in page
    runs = re.search(
        r'<p id="next-run">Runs at <time datetime="([^"]+)">([^<]+)</time> \(([^)]+)\)', page
    )
    assert runs is not None
    assert runs.groups() == (at.isoformat(), at.strftime("%Y-%m-%d %H:%M:%S UTC"), "in 5 min")
    queued = (await http.get(f"/ui/jobs/{form}")).text
    assert "grant=x&amp;client_secret=[redacted]&amp;scope=a+b" in queued
    assert "s3c" not in queued
    assert "(due now)" in queued, "a queued job runs as soon as it is claimed"
    ran = (await http.get(f"/ui/jobs/{cmd}")).text
    assert "<code>backup --all</code>" in ran
    assert 'id="request"' not in ran


@pytest.mark.parametrize(
    ("at", "said"),
    [(0, "due now"), (-30, "due now"), (40, "in 40 s"), (300, "in 5 min"), (250, "in 4 min 10 s"),
     (7500, "in 2 h 5 min"), (3600, "in 1 h"), (3 * 86400 + 4 * 3600 + 60, "in 3 d 4 h")],
)  # fmt: skip
def test_from_now_says_how_long_in_words(at: int, said: str) -> None:
    from datetime import UTC, datetime

    from corral.web import sends

    now = datetime(2026, 12, 1, tzinfo=UTC)
    assert sends.from_now(now + timedelta(seconds=at), now) == said


async def test_the_quarantined_page_says_why_in_its_own_words(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    rule = {"on_exit_codes": {"operator": "In", "values": [3]}, "action": "fail"}
    by_rule, by_platform = await stored(
        c,
        model.NewJob(executor="noop", spec={}, tenant="a", policy={"failure_rules": [rule]}),
        model.NewJob(executor="noop", spec={}, tenant="a"),
    )
    claimed = {
        x.job.id: x
        for x in await c.store.jobs.claim(now=c.clock.now(), limit=2, executors=["noop"])
    }
    await c.store.attempts.finish(
        finishes=[
            Finish(claimed[by_rule].attempt.id, A.FAILED, 3, "exited with code 3"),
            Finish(
                claimed[by_platform].attempt.id,
                A.FAILED,
                None,
                "HTTP 404 Not Found (expected 2xx)",
                model.FailureClass.PERMANENT,
            ),
        ],
        now=c.clock.now(),
    )
    await sign_in(http, name="ada", password="correct horse")
    page = (await http.get("/ui/dead")).text
    table = page.split('<table id="dead">', 1)[1].split("</table>", 1)[0]
    why = {
        int(m[1]): re.sub(r"\s+", " ", m[2]).strip()
        for m in re.finditer(r'<tr id="dead-(\d+)">.*?<td class="why">(.*?)</td>', table, re.S)
    }
    assert why == {
        by_rule: 'attempt 1 failed permanently<br><span class="dim">rule 1: exit code 3 In [3]'
        " -&gt; fail</span>",
        by_platform: 'attempt 1 failed permanently<br><span class="dim">noop executor: HTTP 404'
        " Not Found (expected 2xx)</span>",
    }
    for page in (table, (await http.get(f"/ui/jobs/{by_platform}")).text):
        assert "corral dead" not in page
        assert "`" not in page
        assert ")))" not in page
        assert ")) " not in page
    assert "Retry</button>" in table
    live = (await http.get(f"/ui/jobs/{by_rule}")).text
    assert re.search(
        r'id="explained">quarantined: attempt 1 failed permanently — rule 1: exit code 3 In \[3\]'
        r" -&gt; fail. It waits for a person: retry it after a fix, or discard it.<",
        live,
    )
