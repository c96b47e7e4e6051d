"""The `http` executor against real HTTP servers on 127.0.0.1 (aiohttp), through its guard."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from aiohttp import web
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from corral import clock, config, dispatcher, errors, launching, model, reconciler, runtime, store
from corral.executors import http, http_guard, http_outcome, http_request, http_send, http_spec
from corral.sinks.http import verify_signature
from corral.testing import FrozenClock
from tests.support import launches
from tests.support.net import Handler, http_server
from tests.support.wait import PATIENCE

LOCAL = ("127.0.0.0/8:1024-65535",)


@dataclass
class Receiver:
    """A real HTTP server on 127.0.0.1: what it answers, and every request it saw."""

    base: str = ""
    seen: list[dict[str, Any]] = field(default_factory=list)
    answers: dict[str, Handler] = field(default_factory=dict)

    def url(self, path: str) -> str:
        return f"{self.base}{path}"


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    got = Receiver()

    async def handle(request: web.Request) -> web.StreamResponse:
        got.seen.append(
            {
                "method": request.method,
                "path": request.path,
                "headers": dict(request.headers),
                "body": await request.read(),
            }
        )
        answer = got.answers.get(request.path)
        return await answer(request) if answer else web.Response(text="ok")

    async with http_server(handle) as base:
        got.base = base
        yield got


def local_settings(**more: Any) -> config.Settings:
    """corral's settings with the http executor alone, let reach 127.0.0.0/8 on ports 1024 and up."""
    return config.Settings(
        executors={"enabled": ["http"], "http": {"allow_networks": list(LOCAL)}},  # type: ignore[arg-type]
        **more,
    )


def reply(status: int, text: str = "", **headers: str) -> Handler:
    async def answer(request: web.Request) -> web.StreamResponse:
        return web.Response(status=status, text=text, headers=headers)

    return answer


@contextlib.asynccontextmanager
async def executor(
    *, allow: tuple[str, ...] = LOCAL, seconds: float = 10.0
) -> AsyncIterator[http.HttpExecutor]:
    ex = http.HttpExecutor(
        clock=clock.SystemClock(),
        timeout=timedelta(seconds=seconds),
        concurrency=4,
        allow_networks=allow,
    )
    await ex.start()
    try:
        yield ex
    finally:
        await ex.close()


async def outcome(ex: http.HttpExecutor, spec: dict[str, Any], **kw: Any) -> launching.Observation:
    """Launch one request and wait for its pushed outcome."""
    launch = launches.make_launch("http", kw.pop("name", "corral-1-1"), spec, **kw)
    events = ex.events()
    await ex.launch(launch)
    return await asyncio.wait_for(anext(events), PATIENCE)


async def test_a_request_carries_the_job_and_its_key_and_succeeds(receiver: Receiver) -> None:
    spec = {
        "method": "POST",
        "url": receiver.url("/hook?x=1"),
        "headers": {"X-Team": "data"},
        "json": {"rows": 3},
    }
    async with executor() as ex:
        obs = await outcome(ex, spec, job_id=7, fence=42, idempotency_key="nightly-2026-12-02")
    assert obs.phase is launching.Phase.SUCCEEDED
    assert obs.reason is not None
    assert obs.reason.startswith("HTTP 200 OK in ")
    assert obs.reason.endswith("(127.0.0.1)")
    assert obs.identity == model.Identity(7, 1, 42)
    [seen] = receiver.seen
    assert (seen["method"], seen["path"], json.loads(seen["body"])) == (
        "POST",
        "/hook",
        {"rows": 3},
    )
    headers = seen["headers"]
    assert headers["Corral-Job-Id"] == "7"
    assert headers["Corral-Fence"] == "42"
    assert headers["Idempotency-Key"] == "nightly-2026-12-02"
    assert headers["X-Team"] == "data"
    assert headers["Content-Type"] == "application/json"
    assert headers["Host"] == receiver.base.removeprefix("http://")


@pytest.mark.parametrize(
    ("status", "phase", "failure"),
    [
        (500, launching.Phase.FAILED, model.FailureClass.TRANSIENT),
        (503, launching.Phase.FAILED, model.FailureClass.TRANSIENT),
        (429, launching.Phase.FAILED, model.FailureClass.TRANSIENT),
        (408, launching.Phase.FAILED, model.FailureClass.TRANSIENT),
        (404, launching.Phase.FAILED, model.FailureClass.PERMANENT),
        (400, launching.Phase.FAILED, model.FailureClass.PERMANENT),
        (204, launching.Phase.SUCCEEDED, None),
    ],
)
async def test_statuses_are_judged(
    receiver: Receiver, status: int, phase: launching.Phase, failure: model.FailureClass | None
) -> None:
    receiver.answers["/x"] = reply(status, "" if status == 204 else f"first line {status}\nmore")
    async with executor() as ex:
        obs = await outcome(ex, {"url": receiver.url("/x")})
    assert (obs.phase, obs.failure_class) == (phase, failure)
    assert obs.reason is not None
    assert obs.reason.startswith(f"HTTP {status} ")
    assert obs.message == (None if phase is launching.Phase.SUCCEEDED else f"first line {status}")


async def test_expect_names_the_statuses_that_succeed(receiver: Receiver) -> None:
    receiver.answers["/created"] = reply(201)
    async with executor() as ex:
        obs = await outcome(ex, {"url": receiver.url("/created"), "expect": "200,204"})
    assert (obs.phase, obs.failure_class) == (launching.Phase.FAILED, model.FailureClass.PERMANENT)


