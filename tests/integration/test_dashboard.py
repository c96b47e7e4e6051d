"""The dashboard over HTTP on both databases (its browser tests: tests/browser): signing
in with a password or a token, the session cookie, CSRF on every form, roles, tenant
isolation on every page, counts that stay bounded, the overview kept a few seconds, bulk
actions from a preview, live pages over server-sent events, and failed sign-ins limited."""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import AsyncIterator
from datetime import datetime, timedelta

import httpx
import pytest

from corral import client, config, model, operations, retry, scheduler, store
from corral.store import Finish, budgets, overview
from corral.testing import FrozenClock
from corral.web import auth, live
from corral.web import overview as shown_overview
from tests.support.api import granting, noop_client, over_http, sign_in
from tests.support.forms import csrf
from tests.support.jobs import quarantine
from tests.support.wait import eventually

A, J = model.AttemptState, model.JobState
NOOP = {"spec": {}, "executor": "noop"}


@pytest.fixture
async def c(db: store.Store) -> client.Client:
    made = noop_client(db)
    await made.user_add("ada", password="correct horse", tenant="a", role="operator")
    await made.user_add("vic", password="correct horse", tenant="a", role="viewer")
    return made


@pytest.fixture
async def http(c: client.Client) -> AsyncIterator[httpx.AsyncClient]:
    async with over_http(c) as made:
        yield made


async def test_pages_need_a_session_and_signing_in_sets_a_safe_cookie(
    http: httpx.AsyncClient,
) -> None:
    first = await http.get("/ui/jobs?state=queued")
    assert first.status_code == 303
    assert first.headers["location"] == "/ui/sign-in?next=%2Fui%2Fjobs%3Fstate%3Dqueued"
    wrong = await sign_in(http, name="ada", password="wrong horse")
    assert wrong.status_code == 401
    assert "not valid" in wrong.text
    signed = await sign_in(http, name="ada", password="correct horse")
    assert signed.status_code == 303
    assert signed.headers["location"] == "/ui/jobs"
    cookie = signed.headers["set-cookie"].lower()
    for part in ("httponly", "samesite=lax", "path=/ui"):
        assert part in cookie
    assert "secure" not in cookie  # plain http here; https sets it
    page = await http.get("/ui/jobs")
    assert page.status_code == 200
    assert "ada · operator of a" in page.text
    out = await http.post("/ui/sign-out", data={"csrf": csrf(page)})
    assert out.status_code == 303
    assert (await http.get("/ui/")).status_code == 303


async def test_a_sign_in_form_without_its_pairing_cookie_is_refused(
    http: httpx.AsyncClient,
) -> None:
    refused = await http.post(
        "/ui/sign-in", data={"pairing": "forged", "name": "ada", "password": "correct horse"}
    )
    assert refused.status_code == 403


