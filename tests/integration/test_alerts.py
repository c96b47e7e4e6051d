"""Alerts end to end against real servers on 127.0.0.1: an SMTP server (aiosmtpd), a
stand-in for Slack that checks the Block Kit shape, and a webhook receiver that verifies
the signature with the Standard Webhooks library."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiohttp import web

from corral import alert_settings, alerts, config, model, scheduling, store, timeouts
from corral.alerts import channels, rules
from corral.store import Finish
from corral.store.alert_reads import JobFacts
from corral.testing import FrozenClock
from tests.support.mail import Inbox
from tests.support.net import free_port, http_server

A, J = model.AttemptState, model.JobState
LOCAL = ["127.0.0.0/8:1024-65535"]
SECRET = "whsec_" + base64.b64encode(b"s" * 32).decode()


@dataclass
class Web:
    base: str = ""
    seen: list[dict[str, Any]] = field(default_factory=list)


@pytest.fixture
async def web_receiver() -> AsyncIterator[Web]:
    got = Web()

    async def handle(request: web.Request) -> web.Response:
        got.seen.append(
            {"path": request.path, "headers": dict(request.headers), "body": await request.read()}
        )
        return web.Response(text="ok", status=400 if request.path == "/bad" else 200)

    async with http_server(handle) as base:
        got.base = base
        yield got


def settings(port: int, web_base: str, **rule: Any) -> config.Settings:
    return config.Settings(
        executors={"http": {"allow_networks": LOCAL}},  # type: ignore[arg-type]
        alerts={  # type: ignore[arg-type]
            "base_url": "https://corral.example.com",
            "channels": {
                "ops_mail": {
                    "kind": "email",
                    "smtp_url": f"smtp://127.0.0.1:{port}",
                    "from": "corral@example.com",
                    "to": ["ops@example.com"],
                },
                "team_slack": {"kind": "slack", "webhook_url": f"{web_base}/slack"},
                "hook": {"kind": "webhook", "url": f"{web_base}/hook", "secret": SECRET},
            },
            "rules": {
                "poison": {
                    "on": ["quarantined", "failed"],
                    "match": {"queue": "billing"},
                    "channels": ["ops_mail", "team_slack", "hook"],
                    "throttle": "10m",
                    **rule,
                }
            },
        },
    )


@contextlib.asynccontextmanager
async def serving(tmp_path: Any, alerting: dict[str, Any]) -> AsyncIterator[config.Settings]:
    """A real `corral serve` (its loops in this process) with these alert settings, on
    a fresh SQLite file, with short loop intervals; stopped and cleaned up after."""
    from corral import runtime
    from tests.support.procs import kill_leftovers
    from tests.support.wait import PATIENCE

    url = f"sqlite:///{tmp_path}/corral.db"
    s = config.Settings(
        database_url=url,
        state_dir=tmp_path / "state",
        executors={"http": {"allow_networks": LOCAL}},  # type: ignore[arg-type]
        timeouts=timeouts.Timeouts(
            margin="500ms",
            tick_margin="50ms",
            dispatch_interval="200ms",
            observe_interval="200ms",
            reconcile_interval="300ms",
            launch_grace="2s",
        ),
        alerts=alerting,  # type: ignore[arg-type]
    )
    db = store.Store.connect(url)
    await db.database.migrate()
    await db.close()
    stop = asyncio.Event()
    loops = asyncio.create_task(runtime.serve(s, stop))
    try:
        yield s
    finally:
        stop.set()
        await asyncio.wait_for(loops, PATIENCE)
        kill_leftovers(s.process_root)


async def listening(db: store.Store) -> None:
    """An alerter's cursor from the start, as if it had run since the store was made: a
    new one starts after the newest event."""
    await db.alerts.write(
        name="alerter", read_from=0, read_to=0, messages=[], digested=[], now=FrozenClock().now()
    )


def firing(schedule: str | None, clock: FrozenClock) -> Any:
    """The payload of a firing's job of `schedule` (None: no firing's, a one-off job)."""
    if schedule is None:
        return None
    return scheduling.firing_payload(
        None, schedule=schedule, nominal=clock.now(), interval_end=clock.now()
    )


async def quarantine(
    db: store.Store,
    clock: FrozenClock,
    queue: str = "billing",
    tenant: str = "default",
    *,
    schedule: str | None = None,
) -> int:
    """A job of `queue` (of `tenant`, a firing's of `schedule` when given) that fails
    permanently: quarantined at once."""
    job = model.NewJob(
        executor="noop", spec={}, queue=queue, tenant=tenant, payload=firing(schedule, clock)
    )
    [(job_id, _)] = await db.jobs.submit(new=[job], now=clock.now())
    [c] = await db.jobs.claim(now=clock.now(), limit=1, executors=["noop"])
    failed = Finish(c.attempt.id, A.FAILED, 2, "exited with code 2", model.FailureClass.PERMANENT)
    await db.attempts.finish(finishes=[failed], now=clock.now())
    return job_id


async def succeed(
    db: store.Store,
    clock: FrozenClock,
    queue: str = "billing",
    *,
    schedule: str | None = None,
    tenant: str = "default",
) -> int:
    job = model.NewJob(
        executor="noop", spec={}, queue=queue, tenant=tenant, payload=firing(schedule, clock)
    )
    [(job_id, _)] = await db.jobs.submit(new=[job], now=clock.now())
    [c] = await db.jobs.claim(now=clock.now(), limit=1, executors=["noop"])
    await db.attempts.finish(finishes=[Finish(c.attempt.id, A.SUCCEEDED, 0, None)], now=clock.now())
    return job_id


async def test_a_quarantine_reaches_email_slack_and_a_signed_webhook(
    db: store.Store, smtp: tuple[Inbox, int], web_receiver: Web
) -> None:
    inbox, port = smtp
    clock = FrozenClock(datetime.now(UTC))  # the receiver's library checks the timestamp
    await listening(db)
    job_id = await quarantine(db, clock)
    await quarantine(db, clock, queue="other")  # matches no rule
    alerter = alerts.Alerter(store=db, clock=clock, settings=settings(port, web_receiver.base))
    try:
        assert await alerter.read_once() > 0
        await alerter.deliver_all()
    finally:
        await alerter.close()

    [mail] = inbox.messages
    assert mail["Subject"] == f"[corral] quarantined: job {job_id} of tenant default"
    assert mail["To"] == "ops@example.com"
    body = mail.get_content()
    assert f"Job: https://corral.example.com/ui/jobs/{job_id}" in body
    key = f"poison|job:default/{job_id}|quarantined|event:"
    assert key in body
    assert mail["Message-ID"].endswith("@corral>")

    by_path = {s["path"]: s for s in web_receiver.seen}
    slack = json.loads(by_path["/slack"]["body"])
    assert slack["text"].startswith(
        f"[corral] quarantined: job {job_id} of tenant default (poison|"
    )
    kinds = [b["type"] for b in slack["blocks"]]
    assert kinds == ["header", "section", "section", "context"]
    assert f"https://corral.example.com/ui/jobs/{job_id}" in slack["blocks"][2]["text"]["text"]

    from standardwebhooks.webhooks import Webhook

    hook = by_path["/hook"]
    sent = Webhook(SECRET).verify(hook["body"].decode(), hook["headers"])
    assert (sent["type"], sent["job_id"], sent["cause"]) == (
        "corral.alert.alert",
        job_id,
        "quarantined",
    )
    assert hook["headers"]["webhook-id"] == sent["key"]

    history = await db.alerts.list()
    assert {(a.channel, a.state, a.tries) for a in history} == {
        ("ops_mail", "delivered", 1),
        ("team_slack", "delivered", 1),
        ("hook", "delivered", 1),
    }


async def test_a_flapping_schedule_alerts_once_digests_the_rest_and_recovers_once(
    db: store.Store, smtp: tuple[Inbox, int], web_receiver: Web
) -> None:
    """One schedule's jobs failing again and again: one message, the rest in the window's
    digest, and one recovered message at its next success."""
    inbox, port = smtp
    clock = FrozenClock()
    await listening(db)
    s = settings(port, web_receiver.base, channels=["ops_mail"])
    alerter = alerts.Alerter(store=db, clock=clock, settings=s)
    try:
        first = await quarantine(db, clock, schedule="nightly")
        clock.advance(60)
        more = [await quarantine(db, clock, schedule="nightly") for _ in range(12)]
        await alerter.read_once()
        await alerter.deliver_all()
        assert [m["Subject"] for m in inbox.messages] == [
            f"[corral] quarantined: schedule nightly of tenant default (job {first})"
        ]
        clock.advance(600)  # the window ends: its digest is due
        await alerter.deliver_all()
        digest = inbox.messages[1]
        assert (
            digest["Subject"]
            .strip()
            .startswith("[corral] 12 more quarantined in schedule nightly of tenant default since ")
        )
        assert ", ".join(f"job {j}" for j in more[:10]) + " and 2 more" in digest.get_content()
        done = await succeed(db, clock, schedule="nightly")
        await succeed(db, clock, schedule="nightly")  # a second success says nothing more
        await alerter.read_once()
        await alerter.deliver_all()
    finally:
        await alerter.close()
    assert [m["Subject"].strip() for m in inbox.messages[2:]] == [
        f"[corral] recovered: schedule nightly of tenant default (job {done} succeeded)"
    ]


async def test_each_tenant_s_schedule_is_its_own_subject_and_its_digests_its_own(
    db: store.Store, smtp: tuple[Inbox, int], web_receiver: Web
) -> None:
    """Two tenants' schedules of one name are two subjects: tenant a's failures open no
    window that folds tenant b's quarantine into a digest, and each tenant's alert list
    shows its own messages and digests, never the other's."""
    inbox, port = smtp
    clock = FrozenClock()
    await listening(db)
    s = settings(port, web_receiver.base, channels=["ops_mail"])
    alerter = alerts.Alerter(store=db, clock=clock, settings=s)
    try:
        first_a = await quarantine(db, clock, tenant="a", schedule="nightly")
        more_a = await quarantine(db, clock, tenant="a", schedule="nightly")
        first_b = await quarantine(db, clock, tenant="b", schedule="nightly")
        await alerter.read_once()
        await alerter.deliver_all()
        assert sorted(m["Subject"] for m in inbox.messages) == sorted(
            [
                f"[corral] quarantined: schedule nightly of tenant a (job {first_a})",
                f"[corral] quarantined: schedule nightly of tenant b (job {first_b})",
            ]
        )
        clock.advance(600)
        await alerter.deliver_all()
    finally:
        await alerter.close()
    listed = {t: await db.alerts.list(limit=50, tenant=t) for t in ("a", "b")}
    assert {(a.kind, a.subject) for a in listed["a"]} == {
        ("alert", "schedule:a/nightly"),
        ("digest", "tenant:a"),
    }
    [digest] = [a for a in listed["a"] if a.kind == "digest"]
    assert (digest.details["jobs"], digest.details["subjects"]) == (
        [more_a],
        ["schedule:a/nightly"],
    )
    assert {(a.kind, a.subject) for a in listed["b"]} == {("alert", "schedule:b/nightly")}


async def test_a_crash_before_delivery_delivers_after_and_never_writes_twice(
    db: store.Store, smtp: tuple[Inbox, int], web_receiver: Web
) -> None:
    """The outbox rows are written with the cursor's move: read again from the same
    cursor (as after a crash), the events make no second row; the row written is still
    pending and goes at the next delivery."""
    inbox, port = smtp
    clock = FrozenClock()
    await listening(db)
    s = settings(port, web_receiver.base, channels=["ops_mail"])
    await quarantine(db, clock)
    first = alerts.Alerter(store=db, clock=clock, settings=s)
    await first.read_once()  # ... and dies before delivering
    again = alerts.Alerter(store=db, clock=clock, settings=s)
    assert await again.read_once() == 0  # the cursor moved: nothing read twice
    cursor = await db.alerts.cursor(name="alerter")
    events = (await db.alerts.events(after=0, limit=100)).ids
    stale = await db.alerts.write(  # a reader that read before the move: refused
        name="alerter", read_from=0, read_to=cursor, messages=[], digested=[], now=clock.now()
    )
    assert (stale, len(events) > 0) == (False, True)
    await again.deliver_all()
    await again.close()
    await first.close()
    assert len(inbox.messages) == 1


async def test_a_channel_that_fails_is_tried_again_with_backoff_then_given_up(
    db: store.Store, web_receiver: Web
) -> None:
    clock = FrozenClock()
    await listening(db)
    dead_port = free_port()  # nothing listens
    s = settings(dead_port, web_receiver.base, channels=["ops_mail"])
    await quarantine(db, clock)
    alerter = alerts.Alerter(store=db, clock=clock, settings=s)
    try:
        await alerter.read_once()
        for _ in range(alerts.TRIES):
            await alerter.deliver_all()
            clock.advance(alerts.BACKOFF[1])
    finally:
        await alerter.close()
    [a] = await db.alerts.list()
    assert (a.state, a.tries) == ("failed", alerts.TRIES)
    tries = (await db.alerts.tries(alert_ids=[a.id]))[a.id]
    assert len(tries) == alerts.TRIES
    assert not any(ok for _, ok, _ in tries)
    assert (a.last_error or "").startswith("SMTPConnectError: Error connecting to 127.0.0.1")


async def test_a_muted_rule_says_nothing(db: store.Store, web_receiver: Web) -> None:
    clock = FrozenClock()
    await listening(db)
    s = settings(free_port(), web_receiver.base, channels=["hook"])
    await db.alerts.mute(rule="poison", until=clock.now() + timedelta(hours=2), now=clock.now())
    await quarantine(db, clock)
    alerter = alerts.Alerter(store=db, clock=clock, settings=s)
    await alerter.read_once()
    await alerter.close()
    assert await db.alerts.list() == []


def test_rules_match_on_every_key_given() -> None:
    rule = alert_settings.AlertRule(
        on=("failed",),
        match={"queue": "q", "labels": {"team": "data"}},
        channels=("c",),  # type: ignore[arg-type]
    )
    base = rules.Happening(
        event_id=1,
        at=FrozenClock().now(),
        cause="failed",
        job_id=1,
        queue="q",
        tenant="default",
        executor="process",
        labels={"team": "data", "x": "y"},
        schedule=None,
        reason="r",
    )
    assert rules.matches(rule, base)
    assert not rules.matches(rule, rules.Happening(**{**_fields(base), "queue": "other"}))
    assert not rules.matches(rule, rules.Happening(**{**_fields(base), "labels": {}}))


def _fields(h: rules.Happening) -> dict[str, Any]:
    return {name: getattr(h, name) for name in h.__slots__}  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("alerts_settings", "message"),
    [
        (
            {"rules": {"r": {"on": ["failed"], "channels": ["nope"]}}},
            "rules.r.channels: unknown channel 'nope'",
        ),
        (
            {
                "channels": {
                    "m": {"kind": "email", "smtp_url": "smtp://h", "from": "x", "to": ["a@b.c"]}
                }
            },
            "'x' is not an e-mail address",
        ),
        (
            {"channels": {"s": {"kind": "slack", "webhook_url": "hooks.slack.com/x"}}},
            "alerts.channels.s.slack.webhook_url: must be an http:// or https:// URL",
        ),
        (
            {
                "channels": {"s": {"kind": "slack", "webhook_url": "https://h/x"}},
                "rules": {"r": {"on": ["failed"], "channels": ["s"], "after": 0}},
            },
            "alerts.rules.r.after",
        ),
        (
            {
                "channels": {"s": {"kind": "slack", "webhook_url": "https://h/x"}},
                "rules": {"r": {"on": ["exploded"], "channels": ["s"]}},
            },
            "alerts.rules.r.on.0",
        ),
    ],
)
def test_bad_alert_settings_are_refused_naming_the_key(
    alerts_settings: dict[str, Any], message: str
) -> None:
    from corral import errors

    with pytest.raises(errors.ConfigError) as caught:
        config.Settings.load(alerts=alerts_settings)
    assert message in str(caught.value)