async def test_a_server_slower_than_the_timeout_is_a_transient_failure(
    receiver: Receiver,
) -> None:
    release = asyncio.Event()

    async def slow(request: web.Request) -> web.StreamResponse:
        await release.wait()
        return web.Response(text="late")

    receiver.answers["/slow"] = slow
    try:
        async with executor(seconds=0.3) as ex:
            obs = await outcome(ex, {"url": receiver.url("/slow")})
    finally:
        release.set()
    assert (obs.phase, obs.failure_class) == (launching.Phase.FAILED, model.FailureClass.TRANSIENT)
    assert obs.reason is not None
    assert "0.3s" in obs.reason


async def test_a_redirect_to_the_metadata_address_is_refused(receiver: Receiver) -> None:
    receiver.answers["/go"] = reply(302, location="http://169.254.169.254/latest/meta-data/")
    async with executor() as ex:
        obs = await outcome(ex, {"url": receiver.url("/go")})
    assert (obs.phase, obs.failure_class) == (launching.Phase.FAILED, model.FailureClass.PERMANENT)
    assert obs.reason == (
        "refused: 169.254.169.254 is a link-local address (executors.http.allow_networks opens it)"
    )
    assert [s["path"] for s in receiver.seen] == ["/go"]


async def test_redirects_are_followed_and_checked_each_time(receiver: Receiver) -> None:
    receiver.answers["/old"] = reply(303, location="/new")
    receiver.answers["/new"] = reply(200, "here")
    receiver.answers["/loop"] = reply(302, location="/loop")
    async with executor() as ex:
        followed = await outcome(ex, {"method": "POST", "url": receiver.url("/old"), "body": "x"})
        looped = await outcome(ex, {"url": receiver.url("/loop")}, name="corral-2-1", job_id=2)
    assert followed.phase is launching.Phase.SUCCEEDED
    assert [(s["method"], s["path"]) for s in receiver.seen[:2]] == [
        ("POST", "/old"),
        ("GET", "/new"),
    ]
    assert (looped.phase, looped.reason) == (
        launching.Phase.FAILED,
        f"more than {http_send.MAX_REDIRECTS} redirects (127.0.0.1)",
    )


async def test_a_name_that_resolves_to_a_private_address_is_refused_unless_allowed(
    receiver: Receiver,
) -> None:
    url = receiver.url("/x").replace("127.0.0.1", "localhost")
    async with executor(allow=()) as ex:
        refused = await outcome(ex, {"url": url})
    assert refused.phase is launching.Phase.FAILED
    assert refused.reason is not None
    assert refused.reason.startswith("refused: localhost: ")
    assert "loopback" in refused.reason
    assert receiver.seen == []
    async with executor() as ex:
        allowed = await outcome(ex, {"url": url})
    assert allowed.phase is launching.Phase.SUCCEEDED
    assert receiver.seen[0]["headers"]["Host"] == url.removeprefix("http://").removesuffix("/x")


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("10.1.2.3", "private"),
        ("192.168.0.1", "private"),
        ("172.16.0.1", "private"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("100.64.0.1", "shared (CGNAT)"),
        ("fd00::1", "private"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("240.0.0.1", "reserved"),
    ],
)
def test_the_guard_refuses_every_address_that_is_not_public(address: str, kind: str) -> None:
    why = http_guard.Guard().refusal(address, 443)
    assert why == f"{address} is a {kind} address (executors.http.allow_networks opens it)"


@pytest.mark.parametrize(
    ("address", "inner"),
    [
        ("2002:a9fe:a9fe::", "169.254.169.254 is a link-local address"),  # 6to4
        ("2002:7f00:1::", "127.0.0.1 is a loopback address"),
        ("2001:0:4136:e378:8000:63bf:f5ff:fffe", "10.0.0.1 is a private address"),  # Teredo
    ],
)
def test_the_guard_looks_inside_addresses_that_carry_an_ipv4_one(address: str, inner: str) -> None:
    why = http_guard.Guard().refusal(address, 443)
    assert why == f"{address} holds {inner} (executors.http.allow_networks opens it)"
    assert http_guard.Guard().refusal("2002:5db8:d822::", 443) is None  # 6to4 of a public address


def test_the_guard_lets_public_addresses_and_allowed_ranges_through() -> None:
    assert http_guard.Guard().refusal("93.184.216.34", 443) is None
    assert http_guard.Guard().refusal("2606:2800:220:1:248:1893:25c8:1946", 443) is None
    assert http_guard.Guard(["10.0.0.0/8"]).refusal("10.9.9.9", 443) is None
    assert http_guard.Guard(["10.0.0.0/8"]).refusal("192.168.0.1", 443) is not None


@pytest.mark.parametrize(
    ("entry", "address", "port", "open_"),
    [
        ("127.0.0.0/8", "127.0.0.1", 80, True),  # a bare network: the web's ports only
        ("127.0.0.0/8", "127.0.0.1", 443, True),
        ("127.0.0.0/8", "127.0.0.1", 5432, False),  # PostgreSQL beside a local receiver
        ("127.0.0.1:8080", "127.0.0.1", 8080, True),
        ("127.0.0.1:8080", "127.0.0.1", 8081, False),
        ("127.0.0.1:8080", "127.0.0.2", 8080, False),
        ("127.0.0.0/8:8000-8099", "127.0.0.9", 8099, True),
        ("127.0.0.0/8:8000-8099", "127.0.0.9", 8100, False),
        ("[::1]:8080", "::1", 8080, True),
        ("[::1]:8080", "::1", 80, False),
        ("::1", "::1", 443, True),
        ("[fd00::/8]:9000", "fd00::5", 9000, True),
        ("10.0.0.0/8", "93.184.216.34", 5432, True),  # a public address: any port
    ],
)
def test_allow_networks_name_ports_and_a_bare_network_opens_the_web_s(
    entry: str, address: str, port: int, open_: bool
) -> None:
    why = http_guard.Guard([entry]).refusal(address, port)
    assert (why is None) is open_, why
    if not open_ and address.startswith("127.0.0.") and entry.startswith("127.0.0.0/8"):
        assert f"port {port} is not opened" in (why or "")


