"""Assertions on HTTP responses against a real HTTP server on 127.0.0.1: `expect_json`,
`expect_body` and `max_response_time` each failing and passing, and a failed assertion
through the dispatcher and the store: class `assertion`, quarantined unless a failure rule
retries it, with the assertion and the value seen in the run log and in the alert."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiohttp import web

from corral import alerts, client, clock, config, dispatcher, launching, model, store
from corral.executors import http
from corral.testing import FrozenClock
from tests.support import launches
from tests.support.api import Api, over_http
from tests.support.mail import Inbox
from tests.support.net import http_server
from tests.support.wait import PATIENCE

LOCAL = ["127.0.0.0/8:1024-65535"]
FC, J = model.FailureClass, model.JobState


@dataclass
class Server:
    """A real HTTP server on 127.0.0.1 answering JSON: `says` per path, late by `slow`."""

    base: str = ""
    says: dict[str, Any] = field(default_factory=dict)
    slow: dict[str, float] = field(default_factory=dict)

    def url(self, path: str) -> str:
        return f"{self.base}{path}"


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    got = Server()

    async def handle(request: web.Request) -> web.StreamResponse:
        if (late := got.slow.get(request.path)) is not None:
            await asyncio.sleep(late)  # the server's own lateness: what the test measures
        said = got.says.get(request.path, {"ok": True})
        return web.Response(text=said if isinstance(said, str) else json.dumps(said))

    async with http_server(handle) as base:
        got.base = base
        yield got


def local_settings(**more: Any) -> config.Settings:
    return config.Settings(
        executors={"enabled": ["http"], "http": {"allow_networks": LOCAL}},  # type: ignore[arg-type]
        **more,
    )


@contextlib.asynccontextmanager
async def executor() -> AsyncIterator[http.HttpExecutor]:
    ex = http.HttpExecutor(
        clock=clock.SystemClock(),
        timeout=timedelta(seconds=PATIENCE),
        concurrency=4,
        allow_networks=LOCAL,
    )
    await ex.start()
    try:
        yield ex
    finally:
        await ex.close()


async def outcome(spec: dict[str, Any]) -> launching.Observation:
    """One request of `spec`, sent by the executor alone, and its outcome."""
    async with executor() as ex:
        events = ex.events()
        await ex.launch(launches.make_launch("http", "corral-1-1", spec))
        return await asyncio.wait_for(anext(events), PATIENCE)


@pytest.mark.parametrize(
    ("says", "assertion", "ok", "seen"),
    [
        ({"ok": False}, "$.ok == true", False, "saw false"),
        ({"ok": True}, "$.ok == true", True, None),
        ({"data": {"rows": [4, 5]}}, "$.data.rows[1] >= 5", True, None),
        ({"data": {}}, "$.data.rows exists", False, "nothing at $.data.rows"),
        ("<html>maintenance</html>", "$.ok == true", False, "the body is not JSON"),
    ],
)
async def test_expect_json_fails_and_passes(
    server: Server, says: Any, assertion: str, ok: bool, seen: str | None
) -> None:
    server.says["/status"] = says
    obs = await outcome({"url": server.url("/status"), "expect_json": assertion})
    assert obs.http_status == 200
    if ok:
        assert (obs.phase, obs.failure_class, obs.message) == (
            launching.Phase.SUCCEEDED,
            None,
            None,
        )
        return
    assert (obs.phase, obs.failure_class) == (launching.Phase.FAILED, FC.ASSERTION)
    assert seen is not None
    assert obs.message is not None
    assert obs.message.startswith(f"assertion failed: expect_json {assertion} ({seen}")
    assert obs.reason is not None
    assert obs.reason.endswith("(127.0.0.1)")


@pytest.mark.parametrize(
    ("pattern", "ok"),
    [('"status": *"up"', True), ('"status": *"down"', False), ("(?i)STATUS", True)],
)
async def test_expect_body_fails_and_passes(server: Server, pattern: str, ok: bool) -> None:
    server.says["/health"] = {"status": "up", "db": "up"}
    obs = await outcome({"url": server.url("/health"), "expect_body": pattern})
    assert obs.phase is (launching.Phase.SUCCEEDED if ok else launching.Phase.FAILED)
    if not ok:
        assert obs.failure_class == FC.ASSERTION
        assert obs.message == (
            f"assertion failed: expect_body /{pattern}/ (not in the body, which begins"
            ' {"status": "up", "db": "up"})'
        )
    assert obs.output is not None
    judged = obs.output.stream("assertions")
    assert judged is not None
    assert judged.text.startswith("passed  expect_body" if ok else "FAILED  expect_body")


async def test_max_response_time_fails_a_slow_answer_and_passes_a_quick_one(
    server: Server,
) -> None:
    """The slow answer sleeps 300 ms before it answers, so it can only take longer than its
    100 ms; the quick one has PATIENCE, far past what a loaded machine takes."""
    server.slow["/slow"] = 0.3
    slow = await outcome({"url": server.url("/slow"), "max_response_time": "100ms"})
    assert (slow.phase, slow.failure_class) == (launching.Phase.FAILED, FC.ASSERTION)
    assert slow.message is not None
    assert slow.message.startswith("assertion failed: max_response_time 100ms (took ")
    quick = await outcome({"url": server.url("/quick"), "max_response_time": PATIENCE})
    assert quick.phase is launching.Phase.SUCCEEDED


# --- through the dispatcher, the store and the alerts ------------------------------------------


async def run_jobs(db: store.Store, settings: config.Settings, frozen: FrozenClock, n: int) -> None:
    """One dispatcher tick that sends `n` due jobs, and their outcomes written."""
    ex = http.build(settings, frozen)
    await ex.start()
    d = dispatcher.Dispatcher(store=db, executors={"http": ex}, clock=frozen, settings=settings)
    events = ex.events()
    try:
        tick = await d.run_once()
        assert tick.launched == n
        for _ in range(n):
            d.completions.offer(await asyncio.wait_for(anext(events), PATIENCE))
        await d.completions.flush()
    finally:
        await ex.close()


async def test_a_200_that_says_false_is_quarantined_as_an_assertion_unless_a_rule_retries_it(
    db: store.Store, server: Server
) -> None:
    server.says["/ok"] = {"ok": False, "detail": "replica lagging"}
    frozen = FrozenClock()
    settings = local_settings(retry={"seed": 1})
    spec = {"url": server.url("/ok"), "expect_json": "$.ok == true"}
    rule = {"on_failure_classes": ["assertion"], "action": "retry"}
    made = await db.jobs.submit(
        new=[
            model.NewJob(executor="http", spec=spec, max_attempts=3),
            model.NewJob(
                executor="http", spec=spec, max_attempts=3, policy={"failure_rules": [rule]}
            ),
        ],
        now=frozen.now(),
    )
    (plain_id, _), (ruled_id, _) = made
    await run_jobs(db, settings, frozen, 2)

    plain, ruled = [await db.jobs.get(job_id=job_id) for job_id in (plain_id, ruled_id)]
    assert (plain.state, ruled.state) == (J.QUARANTINED, J.QUEUED)
    [attempt] = await db.attempts.list(job_id=plain_id)
    said = "assertion failed: expect_json $.ok == true (saw false)"
    assert attempt.failure_class == FC.ASSERTION
    assert attempt.reason is not None
    assert attempt.reason.startswith(f"{said}; HTTP 200 OK in ")
    reasons = [e.reason for e in await db.events.list(job_id=plain_id)]
    assert any(r.startswith(said) and r.endswith("(assertion)") for r in reasons)
    assert any(r.startswith("quarantined: attempt 1 failed permanently") for r in reasons)
    log = (await db.runlogs.of_job(job_id=plain_id))[attempt.id]
    assert log.status == 200
    judged = log.stream("assertions")
    assert judged is not None
    assert judged.text == "FAILED  expect_json $.ok == true: saw false\n"

    [first] = await db.attempts.list(job_id=ruled_id)
    assert first.failure_class == FC.TRANSIENT  # the rule's word
    ruled_events = await db.events.list(job_id=ruled_id)
    assert any(
        (e.details or {}).get("rule") == "rule 1: failure class assertion In [assertion] -> retry"
        for e in ruled_events
    )
    server.says["/ok"] = {"ok": True}
    frozen.advance(600)  # past any backoff
    await run_jobs(db, settings, frozen, 1)
    assert (await db.jobs.get(job_id=ruled_id)).state == J.SUCCEEDED


@pytest.mark.parametrize("assertion", [{"expect_body": "ok"}, {"expect_json": "$.ok == true"}])
async def test_a_failed_assertion_on_a_body_with_a_nul_ends_with_its_reason_written(
    db: store.Store, server: Server, assertion: dict[str, str]
) -> None:
    """The failed check quotes the body's start, NUL and all, into the attempt's reason and
    message (PostgreSQL's text holds no NUL): the job ends, its reason written with U+FFFD,
    and its failure callback made."""
    server.says["/bin"] = "\x00\x01 binary"
    frozen = FrozenClock()
    spec = {"url": server.url("/bin"), **assertion}
    hook = server.url("/hook")
    [(job_id, _)] = await db.jobs.submit(
        new=[model.NewJob(executor="http", spec=spec, failure_callback=hook)], now=frozen.now()
    )
    await run_jobs(db, local_settings(), frozen, 1)
    assert (await db.jobs.get(job_id=job_id)).state == J.QUARANTINED
    [attempt] = await db.attempts.list(job_id=job_id)
    assert attempt.failure_class == FC.ASSERTION
    assert attempt.reason is not None
    assert "begins \ufffd\x01 binary" in attempt.reason
    [callback] = [j for j in await db.jobs.list() if j.callback_of == job_id]
    assert callback.payload["reason"] == attempt.reason


async def test_the_failed_assertion_and_the_value_seen_are_in_the_alert(
    db: store.Store, server: Server, smtp: tuple[Inbox, int]
) -> None:
    inbox, port = smtp
    server.says["/ok"] = {"ok": False}
    frozen = FrozenClock(datetime.now(UTC))
    settings = local_settings(
        alerts={
            "channels": {
                "ops": {
                    "kind": "email",
                    "smtp_url": f"smtp://127.0.0.1:{port}",
                    "from": "corral@example.com",
                    "to": ["ops@example.com"],
                }
            },
            "rules": {"poison": {"on": ["quarantined"], "channels": ["ops"]}},
        }
    )
    await db.alerts.write(  # the alerter reads from the first event on
        name="alerter", read_from=0, read_to=0, messages=[], digested=[], now=frozen.now()
    )
    spec = {"url": server.url("/ok"), "expect_json": "$.ok == true"}
    [(job_id, _)] = await db.jobs.submit(
        new=[model.NewJob(executor="http", spec=spec)], now=frozen.now()
    )
    await run_jobs(db, settings, frozen, 1)
    alerter = alerts.Alerter(store=db, clock=frozen, settings=settings)
    try:
        assert await alerter.read_once() > 0
        await alerter.deliver_all()
    finally:
        await alerter.close()
    [mail] = inbox.messages
    assert mail["Subject"] == f"[corral] quarantined: job {job_id} of tenant default"
    body = mail.get_content()
    said = "assertion failed: expect_json $.ok == true (saw false); HTTP 200 OK in "
    assert f"Attempt 1: {said}" in body
    assert (
        f"Last attempt: assertion: quarantined: attempt 1 failed permanently (http executor: {said}"
        in body
    )


# --- through the API --------------------------------------------------------------------------

HTTP_JOB = {"executor": "http", "spec": {"url": "https://example.com/health"}}


@pytest.fixture
async def api(db: store.Store) -> AsyncIterator[Api]:
    settings = local_settings()
    c = client.Client(
        store=db,
        executors={"http": http.SpecCheck(settings)},
        settings=settings,
        clock=FrozenClock(),
    )
    async with over_http(c) as made:
        api = Api(c, made)
        for name, tenant in (("a-op", "a"), ("b-op", "b")):
            await api.token(name, tenant, "operator")
        yield api


@pytest.mark.parametrize(
    ("assertions", "words"),
    [
        ({"expect_json": "$.ok = true"}, "http spec: expect_json: '$.ok = true': after the path"),
        ({"expect_json": ["$.a exists", 7]}, "http spec: expect_json: must be an assertion"),
        ({"expect_body": "(a)\\1"}, "http spec: expect_body: invalid escape sequence"),
        ({"max_response_time": "fast"}, "http spec: max_response_time: 'fast' is not"),
        ({"expect_json": "$.n < 1e999"}, "http spec: expect_json: '$.n < 1e999': 1e999 is not a"),
        ({"expect_body": "\\pL{239}x"}, "http spec: expect_body: compiles to an RE2 program"),
    ],
)
async def test_the_api_refuses_a_malformed_assertion_naming_the_field(
    api: Api, assertions: dict[str, Any], words: str
) -> None:
    spec = {**HTTP_JOB["spec"], **assertions}  # type: ignore[dict-item]
    job = await api.http.post(
        "/api/v1/jobs", json={**HTTP_JOB, "spec": spec}, headers=api.as_("a-op")
    )
    assert job.status_code == 422, job.text
    assert words in job.json()["error"]
    schedule = {"name": "health", "every": "1m", **HTTP_JOB, "spec": spec}
    made = await api.http.post("/api/v1/schedules", json=schedule, headers=api.as_("a-op"))
    assert made.status_code == 422, made.text
    assert words in made.json()["error"]
    assert await api.c.store.jobs.list() == []
    assert await api.c.schedules() == []


async def test_the_api_keeps_a_job_s_assertions_in_their_normal_form_for_its_tenant(
    api: Api,
) -> None:
    spec = {**HTTP_JOB["spec"], "expect_json": "$.ok==true", "max_response_time": 2}  # type: ignore[dict-item]
    made = await api.http.post(
        "/api/v1/jobs", json={**HTTP_JOB, "spec": spec}, headers=api.as_("a-op")
    )
    assert made.status_code == 201, made.text
    shown = await api.http.get(f"/api/v1/jobs/{made.json()['id']}", headers=api.as_("a-op"))
    assert shown.json()["spec"]["expect_json"] == ["$.ok == true"]
    assert shown.json()["spec"]["max_response_time"] == "2s"
    other = await api.http.get(f"/api/v1/jobs/{made.json()['id']}", headers=api.as_("b-op"))
    assert other.status_code == 404