def test_a_message_s_words_name_what_happened() -> None:
    a = alerts.store.alerts.Alert(  # type: ignore[attr-defined]
        id=1,
        dedupe_key="poison|job:default/42|quarantined|event:9|c",
        rule="poison",
        channel="c",
        kind="alert",
        cause="quarantined",
        subject="job:default/42",
        job_id=42,
        details={
            "queue": "billing",
            "tenant": "default",
            "executor": "http",
            "failure_class": "permanent",
            "reason": "HTTP 404",
            "at": "2026-12-03T10:00:00+00:00",
        },
        state="pending",
        created_at=FrozenClock().now(),
        due_at=FrozenClock().now(),
        tries=0,
        last_error=None,
        delivered_at=None,
    )
    said = channels.render(a)
    assert said.title == "[corral] quarantined: job 42 of tenant default"
    assert "Last attempt: permanent: HTTP 404" in said.lines
    assert said.link is None
    older = dataclasses.replace(a, subject="queue:billing")  # an older corral's, in history
    assert (
        channels.render(older).title
        == "[corral] quarantined: queue billing of tenant default (job 42)"
    )
    reason = "schedule 'nightly': 1 nominal time(s) from ... did not run: not granted 'argo'"
    refused = dataclasses.replace(
        a,
        cause="refused",
        subject="schedule:b/nightly",
        job_id=None,
        details={"reason": reason, "at": "2026-12-03T10:00:00+00:00"},
    )
    said = channels.render(refused)
    assert said.title == "[corral] schedule nightly of tenant b: nominal times were refused"
    assert said.lines == (
        f"Rule poison: {reason}",
        "Tenant: b",
        "Subject: schedule nightly",
        "At: 2026-12-03 10:00:00 UTC",
    )