@pytest.mark.parametrize(
    "entry", ["127.0.0.1:", "127.0.0.1:0", "127.0.0.1:9-8", "[::1]:", "[::1", "[::1]x", "a:b"]
)
def test_an_allow_networks_entry_that_is_not_one_names_the_rule(entry: str) -> None:
    with pytest.raises(ValueError, match="ADDRESS|ports must be 1-65535"):
        config.Settings(executors={"http": {"allow_networks": [entry]}})


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"url": "example.com/x"}, "http spec: url: must start with http:// or https://"),
        ({"url": "ftp://example.com/x"}, "http spec: url: must start with http:// or https://"),
        ({"url": "file:///etc/passwd"}, "http spec: url: must start with http:// or https://"),
        ({"url": "https://"}, "http spec: url: "),
        ({}, "http spec: url: must be an absolute http:// or https:// URL"),
        ({"url": "https://a.example", "method": "FETCH"}, "http spec: method: must be one of"),
        ({"url": "https://a.example", "headers": {"Bad Name": "x"}}, "is not a header name"),
        ({"url": "https://a.example", "headers": {"X": "a\r\nB: c"}}, "must be one line"),
        ({"url": "https://a.example", "headers": {"Idempotency-Key": "x"}}, "is set by corral"),
        ({"url": "https://a.example", "body": "x", "json": {}}, "give body or json, not both"),
        ({"url": "https://a.example", "expect": "ok"}, "http spec: expect: must be statuses"),
        ({"url": "https://a.example", "expect": "600"}, "http spec: expect: must be statuses"),
        ({"url": "https://a.example", "timeout": 3}, "http spec: timeout: unknown field"),
    ],
)
def test_bad_specs_are_refused_naming_the_field(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(errors.InvalidInput, match=message.replace("?", r"\?")):
        http_spec.check_spec(spec)


def test_a_spec_is_normalised() -> None:
    assert http_spec.check_spec(
        {"url": "https://a.example/x", "method": "post", "expect": [200, 204]}
    ) == {
        "method": "POST",
        "url": "https://a.example/x",
        "headers": {},
        "expect": ["200", "204"],
    }


async def test_a_launched_name_is_never_sent_again(receiver: Receiver) -> None:
    async with executor() as ex:
        launch = launches.make_launch("http", "corral-1-1", {"url": receiver.url("/once")})
        events = ex.events()
        await ex.launch(launch)
        await ex.launch(launch)  # in flight
        await asyncio.wait_for(anext(events), PATIENCE)
        await ex.launch(launch)  # ended
        seen = await ex.observe(["corral-1-1", "corral-9-1"])
    assert [s["path"] for s in receiver.seen] == ["/once"]
    assert seen["corral-1-1"].phase is launching.Phase.SUCCEEDED
    assert seen["corral-9-1"].phase is launching.Phase.ABSENT


# --- through the dispatcher and the store ---------------------------------------------------


async def test_a_job_that_fails_twice_then_succeeds_is_retried_with_one_key(
    db: store.Store, receiver: Receiver
) -> None:
    """500, 500, 200: three attempts, each recorded with its status, one Idempotency-Key,
    a higher fence each time."""
    statuses = iter([500, 500, 200])

    async def flaky(request: web.Request) -> web.StreamResponse:
        return web.Response(status=next(statuses), text="busy")

    receiver.answers["/flaky"] = flaky
    frozen = FrozenClock()
    settings = local_settings(retry={"quarantine_after": 5, "seed": 1})
    ex = http.build(settings, frozen)
    await ex.start()
    d = dispatcher.Dispatcher(store=db, executors={"http": ex}, clock=frozen, settings=settings)
    [(job_id, _)] = await db.jobs.submit(
        new=[model.NewJob(executor="http", spec={"url": receiver.url("/flaky")}, max_attempts=5)],
        now=frozen.now(),
    )
    events = ex.events()
    try:
        for _ in range(3):
            tick = await d.run_once()
            assert (tick.claimed, tick.launched) == (1, 1)
            d.completions.offer(await asyncio.wait_for(anext(events), PATIENCE))
            await d.completions.flush()
            frozen.advance(600)  # past any backoff
        job = await db.jobs.get(job_id=job_id)
        attempts = await db.attempts.list(job_id=job_id)
        logs = await db.runlogs.of_job(job_id=job_id)
    finally:
        await ex.close()
    assert job.state == model.JobState.SUCCEEDED
    assert [(f, log.status, log.address) for f, log in logs.items()] == [
        (a.id, status, "127.0.0.1") for a, status in zip(attempts, (500, 500, 200), strict=True)
    ]
    for log in logs.values():
        request, response = log.streams
        assert request.text.startswith(f"GET {receiver.url('/flaky')}\n")
        assert response.text.startswith(f"HTTP {log.status} ")
        assert response.text.endswith("\n\nbusy")
        assert log.latency is not None
        assert 0 <= log.latency < PATIENCE
    assert [a.state for a in attempts] == [
        model.AttemptState.FAILED,
        model.AttemptState.FAILED,
        model.AttemptState.SUCCEEDED,
    ]
    assert [a.reason.split(" in ")[0] for a in attempts if a.reason] == [
        "HTTP 500 Internal Server Error",
        "HTTP 500 Internal Server Error",
        "HTTP 200 OK",
    ]
    keys = {s["headers"]["Idempotency-Key"] for s in receiver.seen}
    assert keys == {f"corral-job-{job_id}"}
    fences = [int(s["headers"]["Corral-Fence"]) for s in receiver.seen]
    assert fences == sorted(fences)
    assert len(set(fences)) == 3


async def test_an_http_attempt_is_running_before_its_request_is_sent(
    db: store.Store, receiver: Receiver
) -> None:
    """The store says `running` by the time the receiver sees the request: a crash after
    the send can only leave a running attempt (lost, then retried with a new fence), never
    a launching one that recovery would send again."""
    states_when_sent: list[str] = []
    ids: list[int] = []

    async def look(request: web.Request) -> web.StreamResponse:
        [attempt] = await db.attempts.list(job_id=ids[0])
        states_when_sent.append(attempt.state)
        return web.Response(text="ok")

    receiver.answers["/look"] = look
    frozen = FrozenClock()
    settings = local_settings()
    ex = http.build(settings, frozen)
    await ex.start()
    d = dispatcher.Dispatcher(store=db, executors={"http": ex}, clock=frozen, settings=settings)
    [(job_id, _)] = await db.jobs.submit(
        new=[model.NewJob(executor="http", spec={"url": receiver.url("/look")})], now=frozen.now()
    )
    ids.append(job_id)
    events = ex.events()
    try:
        tick = await d.run_once()
        d.completions.offer(await asyncio.wait_for(anext(events), PATIENCE))
        await d.completions.flush()
    finally:
        await ex.close()
    assert (tick.launched, tick.recorded) == (1, 0)  # recorded before, not after
    assert states_when_sent == [model.AttemptState.RUNNING]
    assert (await db.jobs.get(job_id=job_id)).state == model.JobState.SUCCEEDED


async def test_a_request_cut_short_by_a_crash_is_lost_then_retried_under_a_new_fence(
    db: store.Store, receiver: Receiver
) -> None:
    """corral dies while the receiver holds the request: a new corral never sends that
    attempt again; past recovery_grace it is lost, and the job's next attempt carries a
    higher fence and the same Idempotency-Key."""
    held, answer = asyncio.Event(), asyncio.Event()
    tries = iter(["hold", "ok"])

    async def hook(request: web.Request) -> web.StreamResponse:
        if next(tries) == "hold":
            held.set()
            await answer.wait()
        return web.Response(text="done")

    receiver.answers["/hook"] = hook
    frozen = FrozenClock()
    settings = local_settings(retry={"seed": 1})
    [(job_id, _)] = await db.jobs.submit(
        new=[model.NewJob(executor="http", spec={"url": receiver.url("/hook")})], now=frozen.now()
    )
    first = http.build(settings, frozen)
    await first.start()
    d = dispatcher.Dispatcher(store=db, executors={"http": first}, clock=frozen, settings=settings)
    try:
        await d.run_once()
        await asyncio.wait_for(held.wait(), PATIENCE)
    finally:
        await first.close()  # the crash: its request's outcome is never heard
        answer.set()
    second = http.build(settings, frozen)
    await second.start()
    r = reconciler.Reconciler(store=db, executors={"http": second}, clock=frozen, settings=settings)
    d = dispatcher.Dispatcher(store=db, executors={"http": second}, clock=frozen, settings=settings)
    events = second.events()
    try:
        await r.run_once()
        [attempt] = await db.attempts.list(job_id=job_id)
        assert attempt.state == model.AttemptState.RUNNING  # not yet sure: it waits
        assert len(receiver.seen) == 1  # and it is not sent again
        frozen.advance(settings.timeouts.recovery_grace.total_seconds() + 1)
        await r.run_once()
        frozen.advance(600)  # past the retry's backoff
        await d.run_once()
        d.completions.offer(await asyncio.wait_for(anext(events), PATIENCE))
        await d.completions.flush()
    finally:
        await second.close()
    attempts = await db.attempts.list(job_id=job_id)
    assert [a.state for a in attempts] == [model.AttemptState.LOST, model.AttemptState.SUCCEEDED]
    assert (await db.jobs.get(job_id=job_id)).state == model.JobState.SUCCEEDED
    assert {s["headers"]["Idempotency-Key"] for s in receiver.seen} == {f"corral-job-{job_id}"}
    assert [int(s["headers"]["Corral-Fence"]) for s in receiver.seen] == [a.id for a in attempts]


async def test_recovery_records_a_launching_request_running_before_it_sends_it(
    db: store.Store, receiver: Receiver
) -> None:
    """A dispatcher that died between its claim and its record never sent the request (it
    sends only what it recorded): recovery records it running, then sends it, once."""
    states_when_sent: list[str] = []

    async def late(request: web.Request) -> web.StreamResponse:
        [attempt] = await db.attempts.list(job_id=job_id)
        states_when_sent.append(attempt.state)
        return web.Response(text="ok")

    receiver.answers["/late"] = late
    frozen = FrozenClock()
    settings = local_settings()
    [(job_id, _)] = await db.jobs.submit(
        new=[model.NewJob(executor="http", spec={"url": receiver.url("/late")})], now=frozen.now()
    )
    claimed = await db.jobs.claim(
        now=frozen.now(),
        limit=1,
        executors=["http"],
        limits=store.DefaultLimits(
            settings.timeouts.attempt_deadline, settings.timeouts.lease_timeout
        ),
    )
    assert [c.attempt.state for c in claimed] == [model.AttemptState.LAUNCHING]
    frozen.advance(settings.timeouts.launch_grace.total_seconds() + 1)
    ex = http.build(settings, frozen)
    await ex.start()
    events = ex.events()
    r = reconciler.Reconciler(store=db, executors={"http": ex}, clock=frozen, settings=settings)
    try:
        await r.run_once()
        obs = await asyncio.wait_for(anext(events), PATIENCE)
        await r.run_once()
    finally:
        await ex.close()
    assert obs.phase is launching.Phase.SUCCEEDED
    [attempt] = await db.attempts.list(job_id=job_id)
    assert attempt.state == model.AttemptState.RUNNING  # its outcome is the dispatcher's to write
    assert [s["path"] for s in receiver.seen] == ["/late"]
    assert states_when_sent == [model.AttemptState.RUNNING]


def test_retry_after_is_read_as_seconds_or_a_date() -> None:
    now = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
    assert http_outcome.retry_after_seconds("120", now) == 120.0
    assert http_outcome.retry_after_seconds("Wed, 02 Dec 2026 12:01:30 GMT", now) == 90.0
    assert http_outcome.retry_after_seconds("Wed, 02 Dec 2026 11:00:00 GMT", now) == 0.0
    assert http_outcome.retry_after_seconds("soon", now) is None
    assert http_outcome.retry_after_seconds(None, now) is None


async def test_a_429_with_retry_after_holds_the_retry_that_long(
    db: store.Store, receiver: Receiver
) -> None:
    """Retry-After: 90 on a 429: the job is queued again no sooner than 90 s on (its own
    backoff would be at most 1 s), and never later than the backoff's cap."""
    receiver.answers["/busy"] = reply(429, "slow down", **{"Retry-After": "90"})
    receiver.answers["/very-busy"] = reply(503, "", **{"Retry-After": "86400"})
    frozen = FrozenClock()
    settings = local_settings(retry={"seed": 1, "base": 1, "cap": 600})
    ex = http.build(settings, frozen)
    await ex.start()
    d = dispatcher.Dispatcher(store=db, executors={"http": ex}, clock=frozen, settings=settings)
    made = await db.jobs.submit(
        new=[
            model.NewJob(executor="http", spec={"url": receiver.url("/busy")}),
            model.NewJob(executor="http", spec={"url": receiver.url("/very-busy")}),
        ],
        now=frozen.now(),
    )
    events = ex.events()
    try:
        await d.run_once()
        for _ in made:
            d.completions.offer(await asyncio.wait_for(anext(events), PATIENCE))
        await d.completions.flush()
    finally:
        await ex.close()
    busy, very_busy = [await db.jobs.get(job_id=job_id) for job_id, _ in made]
    assert (busy.state, very_busy.state) == (model.JobState.QUEUED, model.JobState.QUEUED)
    assert (busy.run_at - frozen.now()).total_seconds() == pytest.approx(90, abs=1)
    assert (very_busy.run_at - frozen.now()).total_seconds() == pytest.approx(600, abs=1)


async def test_a_job_s_status_rule_retries_a_404_that_would_quarantine_it(
    db: store.Store, receiver: Receiver
) -> None:
    receiver.answers["/not-yet"] = reply(404, "no such report yet")
    frozen = FrozenClock()
    settings = local_settings()
    rule = {"on_http_statuses": {"operator": "In", "values": [404]}, "action": "retry"}
    made = await db.jobs.submit(
        new=[
            model.NewJob(
                executor="http",
                spec={"url": receiver.url("/not-yet")},
                policy={"failure_rules": [rule]},
            ),
            model.NewJob(executor="http", spec={"url": receiver.url("/not-yet")}),
        ],
        now=frozen.now(),
    )
    ex = http.build(settings, frozen)
    await ex.start()
    d = dispatcher.Dispatcher(store=db, executors={"http": ex}, clock=frozen, settings=settings)
    events = ex.events()
    try:
        await d.run_once()
        for _ in made:
            d.completions.offer(await asyncio.wait_for(anext(events), PATIENCE))
        await d.completions.flush()
    finally:
        await ex.close()
    ruled, plain = [await db.jobs.get(job_id=job_id) for job_id, _ in made]
    assert (ruled.state, plain.state) == (model.JobState.QUEUED, model.JobState.QUARANTINED)


async def test_a_body_and_a_url_are_filled_from_the_payload(receiver: Receiver) -> None:
    payload = {"report": "sales & costs", "corral": {"nominal_time": "2026-12-02T02:30:00+00:00"}}
    spec = {
        "method": "POST",
        "url": receiver.url("/r/{{report}}"),
        "body": "for {{corral.nominal_time}}: {{corral}}",
    }
    async with executor() as ex:
        obs = await outcome(ex, spec, payload=payload)
        missing = await outcome(
            ex, {**spec, "body": "{{nope}}"}, payload=payload, name="corral-2-1", job_id=2
        )
    assert obs.phase is launching.Phase.SUCCEEDED
    [seen] = receiver.seen
    assert seen["path"] == "/r/sales & costs"  # sent percent-encoded, read back decoded
    assert seen["body"].decode() == (
        'for 2026-12-02T02:30:00+00:00: {"nominal_time": "2026-12-02T02:30:00+00:00"}'
    )
    assert (missing.phase, missing.failure_class) == (
        launching.Phase.FAILED,
        model.FailureClass.PERMANENT,
    )
    assert missing.reason == "refused: template: {{nope}} names nothing in the job's payload"


async def test_without_a_body_a_post_sends_the_payload(receiver: Receiver) -> None:
    async with executor() as ex:
        await outcome(ex, {"method": "POST", "url": receiver.url("/p")}, payload={"a": 1})
        await outcome(ex, {"url": receiver.url("/g")}, payload={"a": 1}, name="corral-2-1")
    post, get = receiver.seen
    assert (json.loads(post["body"]), post["headers"]["Content-Type"]) == (
        {"a": 1},
        "application/json",
    )
    assert get["body"] == b""


# --- signatures --------------------------------------------------------------------------


async def test_requests_are_signed_with_the_tenant_s_secrets_through_a_rotation(
    db: store.Store, receiver: Receiver
) -> None:
    """Standard Webhooks, checked by the standardwebhooks library's own verifier: after a
    rotation both secrets sign (a receiver on either verifies), after the overlap only the
    new one; a tenant without a secret sends unsigned requests."""
    wall = clock.SystemClock()
    made = {"at": wall.now()}

    class Moved(clock.SystemClock):
        def now(self) -> datetime:
            return made["at"]

    keys_clock = Moved()
    overlap = timedelta(hours=24)
    old = "whsec_" + base64.b64encode(b"o" * 32).decode()
    new = "whsec_" + base64.b64encode(b"n" * 32).decode()
    await db.tokens.secret_add(
        tenant="acme", secret=old, now=keys_clock.now(), overlap=overlap, rotate=False
    )
    await db.tokens.secret_add(
        tenant="acme", secret=new, now=keys_clock.now(), overlap=overlap, rotate=True
    )
    async with executor() as ex:
        ex.use_signing_keys(runtime._signing_keys(db, keys_clock))
        during = await outcome(ex, {"method": "POST", "url": receiver.url("/s"), "json": {"a": 1}})
        made["at"] = wall.now() + overlap + timedelta(seconds=1)
        ex._keys_read.clear()  # past KEYS_FRESH_SECONDS
        after = await outcome(ex, {"url": receiver.url("/s")}, name="corral-2-1", job_id=2)
        unsigned = await outcome(
            ex, {"url": receiver.url("/s")}, name="corral-3-1", job_id=3, tenant="other"
        )
    assert (during.phase, after.phase, unsigned.phase) == (launching.Phase.SUCCEEDED,) * 3
    first, second, third = receiver.seen
    for secret in (old, new):
        Webhook(secret).verify(first["body"], first["headers"])
    assert len(first["headers"]["webhook-signature"].split()) == 2
    assert first["headers"]["webhook-id"] == first["headers"]["Idempotency-Key"]
    Webhook(new).verify(second["body"], second["headers"], json_parse=False)
    with pytest.raises(WebhookVerificationError):
        Webhook(old).verify(second["body"], second["headers"], json_parse=False)
    assert "webhook-signature" not in {k.lower() for k in third["headers"]}
    verify_signature(first["body"], first["headers"], [old])
    verify_signature(second["body"], second["headers"], [old, new])
    with pytest.raises(errors.SignatureInvalid, match="not signed by corral"):
        verify_signature(second["body"], second["headers"], old)
    with pytest.raises(errors.SignatureInvalid, match="not signed by corral"):
        verify_signature(b'{"a": 2}', first["headers"], new)  # a body changed on the way


async def test_a_secret_is_made_once_and_rotated_after(db: store.Store, clock: FrozenClock) -> None:
    await db.tokens.secret_add(
        tenant="t", secret="whsec_a", now=clock.now(), overlap=timedelta(hours=1), rotate=False
    )
    with pytest.raises(errors.InvalidInput, match="corral secrets rotate"):
        await db.tokens.secret_add(
            tenant="t", secret="whsec_b", now=clock.now(), overlap=timedelta(hours=1), rotate=False
        )
    with pytest.raises(errors.InvalidInput, match="corral secrets create"):
        await db.tokens.secret_add(
            tenant="u", secret="whsec_c", now=clock.now(), overlap=timedelta(hours=1), rotate=True
        )
    await db.tokens.secret_add(
        tenant="t", secret="whsec_b", now=clock.now(), overlap=timedelta(hours=1), rotate=True
    )
    assert await db.tokens.secrets_signing(tenants=["t", "u"], now=clock.now()) == {
        "t": ["whsec_b", "whsec_a"]
    }
    listed = await db.tokens.secrets_list(tenant="t", now=clock.now())
    assert [s.retires_at is None for s in listed] == [False, True]
    assert all(s.fingerprint.startswith("sha256:") and "whsec" not in s.fingerprint for s in listed)
    clock.advance(3601)
    assert await db.tokens.secrets_signing(tenants=["t"], now=clock.now()) == {"t": ["whsec_b"]}
    assert len(await db.tokens.secrets_list(tenant=None, now=clock.now())) == 1


async def test_a_redirect_to_another_host_carries_no_credential(receiver: Receiver) -> None:
    """Followed to another origin (here: the same server by another name), a request loses
    its Authorization, cookies, secret-named headers and signature; to the same origin it
    keeps them. 303 drops the body and what describes it."""
    other = receiver.url("/landing").replace("127.0.0.1", "localhost")
    receiver.answers["/away"] = reply(307, location=other)
    receiver.answers["/here"] = reply(307, location="/landing")
    receiver.answers["/see"] = reply(303, location="/landing")
    secret = {"Authorization": "Bearer s3cret", "Cookie": "s=1", "X-Api-Key": "k", "X-Team": "d"}
    async with executor() as ex:
        for n, path in enumerate(("/away", "/here", "/see"), start=1):
            spec = {
                "method": "POST",
                "url": receiver.url(path),
                "headers": secret,
                "json": {"a": 1},
            }
            obs = await outcome(ex, spec, name=f"corral-{n}-1", job_id=n)
            assert obs.phase is launching.Phase.SUCCEEDED
    landed = [s for s in receiver.seen if s["path"] == "/landing"]
    away, here, seen_after_303 = (s["headers"] for s in landed)
    assert {"Authorization", "Cookie", "X-Api-Key"}.isdisjoint(away)
    assert (away["X-Team"], landed[0]["body"]) == ("d", b'{"a": 1}')
    assert here["Authorization"] == "Bearer s3cret"
    assert (landed[2]["method"], landed[2]["body"]) == ("GET", b"")
    assert "Content-Type" not in seen_after_303


async def test_a_redirect_from_https_to_http_is_refused() -> None:
    outcome_ = await http_send.send(
        lambda origin: httpx.AsyncClient(transport=httpx.MockTransport(_to_http)),
        http_guard.Guard(["0.0.0.0/0", "::/0"]),
        method="GET",
        url="https://198.51.100.7/x",
        headers={},
        content=None,
        seconds=5,
        body_bytes=100,
    )
    assert outcome_.refused == "a redirect from https to http (198.51.100.7) is refused"


def _to_http(request: httpx.Request) -> httpx.Response:
    return httpx.Response(
        302, headers={"location": "http://198.51.100.7/x"}, stream=httpx.ByteStream(b"")
    )


async def test_a_stopping_dispatcher_waits_for_requests_in_flight(
    db: store.Store, receiver: Receiver
) -> None:
    """Stopped while the receiver holds a request, the dispatcher lets it end and writes
    its outcome: a stop loses nothing, and nothing is sent again."""
    arrived, answer = asyncio.Event(), asyncio.Event()

    async def slow(request: web.Request) -> web.StreamResponse:
        arrived.set()
        await answer.wait()
        return web.Response(text="done")

    receiver.answers["/slow"] = slow
    settings = local_settings()
    wall = clock.SystemClock()
    ex = http.build(settings, wall)
    await ex.start()
    [(job_id, _)] = await db.jobs.submit(
        new=[model.NewJob(executor="http", spec={"url": receiver.url("/slow")})], now=wall.now()
    )
    d = dispatcher.Dispatcher(store=db, executors={"http": ex}, clock=wall, settings=settings)
    stop = asyncio.Event()
    running = asyncio.create_task(d.run(stop))
    try:
        await asyncio.wait_for(arrived.wait(), PATIENCE)
        stop.set()
        await asyncio.sleep(0)  # the loop is stopping: only then does the answer come
        answer.set()
        await asyncio.wait_for(running, PATIENCE)
    finally:
        await ex.close()
    assert (await db.jobs.get(job_id=job_id)).state == model.JobState.SUCCEEDED
    assert len(receiver.seen) == 1


async def test_every_launch_ends_with_an_outcome_however_it_ends(receiver: Receiver) -> None:
    """Cancelled before its request began, or with a Retry-After no parser foresaw (a
    non-ASCII digit), an attempt still ends, and its slot is free again."""
    receiver.answers["/odd"] = reply(503, **{"Retry-After": "²"})
    async with executor() as ex:
        events = ex.events()
        await ex.launch(launches.make_launch("http", "corral-1-1", {"url": receiver.url("/odd")}))
        odd = await asyncio.wait_for(anext(events), PATIENCE)
        await ex.launch(
            launches.make_launch("http", "corral-2-1", {"url": receiver.url("/x")}, job_id=2)
        )
        await ex.cancel("corral-2-1", timedelta(seconds=1))  # before its task ran at all
        cancelled = await asyncio.wait_for(anext(events), PATIENCE)
        assert ex._slots._value == 4  # every slot free again
    assert (odd.phase, odd.retry_after) == (launching.Phase.FAILED, None)
    assert (cancelled.name, cancelled.phase, cancelled.reason) == (
        "corral-2-1",
        launching.Phase.FAILED,
        "cancelled",
    )


@pytest.mark.parametrize(
    "headers",
    [
        {"webhook-id": "m", "webhook-timestamp": "1", "webhook-signature": "nocomma"},
        {"webhook-id": "m", "webhook-timestamp": "1", "webhook-signature": "v1,***"},
        {},
    ],
)
def test_verify_signature_refuses_malformed_headers_with_its_own_error(
    headers: dict[str, str],
) -> None:
    secret = "whsec_" + base64.b64encode(b"k" * 32).decode()
    with pytest.raises(errors.SignatureInvalid):
        verify_signature(b"{}", headers, secret)


async def test_the_run_log_keeps_the_request_and_the_response_without_their_secrets(
    receiver: Receiver,
) -> None:
    """The request line, its headers and JSON body (a credential, a signature, a token in
    the query, a password in the body redacted); the response's redirects (a token in
    the Location redacted), status line, headers (its cookie redacted) and the first
    body_bytes of its body, marked cut."""
    receiver.answers["/moved"] = reply(302, Location="/final?access_token=tok-456")
    receiver.answers["/final"] = reply(200, "x" * 100, **{"Set-Cookie": "sid=abc123"})
    spec = {
        "method": "POST",
        "url": receiver.url("/moved?token=tok-123&page=2"),
        "headers": {"Authorization": "Bearer sk-live-123", "X-Team": "data"},
        "json": {"rows": 3, "password": "hunter2"},
    }
    ex = http.HttpExecutor(
        clock=clock.SystemClock(),
        timeout=timedelta(seconds=10),
        concurrency=4,
        allow_networks=LOCAL,
        body_bytes=60,
    )
    secret = "whsec_" + base64.b64encode(b"k" * 32).decode()

    async def keys(tenant: str) -> list[str]:
        return [secret]

    ex.use_signing_keys(keys)
    await ex.start()
    try:
        obs = await outcome(ex, spec)
    finally:
        await ex.close()
    assert obs.output is not None
    request, response = obs.output.streams
    everything = request.text + response.text
    for leak in ("sk-live-123", "tok-123", "tok-456", "abc123", "hunter2", "v1,"):
        assert leak not in everything
    lines = request.text.splitlines()
    assert lines[0] == f"POST {receiver.url('/moved?token=[redacted]&page=2')}"
    assert "Authorization: [redacted]" in lines
    assert "webhook-signature: [redacted]" in lines
    assert "X-Team: data" in lines
    assert "Accept-Encoding: identity" in lines
    assert lines[-1] == '{"rows": 3, "password": "[redacted]"}'
    head, _, body = response.text.partition("\n\n")
    hop, status, *headers = head.splitlines()
    assert hop == f"HTTP 302 Found -> {receiver.url('/final?access_token=[redacted]')}"
    assert status == "HTTP 200 OK"
    assert "set-cookie: [redacted]" in headers
    assert (body, response.cut) == ("x" * 60, True)
    assert obs.output.status == 200


async def test_binary_output_is_kept_without_its_nul_bytes(db: store.Store) -> None:
    """PostgreSQL's JSON cannot hold a NUL: a response or a process that prints one must
    still have its end written, the NUL replaced."""
    frozen = FrozenClock()
    await db.jobs.submit(new=[model.NewJob(executor="noop", spec={})], now=frozen.now())
    [c] = await db.jobs.claim(now=frozen.now(), limit=1, executors=["noop"])
    binary = launching.RunLog(streams=(launching.Stream("stdout", "a\x00b", 3),))
    done = store.Finish(c.attempt.id, model.AttemptState.SUCCEEDED, 0, None, output=binary)
    await db.attempts.settle(launched=[], finishes=[done], now=frozen.now())
    [kept] = (await db.runlogs.of_job(job_id=c.job.id)).values()
    assert kept.streams[0].text == "a\ufffdb"


async def test_an_unforeseen_error_still_ends_the_attempt_and_frees_its_slot(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(launch: launching.Launch, spec: Any) -> dict[str, str]:
        raise RuntimeError("a bug")

    monkeypatch.setattr(http_request, "request_headers", broken)
    async with executor() as ex:
        obs = await outcome(ex, {"url": receiver.url("/x")})
        assert ex._slots._value == 4
    assert (obs.phase, obs.reason) == (launching.Phase.FAILED, "RuntimeError: a bug")
    assert obs.failure_class is model.FailureClass.TRANSIENT
    assert receiver.seen == []


async def test_a_drain_that_fails_does_not_keep_the_dispatcher_from_stopping(
    db: store.Store, receiver: Receiver, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """The attempt it could not drain stays running in the store, for recovery to call
    lost: never sent again under its name."""
    arrived, released = asyncio.Event(), asyncio.Event()

    async def held(request: web.Request) -> web.StreamResponse:
        arrived.set()
        await released.wait()  # no answer while the dispatcher stops
        return web.Response(text="too late")

    receiver.answers["/held"] = held
    settings = local_settings()
    wall = clock.SystemClock()
    ex = http.build(settings, wall)

    async def broken() -> list[launching.Observation]:
        raise RuntimeError("drain broke")

    monkeypatch.setattr(ex, "drain", broken)
    await ex.start()
    [(job_id, _)] = await db.jobs.submit(
        new=[model.NewJob(executor="http", spec={"url": receiver.url("/held")})], now=wall.now()
    )
    d = dispatcher.Dispatcher(store=db, executors={"http": ex}, clock=wall, settings=settings)
    stop = asyncio.Event()
    running = asyncio.create_task(d.run(stop))
    try:
        await asyncio.wait_for(arrived.wait(), PATIENCE)
        stop.set()
        await asyncio.wait_for(running, PATIENCE)
    finally:
        await ex.close()
        released.set()
    [attempt] = await db.attempts.list(job_id=job_id)
    assert attempt.state == model.AttemptState.RUNNING
    assert "http: could not drain: drain broke" in caplog.text


def test_a_literal_address_the_guard_refuses_is_refused_at_submit() -> None:
    check = http.SpecCheck(config.Settings())
    for url in ("http://169.254.169.254/latest", "http://10.0.0.1/x", "http://[::1]:8080/"):
        with pytest.raises(errors.InvalidInput, match=r"^http spec: url: .*could never be sent"):
            check.validate_spec({"method": "POST", "url": url})
    assert check.validate_spec({"url": "http://metadata.internal/x"})  # a name: when sent
    assert check.validate_spec({"url": "https://93.184.216.34/x"})
    opened = http.SpecCheck(
        config.Settings(executors={"http": {"allow_networks": ["10.0.0.0/8"]}})  # type: ignore[arg-type]
    )
    assert opened.validate_spec({"url": "https://10.0.0.1/x"})
    with pytest.raises(errors.InvalidInput, match="port 5432 is not opened"):
        opened.validate_spec({"url": "http://10.0.0.1:5432/x"})


def test_a_request_body_is_capped_at_submit() -> None:
    check = http.SpecCheck(config.Settings())
    fits = "x" * (256 * 1024)
    assert check.validate_spec({"method": "POST", "url": "https://a.example/", "body": fits})
    for name, big in (("body", fits + "x"), ("json", {"data": fits})):
        with pytest.raises(errors.InvalidInput, match=rf"^http spec: {name}: is 262,1\d\d bytes"):
            check.validate_spec({"method": "POST", "url": "https://a.example/", name: big})
    small = http.SpecCheck(
        config.Settings(executors={"http": {"max_request_body_bytes": 10}})  # type: ignore[arg-type]
    )
    with pytest.raises(errors.InvalidInput, match="max_request_body_bytes"):
        small.validate_spec({"method": "POST", "url": "https://a.example/", "body": "x" * 11})