async def test_every_form_needs_the_session_s_csrf_token(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    await sign_in(http, name="ada", password="correct horse")
    page = await http.get("/ui/jobs")
    token = csrf(page)
    assert (await http.post("/ui/jobs", data={"command": "true"})).status_code == 403
    assert (await http.post("/ui/jobs", data={"command": "true", "csrf": "x"})).status_code == 403
    assert (await http.post("/ui/sign-out", data={})).status_code == 403
    job_id, _ = await c.submit(**NOOP, tenant="a")
    by_header = await http.post(f"/ui/jobs/{job_id}/cancel", headers={"X-CSRF-Token": token})
    assert by_header.status_code == 303
    assert (await c.job(job_id)).job.state == J.CANCELLED
    audited = await c.store.tokens.audit_list(tenant="a")
    assert [(a.action, a.details["by"]) for a in audited] == [("jobs.cancel", "ada")]


async def test_a_viewer_looks_but_may_not_act(http: httpx.AsyncClient, c: client.Client) -> None:
    job_id, _ = await c.submit(**NOOP, tenant="a")
    await sign_in(http, name="vic", password="correct horse")
    page = await http.get(f"/ui/jobs/{job_id}")
    assert page.status_code == 200
    assert "Cancel</button>" not in page.text
    refused = await http.post(f"/ui/jobs/{job_id}/cancel", data={"csrf": csrf(page)})
    assert refused.status_code == 403
    assert "takes an operator" in refused.text
    assert (await c.job(job_id)).job.state == J.QUEUED


async def test_another_tenant_s_job_is_not_found_and_not_listed(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    theirs, _ = await c.submit(**NOOP, tenant="b", queue="secret-queue")
    mine, _ = await c.submit(**NOOP, tenant="a")
    await sign_in(http, name="ada", password="correct horse")
    token = csrf(await http.get("/ui/jobs"))
    for path in (f"/ui/jobs/{theirs}", f"/ui/jobs/{theirs}/stream", "/ui/jobs/999999"):
        assert (await http.get(path)).status_code == 404, path
    cancel = await http.post(f"/ui/jobs/{theirs}/cancel", data={"csrf": token})
    assert cancel.status_code == 404
    assert (await c.job(theirs)).job.state == J.QUEUED
    listed = (await http.get("/ui/jobs")).text
    assert f'href="/ui/jobs/{mine}"' in listed
    assert f'href="/ui/jobs/{theirs}"' not in listed
    filtered = (await http.get("/ui/jobs?queue=secret-queue")).text
    assert f'href="/ui/jobs/{theirs}"' not in filtered
    assert "No jobs." in filtered
    for path in ("/ui/", "/ui/dead", "/ui/schedules"):
        assert f"/ui/jobs/{theirs}" not in (await http.get(path)).text


async def test_a_token_signs_in_and_a_submitted_command_becomes_a_job(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    _, secret = await c.token_create(name="ops", tenant="a", role="operator")
    signed = await sign_in(http, token=secret)
    assert signed.status_code == 303
    page = await http.get("/ui/jobs")
    assert "Submit a command" not in page.text, "tenant a is not granted process"
    refused = await http.post("/ui/jobs", data={"csrf": csrf(page), "command": "echo hi"})
    assert refused.status_code == 403
    assert "tenant &#39;a&#39; is not granted &#39;process&#39;" in refused.text
    assert await c.store.jobs.list(model.JobFilter(states=[]), limit=10) == []
    # Granted (once its jobs can run as strangers), the box is offered and makes a job.
    c.settings = granting(c.settings, "process", tenant="a")
    page = await http.get("/ui/jobs")
    assert "Submit a command" in page.text
    c.checkers = {**c.checkers, "process": _ProcessSpec()}  # checked here, never run
    made = await http.post("/ui/jobs", data={"csrf": csrf(page), "command": "echo hi"})
    assert made.status_code == 303
    job_id = int(made.headers["location"].rsplit("/", 1)[1])
    job = (await c.job(job_id)).job
    assert (job.tenant, job.spec["command"]) == ("a", ["sh", "-c", "echo hi"])


class _ProcessSpec:
    def validate_spec(self, spec: dict[str, object]) -> dict[str, object]:
        return spec


async def test_the_overview_shows_pools_in_use_and_failing_schedules(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    c.settings = config.Settings(pools={"backfill": 2})
    await c.schedule_create("nightly", every="1h", **NOOP, tenant="a")
    await scheduler.Scheduler(store=c.store, clock=c.clock).pass_once()  # fires at once
    fired = (await c.schedule("nightly", tenant="a")).last_job_id
    await sign_in(http, name="ada", password="correct horse")
    shown = (await http.get("/ui/")).text
    assert re.search(r"<td>backfill</td><td>0</td><td>2</td>", shown)
    assert "None: every schedule" in shown
    [claimed] = await c.store.jobs.claim(now=c.clock.now(), limit=1, executors=["noop"])
    assert claimed.job.id == fired
    failed = Finish(claimed.attempt.id, A.FAILED, 2, "exit 2", model.FailureClass.PERMANENT)
    await c.store.attempts.finish(finishes=[failed], now=c.clock.now())
    assert isinstance(c.clock, FrozenClock)
    c.clock.advance(shown_overview.KEEP_SECONDS)  # what was read is kept that long
    failing = (await http.get("/ui/")).text
    assert re.search(rf'<td>nightly</td><td>a</td><td><a href="/ui/jobs/{fired}">', failing)


async def test_the_overview_counts_each_state_up_to_a_cap(
    db: store.Store, c: client.Client
) -> None:
    for tenant in ("a", "a", "a", "b"):
        await c.submit(**NOOP, tenant=tenant)
    assert (await db.jobs.count_capped(tenant="a"))[J.QUEUED] == (3, False)
    assert (await db.jobs.count_capped(tenant=None))[J.QUEUED] == (4, False)
    capped = await db.database.read(
        functools.partial(overview.job_count_capped, tenant=None, cap=2)
    )
    assert capped[J.QUEUED] == (2, True)
    assert capped[J.SUCCEEDED] == (0, False)
    for _ in range(3):  # newer than every job of a's: a's count must not depend on them
        await c.submit(**NOOP, tenant="b")
    mine = await db.database.read(functools.partial(overview.job_count_capped, tenant="a", cap=2))
    assert mine[J.QUEUED] == (2, True), "a tenant's own jobs, however old"
    assert (
        await db.database.read(functools.partial(overview.job_count_capped, tenant="b", cap=5))
    )[J.QUEUED] == (4, False)


def count_of(page: str, state: model.JobState) -> str:
    found = re.search(rf'<div class="n">([^<]+)</div><span class="state {state}">', page)
    assert found is not None, state
    return found[1]


async def test_the_overview_is_kept_a_few_seconds_but_never_past_a_change_made_here(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    """What the overview read is shown again for KEEP_SECONDS, saying how old it is; a
    change made through the app (the dashboard's forms, the API) is never hidden by it."""
    assert isinstance(c.clock, FrozenClock)
    job_id, _ = await c.submit(**NOOP, tenant="a")
    await sign_in(http, name="ada", password="correct horse")
    shown = await http.get("/ui/")
    first = shown.text
    assert count_of(first, J.QUEUED) == "1"
    assert "s ago" not in first.split('id="freshness"', 1)[1].split("</p>", 1)[0]
    await c.submit(**NOOP, tenant="a")  # made elsewhere than through the app
    c.clock.advance(3)
    kept = (await http.get("/ui/")).text
    assert count_of(kept, J.QUEUED) == "1"
    assert ", 3 s ago" in kept
    assert (await http.post("/api/v1/jobs", json={})).status_code == 401  # refused: no change
    assert count_of((await http.get("/ui/")).text, J.QUEUED) == "1"
    assert count_of((await http.get("/ui/?fresh=1")).text, J.QUEUED) == "2"
    c.clock.advance(shown_overview.KEEP_SECONDS)
    await c.submit(**NOOP, tenant="a")
    assert count_of((await http.get("/ui/")).text, J.QUEUED) == "3", "kept no longer"
    cancel = await http.post(f"/ui/jobs/{job_id}/cancel", data={"csrf": csrf(shown)})
    assert cancel.status_code == 303
    after = (await http.get("/ui/")).text  # at once: the cancel was made here
    assert (count_of(after, J.QUEUED), count_of(after, J.CANCELLED)) == ("2", "1")


async def test_failed_sign_ins_are_limited_by_name_and_address_and_by_address(
    http: httpx.AsyncClient, c: client.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the failures allowed, a sign-in waits (429, saying how long), refused before
    its password is hashed: as a name from one address (5 a minute), and from an address
    as anyone (20 a minute). A name alone is never locked: its owner signs in elsewhere."""
    assert isinstance(c.clock, FrozenClock)
    hashed, real = [], client.users._password_matches
    monkeypatch.setattr(client.users, "_password_matches", lambda *a: hashed.append(1) or real(*a))
    app = http._transport.app  # type: ignore[attr-defined]
    away = httpx.ASGITransport(app=app, client=("192.0.2.7", 1234))
    assert (auth.FAILURES_PER_NAME_AND_ADDRESS, auth.FAILURES_PER_ADDRESS) == (5, 20)
    async with httpx.AsyncClient(transport=away, base_url="http://corral.test") as elsewhere:
        for _ in range(auth.FAILURES_PER_NAME_AND_ADDRESS):
            assert (await sign_in(http, name="ada", password="wrong horse")).status_code == 401
        refused = await sign_in(http, name="ada", password="correct horse")
        assert refused.status_code == 429
        assert "Too many failed sign-ins as ada: try again in 60 s." in refused.text
        assert refused.headers["retry-after"] == "60"
        assert len(hashed) == auth.FAILURES_PER_NAME_AND_ADDRESS, "refused before hashing"
        # Its owner, elsewhere, is not locked out by a stranger's guesses.
        assert (await sign_in(elsewhere, name="ada", password="correct horse")).status_code == 303
        left = auth.FAILURES_PER_ADDRESS - auth.FAILURES_PER_NAME_AND_ADDRESS
        for i in range(left):
            assert (await sign_in(http, name=f"guess{i}", password="x")).status_code == 401
        for fields in ({"name": "vic", "password": "correct horse"}, {"token": "corral_x"}):
            from_here = await sign_in(http, **fields)
            assert from_here.status_code == 429
            assert "Too many failed sign-ins from your address" in from_here.text
            assert from_here.headers["retry-after"] == "60"
        c.clock.advance(auth.SIGN_IN_WINDOW)
        assert (await sign_in(http, name="vic", password="correct horse")).status_code == 303
        assert (await sign_in(http, name="ada", password="correct horse")).status_code == 303


async def test_x_forwarded_for_is_read_only_from_a_trusted_proxy(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    """Sprayed X-Forwarded-For from an untrusted peer changes nothing: every failure is
    the peer's. Behind a trusted proxy, each client is its own address, the rightmost
    that is not a proxy."""
    app = http._transport.app  # type: ignore[attr-defined]
    for n in range(auth.FAILURES_PER_ADDRESS):
        sprayed = {"X-Forwarded-For": f"198.51.100.{n}"}
        answer = await sign_in(http, headers=sprayed, name=f"g{n}", password="x")
        assert answer.status_code == 401
    limited = await sign_in(
        http, headers={"X-Forwarded-For": "198.51.100.200"}, name="vic", password="wrong"
    )
    assert limited.status_code == 429, "the header of an untrusted peer is not read"
    c.settings = c.settings.model_copy(
        update={"api": config.ApiSettings(trusted_proxies=("10.0.0.0/24",))}
    )
    proxy = httpx.ASGITransport(app=app, client=("10.0.0.5", 443))
    async with httpx.AsyncClient(transport=proxy, base_url="http://corral.test") as behind:
        for _ in range(auth.FAILURES_PER_NAME_AND_ADDRESS):
            hops = {"X-Forwarded-For": "203.0.113.9, 198.51.100.7, 10.0.0.4"}
            assert (
                await sign_in(behind, headers=hops, name="ada", password="wrong")
            ).status_code == 401
        hops = {"X-Forwarded-For": "6.6.6.6, 198.51.100.7"}  # the left one is made up
        assert (
            await sign_in(behind, headers=hops, name="ada", password="wrong")
        ).status_code == 429
        other = {"X-Forwarded-For": "198.51.100.8"}
        signed = await sign_in(behind, headers=other, name="ada", password="correct horse")
        assert signed.status_code == 303, "another client behind the proxy is not locked"


@pytest.mark.parametrize(
    "target", ["https://evil.example/", "//evil.example/ui/", "/ui//evil.example"]
)
async def test_signing_in_goes_back_to_a_dashboard_page_only(
    http: httpx.AsyncClient, target: str
) -> None:
    form = await http.get("/ui/sign-in")
    pairing = re.search(r'name="pairing" value="([^"]+)"', form.text)
    assert pairing is not None
    signed = await http.post(
        "/ui/sign-in",
        data={"pairing": pairing[1], "next": target, "name": "ada", "password": "correct horse"},
    )
    assert signed.headers["location"] == "/ui/"


async def quarantined(
    c: client.Client, n: int, *, tenant: str = "a", queue: str = "q"
) -> list[int]:
    ids = [(await c.submit(**NOOP, tenant=tenant, queue=queue))[0] for _ in range(n)]
    await quarantine(c.store, c.clock, ids)
    return ids


def confirm_form(preview: httpx.Response) -> dict[str, str]:
    form = preview.text[preview.text.index('id="confirm"') :]
    form = form[: form.index("</form>")]
    return dict(re.findall(r'name="([^"]+)" value="([^"]*)"', form))


async def run_operations(c: client.Client) -> None:
    runner = operations.Runner(store=c.store, clock=c.clock, settings=c.settings)
    while await runner.run_once():
        pass


async def test_retry_all_quarantined_from_a_preview(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    mine = await quarantined(c, 2)
    theirs = await quarantined(c, 1, tenant="b")
    await sign_in(http, name="ada", password="correct horse")
    dead = (await http.get("/ui/dead")).text
    assert 'href="/ui/bulk?action=retry&amp;state=quarantined"' in dead
    preview = await http.get("/ui/bulk?action=retry&state=quarantined")
    assert re.search(r'id="preview-count">2<', preview.text)
    assert all(f'href="/ui/jobs/{i}"' in preview.text for i in mine)
    assert f'href="/ui/jobs/{theirs[0]}"' not in preview.text
    form = confirm_form(preview)
    assert (form["expect"], form["action"]) == ("2", "retry")
    started = await http.post("/ui/operations", data=form)
    assert started.status_code == 303
    where = started.headers["location"]
    shown = (await http.get(where)).text
    assert 'id="operation-state">running<' in shown
    assert f'sse-connect="{where}/stream"' in shown
    await run_operations(c)
    [(_, final), end] = pushed((await http.get(where + "/stream")).text)
    assert 'id="operation-state">succeeded<' in final
    assert re.search(r'id="op-applied">2<', final)
    assert end[0] == "end"
    assert "sse-connect" not in (await http.get(where)).text  # none once it has ended
    assert [(await c.job(i)).job.state for i in mine] == [J.QUEUED, J.QUEUED]
    assert (await c.job(theirs[0])).job.state == J.QUARANTINED
    listed = (await http.get("/ui/operations")).text
    assert f'href="{where}"' in listed
    audited = await c.store.tokens.audit_list(tenant="a")
    assert [(a.action, a.details["total"]) for a in audited] == [("operations.start", 2)]


async def test_a_changed_count_asks_again_with_the_new_one(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    await quarantined(c, 2)
    await sign_in(http, name="ada", password="correct horse")
    form = confirm_form(await http.get("/ui/bulk?action=discard&state=quarantined&queue=q"))
    await quarantined(c, 1)
    again = await http.post("/ui/operations", data=form)
    assert again.status_code == 409
    assert "now match 3 jobs, not 2" in again.text
    assert confirm_form(again)["expect"] == "3"
    assert await c.operations(tenant="a") == []
    assert (await http.post("/ui/operations", data=confirm_form(again))).status_code == 303


async def test_the_jobs_list_s_filters_go_to_the_preview_and_wrong_ones_are_said(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    await c.submit(**NOOP, tenant="a", queue="slow")
    await c.submit(**NOOP, tenant="a", queue="fast")
    await sign_in(http, name="ada", password="correct horse")
    listed = (await http.get("/ui/jobs?queue=slow")).text
    assert 'href="/ui/bulk?queue=slow&amp;action=cancel"' in listed
    preview = await http.get("/ui/bulk?queue=slow&action=cancel")
    assert re.search(r'id="preview-count">1<', preview.text)
    wrong = await http.get("/ui/bulk?state=queued&action=retry")
    assert "a retry touches quarantined jobs, not queued" in wrong.text
    assert 'id="confirm"' not in wrong.text


async def test_an_operation_is_stopped_and_bulk_forms_need_csrf_and_an_operator(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    await quarantined(c, 2)
    await sign_in(http, name="ada", password="correct horse")
    form = confirm_form(await http.get("/ui/bulk?action=retry&state=quarantined"))
    forged = {k: v for k, v in form.items() if k != "csrf"}
    assert (await http.post("/ui/operations", data=forged)).status_code == 403
    where = (await http.post("/ui/operations", data=form)).headers["location"]
    stopped = await http.post(where + "/cancel", data={"csrf": form["csrf"]})
    assert stopped.status_code == 303
    shown = (await http.get(stopped.headers["location"])).text
    assert "2 jobs left as they were" in shown
    assert 'id="operation-state">cancelled<' in shown
    await http.post("/ui/sign-out", data={"csrf": form["csrf"]})
    await sign_in(http, name="vic", password="correct horse")
    assert (await http.get("/ui/bulk?action=retry")).status_code == 403
    assert (await http.get(where)).status_code == 200  # a viewer looks
    token = csrf(await http.get("/ui/jobs"))
    assert (await http.post(where + "/cancel", data={"csrf": token})).status_code == 403


async def test_another_tenant_s_operation_is_not_found(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    await quarantined(c, 1, tenant="b")
    theirs = await c.bulk_start(
        model.BulkAction.RETRY, model.JobFilter(), tenant="b", expect=1, made_by="test"
    )
    await sign_in(http, name="ada", password="correct horse")
    token = csrf(await http.get("/ui/jobs"))
    for path in (f"/ui/operations/{theirs.id}", f"/ui/operations/{theirs.id}/stream"):
        assert (await http.get(path)).status_code == 404, path
    cancel = await http.post(f"/ui/operations/{theirs.id}/cancel", data={"csrf": token})
    assert cancel.status_code == 404
    assert (await c.operation(theirs.id)).state == model.OperationState.RUNNING
    assert f"/ui/operations/{theirs.id}" not in (await http.get("/ui/operations")).text


async def ended(c: client.Client, to: model.JobState, at: datetime, tenant: str = "a") -> None:
    """A job of `tenant` that ended in `to` at `at`."""
    job_id, _ = await c.submit(**NOOP, tenant=tenant)
    for frm, nxt in ((J.QUEUED, J.RUNNING), (J.RUNNING, to)):
        await c.store.events.transition(
            entity="job", ids=[job_id], expected=frm, to=nxt, now=at, reason="test"
        )


async def test_job_ends_are_counted_per_bucket_of_a_window(
    db: store.Store, c: client.Client
) -> None:
    since = datetime.fromisoformat("2026-01-01T11:31:00+00:00")
    minute = timedelta(minutes=1)
    await ended(c, J.SUCCEEDED, since)  # the first bucket
    await ended(c, J.SUCCEEDED, since + 59 * minute + timedelta(seconds=59))  # the last
    await ended(c, J.FAILED, since + 59 * minute)
    await ended(c, J.QUARANTINED, since + 29 * minute + timedelta(seconds=30))
    await ended(c, J.SUCCEEDED, since - timedelta(milliseconds=1))  # before the window
    await ended(c, J.SUCCEEDED, since + 60 * minute)  # after it
    await ended(c, J.SUCCEEDED, since + minute, tenant="b")
    await ended(c, J.CANCELLED, since + minute)  # not an end the charts count
    mine = await db.jobs.ends_counted(tenant="a", since=since, width=minute, buckets=60)
    assert len(mine) == 60
    assert (mine[0], mine[29], mine[59]) == ((1, 0), (0, 1), (1, 1))
    assert sum(ok + bad for ok, bad in mine) == 4
    every = await db.jobs.ends_counted(tenant=None, since=since, width=minute, buckets=60)
    assert every[1] == (1, 0)
    hourly = await db.jobs.ends_counted(
        tenant="a", since=since - timedelta(hours=1), width=timedelta(hours=1), buckets=2
    )
    assert hourly == [(1, 0), (2, 2)]


async def test_the_overview_charts_job_ends_and_shows_retry_budgets(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    assert isinstance(c.clock, FrozenClock)
    c.clock.advance(12 * 3600 + 30 * 60 + 10)  # 12:30:10
    now = c.clock.now()
    await ended(c, J.SUCCEEDED, now - timedelta(seconds=5))
    await ended(c, J.SUCCEEDED, now - timedelta(seconds=5))
    await ended(c, J.FAILED, now - timedelta(hours=2))
    await ended(c, J.FAILED, now, tenant="b")
    await c.user_add("root", password="correct horse", tenant=None, role="admin")
    await sign_in(http, name="ada", password="correct horse")
    shown = (await http.get("/ui/")).text
    hour = shown[shown.index('id="chart-1"') : shown.index('id="chart-2"')]
    day = shown[shown.index('id="chart-2"') :]
    assert '<span class="succeeded-total">2</span>' in hour
    assert '<span class="failed-total">0</span>' in hour
    assert "12:30: 2 succeeded, 0 failed or quarantined" in hour
    assert '<span class="failed-total">1</span>' in day  # the other tenant's is not counted
    assert "<script" not in shown.split("</head>", 1)[1]  # drawn on the server
    assert 'id="budgets"' not in shown  # queues are every tenant's: not for a tenant
    budget = retry.Budget.from_settings(c.settings)
    await c.store.database.tx(
        functools.partial(budgets.budget_take, queue="q", n=3, now=now, budget=budget)
    )
    await http.post("/ui/sign-out", data={"csrf": csrf(await http.get("/ui/jobs"))})
    await sign_in(http, name="root", password="correct horse")
    every = (await http.get("/ui/")).text
    assert '<span class="failed-total">2</span>' in every[every.index('id="chart-2"') :]
    shown_budget = f"<td>q</td><td>{budget.burst - 3:.1f}</td><td>{budget.burst:.0f}</td>"
    assert shown_budget in every


async def test_a_chart_counts_its_finished_buckets_once_per_window_position(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    """The buckets that are over are read once and kept until the window moves; the two
    newest are read at every view."""
    assert isinstance(c.clock, FrozenClock)
    c.clock.advance(12 * 3600 + 30 * 60 + 10)  # 12:30:10
    now = c.clock.now()
    await ended(c, J.SUCCEEDED, now - timedelta(seconds=5))
    await sign_in(http, name="ada", password="correct horse")

    def hour_total(shown: str) -> str:
        hour = shown[shown.index('id="chart-1"') : shown.index('id="chart-2"')]
        return hour.split('<span class="succeeded-total">', 1)[1].split("<", 1)[0]

    assert hour_total((await http.get("/ui/")).text) == "1"
    await ended(c, J.SUCCEEDED, now - timedelta(minutes=10))  # into a bucket already read
    await ended(c, J.SUCCEEDED, now)  # into a live one
    c.clock.advance(shown_overview.KEEP_SECONDS)  # the overview read is kept that long
    assert hour_total((await http.get("/ui/")).text) == "2"
    c.clock.advance(60)  # the window moves: every bucket is read again
    assert hour_total((await http.get("/ui/")).text) == "3"


# --- live pages over server-sent events ---------------------------------------------------


def pushed(text: str) -> list[tuple[str, str]]:
    """Each message of a text/event-stream body: (its name, its data)."""
    found = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        lines = block.split("\n")
        name = next((x[6:].strip() for x in lines if x.startswith("event:")), "message")
        data = "\n".join(x[5:].removeprefix(" ") for x in lines if x.startswith("data:"))
        if any(x.startswith(("event:", "data:")) for x in lines):
            found.append((name, data))
    return found


def slots_taken(http: httpx.AsyncClient) -> int:
    app = http._transport.app  # type: ignore[attr-defined]
    slots = getattr(app.state, "live_slots", None)
    return 0 if slots is None else int(slots.taken)


async def test_a_job_s_page_is_pushed_as_it_changes_until_it_stops(
    http: httpx.AsyncClient, c: client.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(live, "MAX_SECONDS", 10**9)  # the frozen clock runs fast here
    job_id, _ = await c.submit(**NOOP, tenant="a")
    await sign_in(http, name="ada", password="correct horse")
    shown = (await http.get(f"/ui/jobs/{job_id}")).text
    assert f'sse-connect="/ui/jobs/{job_id}/stream"' in shown
    assert "hx-trigger" not in shown  # nothing polls
    assert isinstance(c.clock, FrozenClock)
    started = c.clock.monotonic()
    streaming = asyncio.create_task(http.get(f"/ui/jobs/{job_id}/stream"))
    await eventually(  # its first drawing is made: it waits for a change (its sleeps move time)
        lambda: slots_taken(http) == 1 and c.clock.monotonic() > started,
        what="the stream drew the queued job",
    )
    await c.cancel(job_id, reason="test")
    answer = await streaming
    assert answer.headers["content-type"].startswith("text/event-stream")
    messages = pushed(answer.text)
    assert [name for name, _ in messages] == ["live", "live", "end"]
    assert '<span class="state queued" id="job-state">queued</span>' in messages[0][1]
    assert '<span class="state cancelled" id="job-state">cancelled</span>' in messages[1][1]
    assert "retry: 2000" in answer.text  # how long the browser waits to connect again
    assert slots_taken(http) == 0
    ended = (await http.get(f"/ui/jobs/{job_id}")).text
    assert "sse-connect" not in ended  # a job that stopped opens no stream


async def test_a_session_s_streams_never_show_another_tenant_s_jobs(
    http: httpx.AsyncClient, c: client.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream acts as its session: another tenant's job or operation is not found, the
    overview's stream draws the session's tenant's overview only, as it changes, and
    none opens without a session (one ends with its session)."""
    monkeypatch.setattr(live, "MAX_SECONDS", 10**9)
    [theirs] = await quarantined(c, 1, tenant="b")
    [mine] = await quarantined(c, 1, tenant="a")
    op = await c.bulk_start(
        model.BulkAction.RETRY, model.JobFilter(), tenant="b", expect=1, made_by="test"
    )
    assert (await http.get("/ui/overview/stream")).status_code == 303  # to sign in
    await sign_in(http, name="ada", password="correct horse")
    for path in (f"/ui/jobs/{theirs}/stream", f"/ui/operations/{op.id}/stream"):
        assert (await http.get(path)).status_code == 404, path
    streaming = asyncio.create_task(http.get("/ui/overview/stream"))
    await eventually(lambda: slots_taken(http) == 1, what="the stream is open")
    await quarantined(c, 1, tenant="b")  # while it streams
    [later] = await quarantined(c, 1, tenant="a")
    keeper = http._transport.app.state.overview  # type: ignore[attr-defined]
    await eventually(  # the stream has read it (it pushes it next), then its session ends
        lambda: "a" in keeper.drawn and f"/ui/jobs/{later}" in keeper.drawn["a"].parts,
        what="the overview read again",
    )
    await c.sign_out(http.cookies[auth.COOKIE])
    messages = pushed((await streaming).text)
    assert messages[0][0] == "live"
    assert any(name == "fresh" for name, _ in messages)
    everything = "".join(data for _, data in messages)
    assert f'href="/ui/jobs/{mine}"' in everything
    assert f'href="/ui/jobs/{later}"' in everything, "pushed as it changed"
    assert "<td>b</td>" not in everything
    assert f'href="/ui/jobs/{theirs}"' not in everything
    await c.user_add("root", password="correct horse", tenant=None, role="viewer")
    await sign_in(http, name="root", password="correct horse")
    monkeypatch.setattr(live, "MAX_SECONDS", 2 * shown_overview.KEEP_SECONDS)
    every = "".join(data for _, data in pushed((await http.get("/ui/overview/stream")).text))
    assert f'href="/ui/jobs/{theirs}"' in every  # the same stream, of every tenant


async def test_live_pages_past_the_limit_are_429_until_one_ends(
    http: httpx.AsyncClient, c: client.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(live, "MAX_SECONDS", 10**9)
    monkeypatch.setattr(live, "MAX_STREAMS", 1)
    job_id, _ = await c.submit(**NOOP, tenant="a")
    await sign_in(http, name="ada", password="correct horse")
    first = asyncio.create_task(http.get(f"/ui/jobs/{job_id}/stream"))
    await eventually(lambda: slots_taken(http) == 1, what="the first stream holds the slot")
    refused = await http.get(f"/ui/jobs/{job_id}/stream")
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "5"
    assert "live pages are open already" in refused.text
    await c.cancel(job_id, reason="test")
    assert (await first).status_code == 200
    assert slots_taken(http) == 0


GUARDS = {
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
}


async def test_every_dashboard_answer_carries_its_guards(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    """Pages, fragments, redirects, errors and static files alike: no frame may hold the
    dashboard, nothing is sniffed, no referrer leaves it, and only its own scripts and
    styles run (no inline ones, no eval)."""
    answers = [await http.get(p) for p in ("/ui/sign-in", "/ui/jobs", "/ui/static/htmx.min.js")]
    await sign_in(http, name="ada", password="correct horse")
    job_id, _ = await c.submit(**NOOP, tenant="a")
    answers += [await http.get(p) for p in ("/ui/", f"/ui/jobs/{job_id}", "/ui/jobs/999999")]
    assert [a.status_code for a in answers] == [200, 303, 200, 200, 200, 404]
    for answer in answers:
        for name, value in GUARDS.items():
            assert answer.headers[name] == value, (answer.url, name)
        policy = answer.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in policy
        assert "script-src 'self'" in policy
        assert "style-src 'self'" in policy
        assert "unsafe-inline" not in policy
        assert "unsafe-eval" not in policy
        if answer.headers.get("content-type", "").startswith("text/html"):
            assert "<style" not in answer.text
            assert 'style="' not in answer.text
    assert "x-frame-options" not in (await http.get("/api/v1/openapi.json")).headers


@pytest.mark.parametrize(
    ("query", "shown"),
    [
        ("note=job-changed&job=12&did=cancelled", "job 12 cancelled"),
        ("note=schedule-changed&name=nightly&did=paused", "schedule nightly paused"),
        ("note=operation-stopped&op=3&left=1,204", "operation 3 stopped: 1,204 jobs left"),
        ("note=Your+session+expired.+Call+us", None),  # no such note
        ("note=job-changed&job=12&did=hacked+by+eve", None),  # a field out of its form
        ("note=job-changed&job=<b>1</b>&did=cancelled", None),
        ("note=job-changed&did=cancelled", None),  # a field missing
    ],
)
async def test_a_note_is_one_of_a_fixed_set(
    http: httpx.AsyncClient, query: str, shown: str | None
) -> None:
    await sign_in(http, name="ada", password="correct horse")
    page = (await http.get(f"/ui/jobs?{query}")).text
    notes = re.findall(r'<div class="note" role="status">([^<]*)</div>', page)
    if shown is None:
        assert notes == []
    else:
        assert len(notes) == 1
        assert notes[0].startswith(shown)


async def test_a_count_that_is_not_ascii_digits_is_refused_not_a_500(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    await quarantined(c, 1)
    await sign_in(http, name="ada", password="correct horse")
    form = confirm_form(await http.get("/ui/bulk?action=retry&state=quarantined"))
    answer = await http.post("/ui/operations", data={**form, "expect": "²"})
    assert answer.status_code < 500
    assert "expect: the form lost the previewed count" in answer.text