async def test_serve_alerts_through_its_own_alerter_and_pings_the_heartbeat(
    tmp_path: Any, web_receiver: Web
) -> None:
    """`corral serve` runs the alerter beside its loops: a job quarantined by its rule
    reaches the webhook; every reconciler pass pings alerts.heartbeat_url."""
    from corral import runtime
    from tests.support.wait import eventually

    alerting = {
        "heartbeat_url": f"{web_receiver.base}/alive",
        "channels": {"hook": {"kind": "webhook", "url": f"{web_receiver.base}/hook"}},
        "rules": {"all": {"on": ["quarantined"], "channels": ["hook"]}},
    }
    fail_for_good = {
        "failure_rules": [{"on_exit_codes": {"operator": "In", "values": [3]}, "action": "fail"}]
    }
    async with serving(tmp_path, alerting) as s, runtime.connect(s, platforms=False) as c:
        job_id, _ = await c.submit(spec={"command": ["sh", "-c", "exit 3"]}, policy=fail_for_good)

        def hooked() -> list[dict[str, Any]]:
            return [json.loads(x["body"]) for x in web_receiver.seen if x["path"] == "/hook"]

        [sent] = await eventually(hooked, what="the alert at the webhook")
        assert (sent["cause"], sent["job_id"]) == ("quarantined", job_id)
        await eventually(
            lambda: [x for x in web_receiver.seen if x["path"] == "/alive"],
            what="a heartbeat ping",
        )


