"""Monitors through the API, on both databases: made, pinged at their ping URL (no token),
judged by the scheduler's pass, alerted through a tenant's channels (a real SMTP server and
a real receiver as Slack), kept within their tenant; and a corral stopped longer than a
monitor's period and grace that does not call it down when it starts again."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from corral import alerts, config, documents, errors, loops, monitoring, scheduler, store
from corral.clock import SystemClock
from corral.testing import FrozenClock
from tests.integration.test_alerts import Web, listening, web_receiver
from tests.support import crash
from tests.support.api import Api, over_http, serving
from tests.support.forms import forms_client, signed
from tests.support.mail import Inbox
from tests.support.wait import eventually

__all__ = ["web_receiver"]  # a fixture, used by name (smtp: the integration conftest's)

PUBLIC = "https://corral.example.com"
TOKENS = [
    ("a-op", "a", "operator"),
    ("a-view", "a", "viewer"),
    ("b-op", "b", "operator"),
    ("admin", None, "admin"),
]


def settings(**more: Any) -> config.Settings:
    return config.Settings(public_url=PUBLIC, **more)


@contextlib.asynccontextmanager
async def api(db: store.Store, s: config.Settings | None = None) -> AsyncIterator[Api]:
    clock = FrozenClock(datetime(2026, 12, 8, 12, 0, tzinfo=UTC))
    async with serving(db, TOKENS, settings=s or settings(), clock_=clock) as made:
        yield made


def key_of(monitor: dict[str, Any]) -> str:
    url = str(monitor["ping_url"])
    assert url.startswith(f"{PUBLIC}/ping/")
    return url.removeprefix(PUBLIC)


async def made(a: Api, **body: Any) -> dict[str, Any]:
    r = await a.http.post("/api/v1/monitors", json=body, headers=a.as_("a-op"))
    assert r.status_code == 201, r.text
    return dict(r.json())


async def test_a_monitor_is_made_pinged_and_shown_with_its_pings_and_history(
    db: store.Store,
) -> None:
    async with api(db) as a:
        m = await made(a, name="backup", period="1h", grace="5m")
        assert (m["state"], m["period"], m["grace"], m["tenant"]) == ("up", "1h", "5m", "a")
        path = key_of(m)
        clock: Any = a.c.clock
        agent = {"User-Agent": "cron/1"}
        assert (await a.http.post(f"{path}/start", headers=agent)).status_code == 200
        clock.advance(90)
        done = await a.http.post(path, content=b"x" * 20_000 + b"tail", headers=agent)
        assert (done.status_code, done.json()) == (200, {"ok": True, "state": "up"})
        assert (await a.http.head(path)).status_code == 200
        assert (await a.http.get(f"{path}/fail")).status_code == 200
        assert (await a.http.get(f"{path}/0")).status_code == 200
        shown = (await a.http.get("/api/v1/monitors/backup", headers=a.as_("a-view"))).json()
        assert shown["state"] == "up"
        kinds = [(p["kind"], p["exit_code"]) for p in shown["pings"]]
        assert kinds == [("success", 0), ("fail", None), ("success", None), ("success", None),
                         ("start", None)]  # fmt: skip
        big = shown["pings"][3]
        assert (len(big["body"]), big["user_agent"], big["duration_seconds"]) == (
            10 * 1024,
            "cron/1",
            90.0,
        )
        assert big["source"] == "127.0.0.1"
        states = [(h["from"], h["to"]) for h in shown["history"]]
        assert states == [("failed", "up"), ("up", "failed"), ("new", "up")]
        assert (await a.http.get("/ping/00000000-0000-0000-0000-000000000000")).status_code == 404
        bad = await a.http.get(f"{path}/reboot")
        assert (bad.status_code, bad.json()["field"]) == (422, "path")
        # Whoever holds the ping URL may ping: a viewer is shown it with its key redacted.
        key = path.removeprefix("/ping/")
        assert shown["ping_url"] == f"{PUBLIC}/ping/[redacted]"
        listed = await a.http.get("/api/v1/monitors", headers=a.as_("a-view"))
        assert key not in listed.text
        assert listed.json()[0]["ping_url"] == f"{PUBLIC}/ping/[redacted]"
        mine = await a.http.get("/api/v1/monitors/backup", headers=a.as_("a-op"))
        assert mine.json()["ping_url"] == m["ping_url"]


async def test_at_most_ten_pings_a_second_and_the_last_thousand_kept(db: store.Store) -> None:
    async with api(db) as a:
        path = key_of(await made(a, name="busy", period="1m", grace="1m"))
        said = [(await a.http.get(path)).status_code for _ in range(11)]
        assert said == [200] * 10 + [429]
        limited = await a.http.get(path)
        assert limited.headers["retry-after"] == "1"
        monitor = await a.c.monitor("a", "busy")
        assert len(await a.c.monitor_pings(monitor, 1000)) == 10
        clock: Any = a.c.clock
        key = path.rsplit("/", 1)[1]
        for n in range(1100):
            if n % 10 == 0:
                clock.advance(1)
            done = await a.c.monitor_ping(key, None, source="x", user_agent="", body=b"")
            assert done.found
            assert not done.limited
        kept = await a.c.monitor_pings(monitor, 5000)
        assert len(kept) == 1000
        stored = await db.monitor_pings.newest(monitor_id=monitor.id, limit=5000)
        assert len(stored) == 1000


async def test_rotate_pause_resume_delete_and_another_tenant_sees_none_of_it(
    db: store.Store,
) -> None:
    async with api(db) as a:
        op, b = a.as_("a-op"), a.as_("b-op")
        old = key_of(await made(a, name="nightly", cron="0 2 * * *", tz="Europe/Paris", grace="1h"))
        for method, path in (
            ("GET", "/api/v1/monitors/nightly"),
            ("GET", "/api/v1/monitors/nightly?tenant=a"),
            ("POST", "/api/v1/monitors/nightly/pause"),
            ("POST", "/api/v1/monitors/nightly/rotate"),
            ("DELETE", "/api/v1/monitors/nightly"),
        ):
            r = await a.http.request(method, path, headers=b)
            assert r.status_code == 404, (method, path, r.text)
        assert (await a.http.get("/api/v1/monitors", headers=b)).json() == []
        rotated = (await a.http.post("/api/v1/monitors/nightly/rotate", headers=op)).json()
        assert (await a.http.get(old)).status_code == 404
        assert (await a.http.get(key_of(rotated))).status_code == 200
        paused = (await a.http.post("/api/v1/monitors/nightly/pause", headers=op)).json()
        assert paused["state"] == "paused"
        resumed = (await a.http.post("/api/v1/monitors/nightly/resume", headers=op)).json()
        assert resumed["state"] == "up"
        viewer = await a.http.delete("/api/v1/monitors/nightly", headers=a.as_("a-view"))
        assert viewer.status_code == 403
        assert (await a.http.delete("/api/v1/monitors/nightly", headers=op)).status_code == 200
        assert (await a.http.get(key_of(rotated))).status_code == 404
        actions = [e["action"] for e in (await a.http.get("/api/v1/audit", headers=op)).json()]
        assert actions[:2] == ["monitors.delete", "monitors.resume"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "x", "period": "1h"}, "grace"),
        ({"name": "x y", "period": "1h", "grace": "1m"}, "name"),
        ({"name": "x", "period": "1h", "grace": "1m", "colour": "red"}, "colour"),
        ({"name": "x", "period": "1h", "grace": "1m", "channels": ["nope"]}, "channels"),
        ({"name": "x", "period": "1h", "grace": "1m", "tenant": "b"}, "tenant"),
    ],
)
async def test_a_bad_monitor_is_refused_naming_the_field_and_nothing_is_stored(
    db: store.Store, body: dict[str, Any], field: str
) -> None:
    async with api(db) as a:
        r = await a.http.post("/api/v1/monitors", json=body, headers=a.as_("a-op"))
        assert (r.status_code, r.json()["field"]) == (422, field), r.text
        assert await a.c.monitors(None) == []
        assert await a.c.tenant_rules("a") == []


async def test_no_monitor_without_public_url_nor_past_max_monitors(db: store.Store) -> None:
    async with api(db, config.Settings()) as a:
        body = {"name": "x", "period": "1h", "grace": "1m"}
        r = await a.http.post("/api/v1/monitors", json=body, headers=a.as_("a-op"))
        assert (r.status_code, r.json()["field"]) == (409, "public_url")
    capped = settings(tenants={"a": {"max_monitors": 1}})
    async with api(db, capped) as a:
        await made(a, name="one", period="1h", grace="1m")
        r = await a.http.post(
            "/api/v1/monitors", json={"name": "two", "period": "1h", "grace": "1m"},
            headers=a.as_("a-op"),
        )  # fmt: skip
        assert (r.status_code, r.json()["field"]) == (403, "max_monitors")
        theirs = await a.http.post(
            "/api/v1/monitors", json={"name": "two", "period": "1h", "grace": "1m"},
            headers=a.as_("b-op"),
        )  # fmt: skip
        assert theirs.status_code == 201  # b's own quota


async def test_adds_at_once_never_pass_max_monitors(db: store.Store) -> None:
    """Four adds of one tenant at once, each on a connection of its own: on PostgreSQL a
    lock of the existing rows let every one of them count none (or the same few)."""
    now = datetime(2026, 12, 8, 12, 0, tzinfo=UTC)

    async def add(name: str, most: int) -> monitoring.Monitor:
        new = _a_monitor(name, now, 3600, 60)
        return await db.monitors.add(new=new, rule=None, most=most, rules_most=10, now=now)

    for n in range(3):
        for old in await db.monitors.listed(tenant="a"):
            await db.monitors.delete(tenant="a", name=old.name)
        if n == 2:  # with one there already, and room for two more
            await add("there", 3)
        most = 3 if n == 2 else 1
        done = await asyncio.gather(*(add(f"m{n}-{i}", most) for i in range(4)),
                                    return_exceptions=True)  # fmt: skip
        refused = [d for d in done if isinstance(d, BaseException)]
        assert all(isinstance(d, errors.QuotaExceeded) for d in refused), refused
        assert len(await db.monitors.listed(tenant="a")) == most
        assert len(done) - len(refused) == (2 if n == 2 else 1)


async def test_a_monitor_s_rule_deleted_by_hand_is_forgotten_and_made_again_by_apply(
    db: store.Store,
) -> None:
    async with api(db) as a:
        op = a.as_("a-op")
        hook = {
            "name": "hook",
            "kind": "webhook",
            "url": "https://93.184.216.34/a",
        }  # never sent to
        assert (await a.http.post("/api/v1/alerts/channels", json=hook, headers=op)).is_success
        await made(a, name="backup", period="1h", grace="5m", channels=["hook"])
        gone = await a.http.delete("/api/v1/alerts/rules/monitor-backup", headers=op)
        assert gone.status_code == 200, gone.text
        assert (await a.c.monitor("a", "backup")).rule is None  # forgotten with it
        # `corral apply` of the monitor with its channel makes its rule again.
        text = "kind: Monitor\nname: backup\nperiod: 1h\ngrace: 5m\nchannels: [hook]\n"
        await a.c.apply("a", documents.parse(text, "m.yaml"))
        assert (await a.c.monitor("a", "backup")).rule == "monitor-backup"
        assert [r.name for r in await a.c.tenant_rules("a")] == ["monitor-backup"]
        # A rule of the same name made by hand after the monitor's went is the user's own:
        # deleting the monitor leaves it.
        await a.http.delete("/api/v1/alerts/rules/monitor-backup", headers=op)
        own = {"name": "monitor-backup", "on": ["failed"], "channels": ["hook"]}
        assert (await a.http.post("/api/v1/alerts/rules", json=own, headers=op)).is_success
        assert (await a.http.delete("/api/v1/monitors/backup", headers=op)).is_success
        [kept] = await a.c.tenant_rules("a")
        assert (kept.name, kept.rule["on"]) == ("monitor-backup", ["failed"])


async def _deliver(a: Api) -> None:
    alerter = alerts.Alerter(store=a.c.store, clock=a.c.clock, settings=a.c.settings)
    try:
        await alerter.read_once()
        await alerter.deliver_all()
    finally:
        await alerter.close()


async def test_a_monitor_goes_late_then_down_and_up_again_with_one_message_each(
    db: store.Store, smtp: tuple[Inbox, int], web_receiver: Web
) -> None:
    inbox, port = smtp
    s = settings(
        executors={
            "http": {"allow_networks": [f"127.0.0.1:{web_receiver.base.rsplit(':', 1)[1]}"]}
        },
        alerts={"tenant_smtp": {"url": f"smtp://127.0.0.1:{port}", "from": "corral@example.com"}},
    )
    async with api(db, s) as a:
        op = a.as_("a-op")
        for channel in (
            {"name": "mail", "kind": "email", "to": ["oncall@a.example"]},
            {"name": "slack", "kind": "slack", "webhook_url": f"{web_receiver.base}/slack"},
        ):
            assert (
                await a.http.post("/api/v1/alerts/channels", json=channel, headers=op)
            ).status_code == 201
        m = await made(a, name="backup", period="2s", grace="1s", channels=["mail", "slack"])
        assert m["alert_rule"] == "monitor-backup"
        rules = (await a.http.get("/api/v1/alerts/rules", headers=op)).json()["tenant_rules"]
        assert [(r["name"], r["match"]) for r in rules] == [
            ("monitor-backup", {"monitor": "backup"})
        ]
        await listening(db)
        clock: Any = a.c.clock
        s_ = scheduler.Scheduler(store=db, clock=clock)

        async def at(seconds: float) -> str:
            clock.advance(seconds)
            await s_.pass_once()
            return (await a.c.monitor("a", "backup")).state

        assert await at(0.5) == "up"
        assert await at(1.0) == "up"
        assert await at(1.0) == "late"  # 2.5 s: past its period
        await _deliver(a)
        assert (inbox.messages, web_receiver.seen) == ([], [])  # late is no alert
        assert await at(1.0) == "down"  # 3.5 s: past its grace
        await _deliver(a)
        [mail] = inbox.messages
        assert mail["Subject"] == "[corral] monitor backup (tenant a) is down"
        assert f"{PUBLIC}/ui/monitors/a/backup" in mail.get_content()
        [slack] = web_receiver.seen
        assert slack["path"] == "/slack"
        scraped = (await a.http.get("/metrics", headers=a.as_("admin"))).text
        assert 'corral_monitors{state="down"} 1.0' in scraped
        assert 'corral_monitors{state="up"} 0.0' in scraped
        assert await at(5.0) == "down"  # stays down: said once
        await _deliver(a)
        assert (len(inbox.messages), len(web_receiver.seen)) == (1, 1)
        assert (await a.http.get(key_of(m))).status_code == 200
        assert (await a.c.monitor("a", "backup")).state == "up"
        await _deliver(a)
        assert inbox.messages[1]["Subject"] == "[corral] monitor backup (tenant a) is up again"
        assert (len(inbox.messages), len(web_receiver.seen)) == (2, 2)
        gone = await a.http.delete("/api/v1/monitors/backup", headers=op)
        assert gone.status_code == 200
        assert await a.c.tenant_rules("a") == []  # its --channel rule goes with it


async def test_corral_stopped_past_period_and_grace_gives_a_fresh_start_and_records_the_gap(
    db: store.Store,
) -> None:
    async with api(db) as a:
        await made(a, name="backup", period="2s", grace="1s")
        clock: Any = a.c.clock
        await listening(db)
        pulse = loops.Service(db, a.c.settings, clock).pulse(kind="serve", runs=["scheduler"])
        await pulse.start()
        first = scheduler.Scheduler(store=db, clock=clock, loop_id=pulse.id)
        clock.advance(1)
        await first.pass_once()
        await pulse.stop()  # corral stops, 1 s after the monitor was made...
        clock.advance(30)  # ...for 30 s, far past its period and grace
        again = loops.Service(db, a.c.settings, clock).pulse(kind="serve", runs=["scheduler"])
        await again.start()
        second = scheduler.Scheduler(store=db, clock=clock, loop_id=again.id)
        await second.pass_once()
        monitor = await a.c.monitor("a", "backup")
        assert monitor.state == "up"
        assert monitor.expected_at == clock.now() + (monitor.period or monitor.grace)
        [gap, _made] = await a.c.monitor_changes(monitor)
        assert (gap.frm, gap.to) == ("up", "up")
        assert "nothing judged monitors" in gap.reason
        assert gap.details["gap_to"] == clock.now().isoformat()
        assert await db.alerts.list() == []
        read = await db.alerts.read(name="alerter", limit=100, now=clock.now())
        assert [e.entity for e, _ in read.events.found] == []  # no monitor_down event
        # From the restart on it is judged as ever: down once its fresh grace is past.
        clock.advance(2.5)
        await second.pass_once()
        clock.advance(1)
        await second.pass_once()
        assert (await a.c.monitor("a", "backup")).state == "down"
        await again.stop()


def _a_monitor(name: str, now: datetime, period: float, grace: float) -> monitoring.Monitor:
    return monitoring.Monitor(
        id=0, tenant="a", name=name, ping_key="", period=timedelta(seconds=period), cron=None,
        tz="UTC", grace=timedelta(seconds=grace), state="up", state_at=now, basis_at=now,
        expected_at=None, check_at=None, last_ping_at=None, run_started_at=None,
        created_at=now,
    )  # fmt: skip


@pytest.mark.slow
async def test_a_scheduler_sigkilled_and_started_again_at_once_calls_no_monitor_down(
    db: store.Store, db_url: str, tmp_path: Path
) -> None:
    """The process that judged last is SIGKILLed (its loops row never stopped, its beat
    still fresh) and another starts within seconds, past a monitor's period and grace: a
    gap since the dead one's last pass, not a down."""
    site = crash.Site(tmp_path, db_url)
    killed = site.start("scheduler")
    try:
        first = await eventually(db.monitors.judged_last, what="the first pass noted")
        clock = SystemClock()
        await db.monitors.add(
            new=_a_monitor("backup", clock.now(), 3, 2), rule=None, most=10, rules_most=10,
            now=clock.now(),
        )  # fmt: skip
    finally:
        killed.kill()  # SIGKILL: its row in loops is left as it was
        crash.wait_exit(killed)
    last = await db.monitors.judged_last()
    assert last is not None
    assert last.loop_id == first.loop_id
    monitor = await db.monitors.get(tenant="a", name="backup")
    assert monitor.down_at is not None
    await eventually(lambda: clock.now() > monitor.down_at, what="its grace to pass")
    [dead] = [loop for loop in await db.loops.all() if loop.id == last.loop_id]
    assert dead.stopped_at is None
    heartbeat = config.Settings().timeouts.heartbeat_interval
    assert dead.beat_at + loops.STALE_BEATS * heartbeat > clock.now()  # still "beating"
    again = loops.Service(db, config.Settings(), clock).pulse(kind="serve", runs=["scheduler"])
    await again.start()
    try:
        await scheduler.Scheduler(store=db, clock=clock, loop_id=again.id).pass_once()
    finally:
        await again.stop()
    after = await db.monitors.get(tenant="a", name="backup")
    assert after.state == "up"
    [gap, _made] = await db.monitors.changes(monitor_id=after.id, limit=10)
    assert "nothing judged monitors" in gap.reason
    assert gap.details["gap_from"] == last.at.isoformat()
    read = await db.alerts.read(name="alerter", limit=100, now=clock.now())
    assert [e.entity for e, _ in read.events.found] == []  # no monitor_down event