async def test_alerters_reading_at_once_write_each_message_once(
    db: store.Store, web_receiver: Web
) -> None:
    """Any number of alerters may run: the cursor's compare-and-set lets one of two that
    read the same events write their messages."""
    clock = FrozenClock()
    await listening(db)
    s = settings(free_port(), web_receiver.base, channels=["hook"], throttle="1ms")
    for _ in range(20):
        await quarantine(db, clock)
        clock.advance(1)
    readers = [alerts.Alerter(store=db, clock=clock, settings=s) for _ in range(4)]
    for _ in range(3):
        await asyncio.gather(*(r.read_once() for r in readers))
    for r in readers:
        await r.close()
    made = await db.alerts.list(limit=100)
    assert len(made) == 20
    assert len({a.dedupe_key for a in made}) == 20


async def test_consecutive_failures_alert_from_the_after_th_in_a_row_and_a_success_resets(
    db: store.Store, web_receiver: Web
) -> None:
    clock = FrozenClock()
    await listening(db)
    s = settings(
        free_port(),
        web_receiver.base,
        on=["consecutive_failures"],
        after=3,
        channels=["hook"],
        throttle="1ms",
    )
    alerter = alerts.Alerter(store=db, clock=clock, settings=s)
    try:
        for _ in range(2):
            await quarantine(db, clock, schedule="nightly")
            clock.advance(1)
        await alerter.read_once()  # two in a row: nothing yet (the count is kept)
        assert await db.alerts.list() == []
        third = await quarantine(db, clock, schedule="nightly")
        clock.advance(1)
        await alerter.read_once()
        await succeed(db, clock, schedule="nightly")  # resets the count, and recovers the subject
        clock.advance(1)
        for _ in range(2):
            await quarantine(db, clock, schedule="nightly")
            clock.advance(1)
        await alerter.read_once()
    finally:
        await alerter.close()
    made = sorted(await db.alerts.list(), key=lambda a: a.id)
    assert [(a.kind, a.cause, a.job_id) for a in made] == [
        ("alert", "consecutive_failures", third),
        ("recovered", "succeeded", third + 1),
    ]
    said = channels.render(made[0])
    title = f"[corral] 3 failures in a row in schedule nightly of tenant default (job {third})"
    assert said.title == title


async def test_a_window_read_over_several_passes_has_one_digest(
    db: store.Store, web_receiver: Web
) -> None:
    clock = FrozenClock()
    await listening(db)
    s = settings(free_port(), web_receiver.base, channels=["hook"])
    alerter = alerts.Alerter(store=db, clock=clock, settings=s)
    try:
        for _ in range(2):  # the first opens the window; the second is in its digest
            await quarantine(db, clock, schedule="nightly")
        clock.advance(5)  # read a little after
        await alerter.read_once()
        for _ in range(2):  # each pass later, inside the window
            await quarantine(db, clock, schedule="nightly")
            clock.advance(5)
            await alerter.read_once()
    finally:
        await alerter.close()
    digests = [a for a in await db.alerts.list() if a.kind == "digest"]
    assert [(d.details["count"], len(d.details["jobs"])) for d in digests] == [(3, 3)]


async def test_an_sla_missed_with_no_failure_alerts_and_one_met_does_not(
    db: store.Store, web_receiver: Web
) -> None:
    from corral import reconciler
    from tests.support.platform import Platform

    clock = FrozenClock()
    await listening(db)
    sla = {"sla": 60.0}
    [(late, _), (met, _)] = await db.jobs.submit(
        new=[
            model.NewJob(executor="noop", spec={}, queue="billing", policy=sla),
            model.NewJob(executor="noop", spec={}, queue="billing", policy=sla),
        ],
        now=clock.now(),
    )
    claimed = await db.jobs.claim(now=clock.now(), limit=2, executors=["noop"])
    done = next(c for c in claimed if c.job.id == met)
    await db.attempts.finish(
        finishes=[Finish(done.attempt.id, A.SUCCEEDED, 0, None)], now=clock.now()
    )
    s = settings(free_port(), web_receiver.base, on=["sla_missed"], channels=["hook"])
    r = reconciler.Reconciler(store=db, executors={"noop": Platform()}, clock=clock, settings=s)
    assert (await r.run_once()).slas_missed == 0  # not due yet
    clock.advance(61)
    assert (await r.run_once()).slas_missed == 1
    assert (await r.run_once()).slas_missed == 0  # noted once
    alerter = alerts.Alerter(store=db, clock=clock, settings=s)
    try:
        await alerter.read_once()
    finally:
        await alerter.close()
    [a] = await db.alerts.list()
    assert (a.cause, a.job_id) == ("sla_missed", late)
    note = (await db.events.list(job_id=late))[-1]
    assert note.reason.startswith("SLA missed: not succeeded by ")
    assert (await db.jobs.get(job_id=late)).state == J.RUNNING  # a note, not a change


async def test_a_firing_s_sla_counts_from_its_nominal_time(db: store.Store) -> None:
    clock = FrozenClock()
    await listening(db)
    nominal = clock.now() - timedelta(seconds=100)  # fired late, e.g. caught up
    payload = scheduling.firing_payload(
        None, schedule="nightly", nominal=nominal, interval_end=clock.now()
    )
    await db.jobs.submit(
        new=[model.NewJob(executor="noop", spec={}, payload=payload, policy={"sla": 60.0})],
        now=clock.now(),
    )
    assert await db.alerts.sla_check(now=clock.now()) == 1  # due at nominal + 60s: passed


async def test_a_new_alerter_starts_after_the_newest_event_not_with_the_history(
    db: store.Store, web_receiver: Web
) -> None:
    clock = FrozenClock()
    for _ in range(3):
        await quarantine(db, clock)
    s = settings(free_port(), web_receiver.base, channels=["hook"])
    alerter = alerts.Alerter(store=db, clock=clock, settings=s)
    try:
        assert await alerter.read_once() == 0  # placed after the newest event
        now = await quarantine(db, clock, queue="billing")
        assert await alerter.read_once() > 0
    finally:
        await alerter.close()
    assert [a.job_id for a in await db.alerts.list()] == [now]


async def test_two_alerters_delivering_at_once_send_each_message_once(
    db: store.Store, web_receiver: Web
) -> None:
    clock = FrozenClock()
    await listening(db)
    s = settings(free_port(), web_receiver.base, channels=["hook"])
    for queue in ("a", "b", "c"):
        await quarantine(db, clock, queue=queue)
    s = settings(free_port(), web_receiver.base, channels=["hook"], match={"queue": None})
    both = [alerts.Alerter(store=db, clock=clock, settings=s) for _ in range(2)]
    try:
        await both[0].read_once()
        await asyncio.gather(*(a.deliver_all() for a in both))
        await asyncio.gather(*(a.deliver_all() for a in both))
    finally:
        for a in both:
            await a.close()
    keys = [json.loads(x["body"])["key"] for x in web_receiver.seen]
    assert len(keys) == 3
    assert len(set(keys)) == 3


async def test_what_fails_after_its_window_s_digest_went_is_a_digest_of_its_own(
    db: store.Store, web_receiver: Web
) -> None:
    clock = FrozenClock()
    await listening(db)
    s = settings(free_port(), web_receiver.base, channels=["hook"])
    alerter = alerts.Alerter(store=db, clock=clock, settings=s)
    try:
        await quarantine(db, clock, schedule="nightly")
        clock.advance(60)
        await quarantine(db, clock, schedule="nightly")
        await alerter.read_once()
        clock.advance(60)
        late = await quarantine(
            db, clock, schedule="nightly"
        )  # inside the window, but read only after...
        clock.advance(600)  # ... the window ended and its digest went
        await alerter.deliver_all()
        await alerter.read_once()
        await alerter.deliver_all()
    finally:
        await alerter.close()
    digests = sorted((a for a in await db.alerts.list() if a.kind == "digest"), key=lambda a: a.id)
    assert [(d.state, d.details["count"]) for d in digests] == [
        ("delivered", 1),
        ("delivered", 1),
    ]
    assert digests[1].details["jobs"] == [late]  # counted, not lost


async def test_two_reconcilers_note_a_missed_sla_once(db: store.Store) -> None:
    clock = FrozenClock()
    await db.jobs.submit(
        new=[model.NewJob(executor="noop", spec={}, policy={"sla": 1.0})], now=clock.now()
    )
    clock.advance(5)
    found = await asyncio.gather(*(db.alerts.sla_check(now=clock.now()) for _ in range(2)))
    assert sorted(found) == [0, 1]


async def test_sent_alerts_go_with_the_retention_and_their_subject_still_recovers(
    db: store.Store, web_receiver: Web
) -> None:
    clock = FrozenClock()
    await listening(db)
    s = settings(free_port(), web_receiver.base, channels=["hook"], throttle="1ms")
    alerter = alerts.Alerter(store=db, clock=clock, settings=s)
    try:
        for _ in range(3):
            await quarantine(db, clock, schedule="nightly")
            clock.advance(1)
            await alerter.read_once()
        await alerter.deliver_all()
    finally:
        await alerter.close()
    assert len(await db.alerts.list()) == 3
    clock.advance(3600)
    assert await db.alerts.forget(before=clock.now(), limit=100) == 3
    assert await db.alerts.list() == []
    done = await succeed(
        db, clock, schedule="nightly"
    )  # where the subject stands outlives its messages
    again = alerts.Alerter(store=db, clock=clock, settings=s)
    try:
        await again.read_once()
    finally:
        await again.close()
    [recovered] = await db.alerts.list()
    assert (recovered.kind, recovered.job_id) == ("recovered", done)


def test_a_note_is_no_state_change_to_the_rules_and_explain_skips_sla_notes() -> None:
    from corral import client

    at = FrozenClock().now()
    job = model.Job(  # type: ignore[call-arg]
        **{
            **{f: None for f in model.Job.__dataclass_fields__},
            "id": 1,
            "state": J.QUEUED,
            "queue": "q",
            "tenant": "default",
            "executor": "noop",
            "labels": {},
            "payload": None,
            "run_at": at,
            "attempt_count": 1,
            "max_attempts": 3,
        }
    )
    facts = JobFacts(id=1, queue="q", tenant="default", executor="noop", labels={}, schedule=None)
    lost_note = model.Event(1, 1, 5, "attempt", "lost", "lost", "orphan stopped", at, {})
    assert rules.happening(lost_note, facts) is None
    sla_note = model.Event(
        2, 1, None, "job", "queued", "queued", "SLA missed", at, {"sla": "missed"}
    )
    assert rules.happening(sla_note, facts).cause == "sla_missed"  # type: ignore[union-attr]
    budget = model.Event(
        1, 1, None, "job", "running", "queued", "retry: waits", at, {"budget": "empty"}
    )
    view = client.jobs.JobView(job, [], [budget, sla_note])
    assert client.explain.why(view, at - timedelta(seconds=1)).startswith("budget empty")