async def test_slow_passes_do_not_reset_monitors_and_a_failed_firing_still_judges_them(
    db: store.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FrozenClock(datetime(2026, 12, 8, 12, 0, tzinfo=UTC))
    made = await db.monitors.add(
        new=_a_monitor("slow", clock.now(), 2, 1), rule=None, most=10, rules_most=10,
        now=clock.now(),
    )  # fmt: skip
    s = scheduler.Scheduler(store=db, clock=clock)
    clock.advance(1)
    await s.pass_once()
    clock.advance(30)  # a pass that took 30 s (a catch-up): the monitor's grace passed
    await s.pass_once()
    down = await db.monitors.get(tenant="a", name="slow")
    assert down.state == "down"
    [change, _made] = await db.monitors.changes(monitor_id=made.id, limit=10)
    assert (change.frm, change.to) == ("up", "down")
    # Firing fails pass after pass: the monitors are judged all the same.
    await db.monitors.add(
        new=_a_monitor("other", clock.now(), 2, 1), rule=None, most=10, rules_most=10,
        now=clock.now(),
    )  # fmt: skip

    async def broken(**_: object) -> None:
        raise errors.StoreError("the firing's transaction failed")

    monkeypatch.setattr(db.schedules, "fire_due", broken)
    for _ in range(4):
        clock.advance(1)
        with pytest.raises(errors.StoreError):
            await s.pass_once()
    assert (await db.monitors.get(tenant="a", name="other")).state == "down"


async def test_the_dashboard_lists_a_tenant_s_monitors_and_shows_each_one_s_pings_and_history(
    db: store.Store,
) -> None:
    c = await forms_client(db, settings())
    monitor = await c.monitor_add("a", {"name": "backup", "period": "1h", "grace": "5m"})
    await c.monitor_ping(monitor.ping_key, "fail", source="10.0.0.7", user_agent="cron/1",
                         body=b"<b>disk full</b>")  # fmt: skip
    async with over_http(c) as http:
        await signed(http, c, "ada")
        listed = await http.get("/ui/monitors")
        assert listed.status_code == 200
        assert 'href="/ui/monitors/a/backup"' in listed.text
        assert 'href="/ui/monitors"' in listed.text  # in the nav
        shown = await http.get("/ui/monitors/a/backup")
        assert shown.status_code == 200
        assert f"{PUBLIC}/ping/{monitor.ping_key}" in shown.text
        assert "&lt;b&gt;disk full&lt;/b&gt;" in shown.text  # a body is text, escaped
        assert "10.0.0.7" in shown.text
        assert "a failure ping" in shown.text  # its history
        for theirs in ("/ui/monitors/b/backup", "/ui/monitors/a/nothing"):
            assert (await http.get(theirs)).status_code == 404
        assert (await http.get("/ui/monitors?tenant=b")).status_code == 404
    async with over_http(c) as http:  # a viewer: the ping URL's key redacted (it may ping)
        await signed(http, c, "vic")
        for page in ("/ui/monitors", "/ui/monitors/a/backup"):
            seen = await http.get(page)
            assert seen.status_code == 200
            assert monitor.ping_key not in seen.text
        assert f"{PUBLIC}/ping/[redacted]" in seen.text