async def test_an_smtp_server_that_hangs_never_holds_up_the_jobs(
    tmp_path: Any, web_receiver: Web
) -> None:
    """The channel answers nothing (it accepts and stays silent) while 300 HTTP jobs
    run, a tenth of them answered 400 and quarantined, each a message of its own (every
    one in a queue of its own): all end; the alerter's tries time out on their own."""
    from corral import runtime
    from tests.support.wait import PATIENCE, eventually

    silent: list[asyncio.StreamWriter] = []

    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        silent.append(writer)  # never a greeting

    server = await asyncio.start_server(hang, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    alerting = {
        "channels": {
            "mail": {
                "kind": "email",
                "smtp_url": f"smtp://127.0.0.1:{port}",
                "from": "corral@example.com",
                "to": ["ops@example.com"],
                "timeout": "2s",
            }
        },
        "rules": {"all": {"on": ["quarantined"], "channels": ["mail"], "throttle": "1ms"}},
    }
    jobs = 300
    try:
        async with serving(tmp_path, alerting) as s, runtime.connect(s, platforms=False) as c:

            async def started() -> bool:
                return await c.store.alerts.cursor(name="alerter") is not None

            await eventually(started, what="the alerter's first pass")
            await c.submit_many(
                [
                    c.validate(
                        c.new_job(
                            executor="http",
                            spec={"url": f"{web_receiver.base}/{'bad' if n % 10 == 0 else 'ok'}"},
                            queue=f"q{n}" if n % 10 == 0 else "default",
                        )
                    )
                    for n in range(jobs)
                ]
            )

            async def all_ended() -> bool:
                counts = await c.store.jobs.count_by_state()
                return counts.get("succeeded", 0) + counts.get("quarantined", 0) == jobs

            await eventually(all_ended, within=4 * PATIENCE, what=f"all {jobs} jobs ended")

            async def timed_out() -> list[Any]:
                return [a for a in await c.store.alerts.list() if a.last_error]

            [first, *_] = await eventually(timed_out, what="a try that timed out")
            assert first.last_error == "no answer in 2s"
            counts = await c.store.jobs.count_by_state()
            assert (counts.get("succeeded"), counts.get("quarantined")) == (270, 30)
    finally:
        server.close()
        for w in silent:
            w.close()


async def test_the_alerter_reads_every_event_the_rules_can_use_and_skips_starts_and_submits(
    db: store.Store,
) -> None:
    """The alerter reads whole only the events that can make a message (a filter in SQL
    for speed): every event `rules.happening` makes something of is among them, on every
    combination of entity, states and details (a success when asked for its queue's or
    schedule's); a submission never is, nor a start unless a rule watches for late
    firings."""
    from sqlalchemy import insert

    from corral.store.tables import events

    clock = FrozenClock()
    nominal = clock.now() - timedelta(minutes=5)
    payload = scheduling.firing_payload(
        {"x": 1}, schedule="nightly", nominal=nominal, interval_end=clock.now()
    )
    [(job_id, _)] = await db.jobs.submit(
        new=[model.NewJob(executor="noop", spec={}, queue="billing", payload=payload)],
        now=clock.now(),
    )
    states = sorted({*J, *A, "missed", "overlap"})
    variants: list[dict[str, Any]] = [
        {},
        {"sla": "missed"},
        {"budget": "empty"},
        {"failure_class": "unknown"},
        {"schedule": "nightly", "tenant": "default", "queue": "billing"},
    ]
    rows = [
        {
            "job_id": 0 if entity == "schedule" else job_id,
            "attempt_id": None,
            "entity": entity,
            "from_state": frm,
            "to_state": to,
            "reason": "r",
            "at": clock.now(),
            "details": details,
        }
        for entity in ("job", "attempt", "schedule")
        for frm in [None, *states]
        for to in states
        for details in variants
    ]
    with db.database.engine.begin() as conn:
        conn.execute(insert(events), rows)
    facts = JobFacts(job_id, "billing", "default", "noop", {}, "nightly", nominal)
    for with_starts in (False, True):
        read = await db.alerts.events(after=0, limit=100_000, with_starts=with_starts)
        found = {e.id: (e, f) for e, f in read.found}
        all_events = [e for e in await db.events.list(job_id=job_id)] + [
            e for e, _ in read.found if e.job_id == 0
        ]
        successes = await db.alerts.successes(
            after=0, upto=read.ids[-1], subjects=["schedule:default/nightly"]
        )
        assert successes == await db.alerts.successes(
            after=0, upto=read.ids[-1], subjects=[f"job:default/{job_id}"]
        )
        assert (
            await db.alerts.successes(  # an older corral's subject: a queue's
                after=0, upto=read.ids[-1], subjects=["queue:billing"]
            )
            == []
        )
        found |= {e.id: (e, f) for e, f in successes}
        for event in all_events:
            h = rules.happening(event, facts if event.job_id else None)
            if h is not None and (with_starts or h.cause != rules.STARTED):
                assert event.id in found, (event, h)
        assert (
            await db.alerts.successes(after=0, upto=read.ids[-1], subjects=["job:default/0"]) == []
        )
        assert len(read.ids) == len(rows) + 1  # every id, to see gaps by
        assert all(f == facts for e, f in read.found if e.job_id == job_id)
        submits = [e for e, _ in read.found if e.entity == "job" and e.from_state is None]
        starts = [
            e
            for e, _ in read.found
            if e.entity == "job" and e.to_state == J.RUNNING and e.from_state != J.RUNNING
        ]
        assert (len(submits), len(starts) > 0) == (0, with_starts)


async def test_a_late_firing_and_missed_nominal_times_alert_on_the_schedule(
    db: store.Store, web_receiver: Web
) -> None:
    """schedule_late: a firing's job that starts more than `late_by` after its nominal
    time (one on time says nothing); schedule_missed: nominal times that passed while no
    scheduler ran. Both are about the schedule, and neither sends a recovered message."""
    from corral import client, scheduler
    from tests.support.noop import NoopExecutor

    clock = FrozenClock()
    await listening(db)
    s = settings(
        free_port(),
        web_receiver.base,
        on=["schedule_late", "schedule_missed", "failed"],
        match={"schedule": "nightly"},
        channels=["hook"],
        late_by="30s",
        throttle="1m",
    )
    c = client.Client(store=db, executors={"noop": NoopExecutor()}, settings=s, clock=clock)
    await c.schedule_create("nightly", every="2m", spec={}, executor="noop")
    fire = scheduler.Scheduler(store=db, clock=clock)
    alerter = alerts.Alerter(store=db, clock=clock, settings=s)

    async def start_and_end_after(seconds: float) -> int:
        await fire.pass_once()
        clock.advance(seconds)
        [claimed] = await db.jobs.claim(now=clock.now(), limit=1, executors=["noop"])
        ok = Finish(claimed.attempt.id, A.SUCCEEDED, 0, None)
        await db.attempts.finish(finishes=[ok], now=clock.now())
        return claimed.job.id

    try:
        await start_and_end_after(10)  # on time
        clock.advance(110)
        late = await start_and_end_after(45)
        clock.advance(75 + 10 * 60)  # nobody fired the next five nominal times
        await fire.pass_once()
        await alerter.read_once()
        await alerter.deliver_all()
        [claimed] = await db.jobs.claim(now=clock.now(), limit=1, executors=["noop"])
        ok = Finish(claimed.attempt.id, A.SUCCEEDED, 0, None)  # the latest, caught up
        await db.attempts.finish(finishes=[ok], now=clock.now())  # a success: nothing owed
        await alerter.read_once()
        await alerter.deliver_all()
    finally:
        await alerter.close()
    sent = [json.loads(w["body"]) for w in web_receiver.seen]
    assert [(m["cause"], m["subject"], m["job_id"]) for m in sent] == [
        ("schedule_late", "schedule:default/nightly", late),
        ("schedule_missed", "schedule:default/nightly", None),
    ]
    assert (
        sent[0]["title"]
        == f"[corral] schedule nightly of tenant default: a firing started 45s late (job {late})"
    )
    assert "5 nominal time(s) from" in sent[1]["details"]["reason"]
    assert all(m["type"] == "corral.alert.alert" for m in sent)  # no recovered message


async def test_a_schedule_s_news_goes_with_the_retention(db: store.Store) -> None:
    from corral import client, scheduler
    from tests.support.noop import NoopExecutor

    clock = FrozenClock()
    c = client.Client(
        store=db, executors={"noop": NoopExecutor()}, settings=config.Settings(), clock=clock
    )
    await c.schedule_create("nightly", every="1m", spec={}, executor="noop")
    clock.advance(5 * 60)
    await scheduler.Scheduler(store=db, clock=clock).pass_once()
    news = [e for e, _ in (await db.alerts.events(after=0, limit=1000)).found if e.job_id == 0]
    assert [(e.entity, e.to_state, e.details["count"]) for e in news] == [("schedule", "missed", 5)]
    clock.advance(3600)
    await db.runlogs.forget(before=clock.now() - timedelta(minutes=30), limit=100)
    read = await db.alerts.events(after=0, limit=1000)
    assert [e for e, _ in read.found if e.job_id == 0] == []


async def test_a_failure_and_a_success_read_in_one_pass_make_an_alert_and_a_recovery(
    db: store.Store, web_receiver: Web
) -> None:
    """The alerter passes over the successes of subjects that owe nothing; one whose
    failure comes earlier in the same pass is read."""
    clock = FrozenClock()
    await listening(db)
    s = settings(free_port(), web_receiver.base, channels=["hook"])
    await succeed(db, clock, schedule="nightly")  # nothing owed yet: passed over
    failed = await quarantine(db, clock, schedule="nightly")
    await succeed(db, clock, schedule="other")  # another schedule's: passed over
    done = await succeed(db, clock, schedule="nightly")
    alerter = alerts.Alerter(store=db, clock=clock, settings=s)
    try:
        assert await alerter.read_once() > 0
    finally:
        await alerter.close()
    made = [(a.kind, a.job_id) for a in reversed(await db.alerts.list())]
    assert made == [("alert", failed), ("recovered", done)]


async def test_a_message_whose_sender_died_goes_again_after_its_lease(
    db: store.Store, web_receiver: Web
) -> None:
    """A claimed message is no other alerter's to send until its lease (the channel's
    timeout and 30 s) runs out: then it goes, once."""
    clock = FrozenClock()
    await listening(db)
    s = settings(free_port(), web_receiver.base, channels=["hook"])
    await quarantine(db, clock)
    other = alerts.Alerter(store=db, clock=clock, settings=s)
    try:
        await other.read_once()
        # A sender claims it and dies before sending.
        [taken] = await db.alerts.claim(now=clock.now(), limit=10, lease=timedelta(seconds=60))
        await other.deliver_all()
        assert web_receiver.seen == []
        clock.advance(61)
        await other.deliver_all()
        await other.deliver_all()
    finally:
        await other.close()
    assert len(web_receiver.seen) == 1
    [sent] = await db.alerts.list()
    assert (sent.id, sent.state, sent.tries) == (taken.id, "delivered", 1)


async def test_the_alerter_waits_for_an_event_id_not_there_yet_then_goes_past_it(
    db: store.Store, web_receiver: Web
) -> None:
    """Event ids are handed out as transactions begin and seen as they commit: the
    alerter reads up to an id not there yet and waits for it, then, once no transaction
    that took it can still be alive, reads past it."""
    from sqlalchemy import insert

    from corral.store.tables import events

    clock = FrozenClock()
    await listening(db)
    s = settings(free_port(), web_receiver.base, channels=["hook"])
    failed = await quarantine(db, clock)
    newest = await db.alerts.event_newest()
    with db.database.engine.begin() as conn:  # as if the transaction holding newest + 1 still ran
        conn.execute(
            insert(events).values(
                id=newest + 2,
                job_id=failed,
                entity="job",
                from_state="quarantined",
                to_state="quarantined",
                reason="a note",
                at=clock.now(),
                details={},
            )
        )
    alerter = alerts.Alerter(store=db, clock=clock, settings=s)
    try:
        await alerter.read_once()
        assert await db.alerts.cursor(name="alerter") == newest
        assert len(await db.alerts.list()) == 1  # what came before the gap is read
        clock.advance(s.timeouts.database_transaction_timeout.total_seconds())
        await alerter.read_once()
        assert await db.alerts.cursor(name="alerter") == newest  # still within the wait
        clock.advance(2)
        await alerter.read_once()
        assert await db.alerts.cursor(name="alerter") == newest + 2
    finally:
        await alerter.close()


async def test_a_heartbeat_url_that_fails_is_logged_and_never_raises(
    web_receiver: Web, caplog: pytest.LogCaptureFixture
) -> None:
    """The dead man's switch pings without holding up the pass: a URL that refuses the
    connection, or answers an error, is a warning in the log."""
    closed = alerts.Heartbeat(f"http://127.0.0.1:{free_port()}/ping", seconds=5)
    answered = alerts.Heartbeat(f"{web_receiver.base}/ping")
    with caplog.at_level(logging.WARNING, logger="corral.alerts"):
        closed()
        answered()
        await closed.close()
        await answered.close()
    assert [w["path"] for w in web_receiver.seen] == ["/ping"]
    assert "heartbeat_url not reached: ConnectError" in caplog.text


async def test_on_sqlite_the_alerter_reads_beside_a_writer_without_waiting(
    tmp_path: Any,
) -> None:
    """The alerter's reads take no write lock: another process holding it (for up to
    the busy timeout, 30 s) does not hold them up, nor do they hold up its writes."""
    import sqlite3

    path = tmp_path / "corral.db"
    db = store.Store.connect(f"sqlite:///{path}")
    await db.database.migrate()
    await listening(db)
    clock = FrozenClock()
    await quarantine(db, clock)
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    try:
        got = await asyncio.wait_for(
            db.alerts.read(name="alerter", limit=100, now=clock.now()), timeout=10
        )
        assert (got.cursor, len(got.events.ids) > 0) == (0, True)
        sent = await asyncio.wait_for(db.alerts.sent(pairs=[("poison", "job:default/1")]), 10)
        assert sent == {("poison", "job:default/1"): (None, False, 0)}
    finally:
        writer.rollback()
        writer.close()
        await db.close()


async def test_every_link_of_an_alert_opens_a_dashboard_page(db: store.Store) -> None:
    """With base_url as the docs show it, each kind of message links to a page of the
    dashboard that exists: a job's, a schedule's, the jobs (a digest of several subjects),
    and an older corral's message about a queue to the queue's jobs."""
    from corral.store.alerts import Alert
    from tests.support.api import noop_client, over_http, sign_in

    c = noop_client(db)
    job_id, _ = await c.submit(executor="noop", spec={}, queue="billing")
    await c.schedule_create("nightly", every="1h", spec={}, executor="noop")
    await c.user_add("ada", password="correct horse", tenant=None, role="admin")
    now = datetime.now(UTC)

    def alert(
        kind: str, cause: str, subject: str, job: int | None, subjects: tuple[str, ...] = ()
    ) -> Alert:
        return Alert(
            id=1, dedupe_key="k", rule="r", channel="ch", kind=kind, cause=cause,
            subject=subject, job_id=job,
            details={"count": 2, "jobs": [job_id], "subjects": list(subjects)},
            state="pending", created_at=now, due_at=now, tries=0, last_error=None,
            delivered_at=None,
        )  # fmt: skip

    nightly = "schedule:default/nightly"
    made = [
        alert("alert", "quarantined", f"job:default/{job_id}", job_id),
        alert("recovered", "succeeded", f"key:default/k-{job_id}", job_id),
        alert("alert", "quarantined", nightly, job_id),
        alert("digest", "quarantined", "tenant:default", None, (nightly, f"job:default/{job_id}")),
        alert("digest", "quarantined", "tenant:default", None, (nightly,)),
        alert("alert", "schedule_missed", nightly, None),
        alert("alert", "quarantined", "queue:default/billing", None),
    ]
    async with over_http(c) as http:
        await sign_in(http, name="ada", password="correct horse")
        for message in made:
            link = channels.render(message, base_url="http://corral.test/").link
            assert link is not None
            assert link.startswith("http://corral.test/ui/"), link
            opened = await http.get(link)
            assert opened.status_code == 200, (link, opened.status_code)
    schedule_link = channels.render(made[2], base_url="http://corral.test").link
    assert schedule_link == "http://corral.test/ui/schedules/default/nightly"
    assert channels.render(alert("test", "test", "channel:ch", None), "http://x").link is None


async def test_a_failure_s_message_names_what_ran_and_how_its_attempt_ended(
    db: store.Store, smtp: tuple[Inbox, int], web_receiver: Web
) -> None:
    """The method and URL (redacted) or the command, and the newest attempt's number and
    error: what the person reading it needs to act."""
    inbox, port = smtp
    clock = FrozenClock()
    await listening(db)
    spec = {"method": "POST", "url": "https://ada:pw@hooks.example/ping?token=t0k&n=1"}
    [(job_id, _)] = await db.jobs.submit(
        new=[model.NewJob(executor="http", spec=spec, queue="billing", max_attempts=1)],
        now=clock.now(),
    )
    [c] = await db.jobs.claim(now=clock.now(), limit=1, executors=["http"])
    said = "HTTP 503 Service Unavailable: upstream down"
    failed = Finish(c.attempt.id, A.FAILED, None, said, model.FailureClass.PERMANENT)
    await db.attempts.finish(finishes=[failed], now=clock.now())
    alerter = alerts.Alerter(
        store=db, clock=clock, settings=settings(port, web_receiver.base, channels=["ops_mail"])
    )
    try:
        await alerter.read_once()
        await alerter.deliver_all()
    finally:
        await alerter.close()
    [mail] = inbox.messages
    body = mail.get_content()
    assert "Runs: POST https://[redacted]@hooks.example/ping?token=[redacted]&n=1" in body
    assert f"Attempt 1: {said}" in body
    assert "t0k" not in body
    assert ":pw@" not in body
    assert str(job_id) in mail["Subject"]
