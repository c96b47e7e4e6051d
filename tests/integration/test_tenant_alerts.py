"""Alert channels and rules a tenant owns, through the API, on both databases: a real SMTP
server (aiosmtpd) as the operator's tenant_smtp and a real receiver on 127.0.0.1 as Slack;
one quarantine sends one message to each, nothing crosses to another tenant, and the
limits hold."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from corral import alerts, config, errors, store, tenant_alerts
from corral.testing import FrozenClock
from tests.integration.test_alerts import Web, listening, quarantine, web_receiver
from tests.support.api import noop_client, over_http
from tests.support.mail import Inbox

__all__ = ["web_receiver"]  # a fixture, used by name (smtp: the integration conftest's)


def settings(web_base: str, smtp_port: int | None) -> config.Settings:
    port = web_base.rsplit(":", 1)[1]
    tenant_smtp = (
        {"url": f"smtp://127.0.0.1:{smtp_port}", "from": "corral@example.com"}
        if smtp_port is not None
        else None
    )
    return config.Settings(
        executors={"http": {"allow_networks": [f"127.0.0.1:{port}"]}},  # type: ignore[arg-type]
        alerts={"tenant_smtp": tenant_smtp},  # type: ignore[arg-type]
    )


class Tenants:
    """The API over one store, with an operator and a viewer of tenants a and b."""

    def __init__(self, c: Any, http: httpx.AsyncClient, secrets: dict[str, str]) -> None:
        self.c, self.http, self.secrets = c, http, secrets

    def as_(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secrets[who]}"}


@contextlib.asynccontextmanager
async def tenants(db: store.Store, s: config.Settings) -> AsyncIterator[Tenants]:
    c = noop_client(db, settings=s, clock_=FrozenClock(datetime.now(UTC)))
    secrets = {}
    for tenant in ("a", "b"):
        for role in ("operator", "viewer"):
            _, secrets[f"{tenant}-{role[:2]}"] = await c.token_create(
                name=f"{tenant}-{role}", tenant=tenant, role=role
            )
    _, secrets["admin"] = await c.token_create(name="admin", tenant=None, role="admin")
    async with over_http(c) as http:
        yield Tenants(c, http, secrets)


async def test_a_tenant_s_own_email_and_slack_channels_get_one_message_each(
    db: store.Store, smtp: tuple[Inbox, int], web_receiver: Web
) -> None:
    inbox, port = smtp
    slack_url = f"{web_receiver.base}/services/T0/B0/sekret"
    async with tenants(db, settings(web_receiver.base, port)) as t:
        a = t.as_("a-op")
        mail = {"name": "mail", "kind": "email", "to": ["oncall@a.example"]}
        slack = {"name": "slack", "kind": "slack", "webhook_url": slack_url}
        for body in (mail, slack):
            made = await t.http.post("/api/v1/alerts/channels", json=body, headers=a)
            assert made.status_code == 201, made.text
        rule = {"name": "broken", "on": ["quarantined"], "channels": ["mail", "slack"]}
        made = await t.http.post("/api/v1/alerts/rules", json=rule, headers=a)
        assert made.status_code == 201, made.text
        assert made.json()["alerts_as"] == "tenant:a/broken"
        # b's rule on everything of its own, through its own channel
        b_hook = {"name": "hook", "kind": "webhook", "url": f"{web_receiver.base}/b"}
        assert (
            await t.http.post("/api/v1/alerts/channels", json=b_hook, headers=t.as_("b-op"))
        ).status_code == 201
        b_rule = {"name": "all", "on": ["quarantined", "failed"], "channels": ["hook"]}
        assert (
            await t.http.post("/api/v1/alerts/rules", json=b_rule, headers=t.as_("b-op"))
        ).status_code == 201

        # What is listed never shows the webhook's URL whole.
        listed = await t.http.get("/api/v1/alerts/channels", headers=t.as_("a-vi"))
        assert "sekret" not in listed.text
        assert {c["name"] for c in listed.json()} == {"mail", "slack"}
        assert [
            r["name"]
            for r in (await t.http.get("/api/v1/alerts/rules", headers=a)).json()["tenant_rules"]
        ] == ["broken"]

        clock = t.c.clock
        await listening(db)
        job_id = await quarantine(db, clock, queue="q", tenant="a")
        alerter = alerts.Alerter(store=db, clock=clock, settings=t.c.settings)
        try:
            assert await alerter.read_once() > 0
            await alerter.deliver_all()
        finally:
            await alerter.close()
        [sent] = inbox.messages
        assert sent["To"] == "oncall@a.example"
        assert sent["From"] == "corral@example.com"
        assert f"job {job_id}" in sent["Subject"]
        assert [s["path"] for s in web_receiver.seen] == ["/services/T0/B0/sekret"]
        history = await db.alerts.list()
        assert {(x.rule, x.channel, x.state) for x in history} == {
            ("tenant:a/broken", "tenant:a/mail", "delivered"),
            ("tenant:a/broken", "tenant:a/slack", "delivered"),
        }
        shown = (await t.http.get("/api/v1/alerts", headers=t.as_("b-vi"))).json()
        assert shown == []  # b sees none of a's alerts


async def test_another_tenant_cannot_list_test_delete_or_name_them(
    db: store.Store, web_receiver: Web
) -> None:
    async with tenants(db, settings(web_receiver.base, None)) as t:
        a, b = t.as_("a-op"), t.as_("b-op")
        hook = {"name": "hook", "kind": "slack", "webhook_url": f"{web_receiver.base}/x"}
        assert (
            await t.http.post("/api/v1/alerts/channels", json=hook, headers=a)
        ).status_code == 201
        rule = {"name": "r", "on": ["failed"], "channels": ["hook"]}
        assert (await t.http.post("/api/v1/alerts/rules", json=rule, headers=a)).status_code == 201
        for method, path in (
            ("GET", "/api/v1/alerts/channels?tenant=a"),
            ("GET", "/api/v1/alerts/rules?tenant=a"),
            ("POST", "/api/v1/alerts/channels/hook/test"),
            ("POST", "/api/v1/alerts/channels/hook/test?tenant=a"),
            ("DELETE", "/api/v1/alerts/channels/hook"),
            ("DELETE", "/api/v1/alerts/rules/r?tenant=a"),
            ("DELETE", "/api/v1/alerts/rules/r"),
        ):
            r = await t.http.request(method, path, headers=b)
            assert r.status_code == 404, (method, path, r.text)
        assert (await t.http.get("/api/v1/alerts/channels", headers=b)).json() == []
        # b's rule cannot name a's channel, nor match a's jobs
        theirs = await t.http.post("/api/v1/alerts/rules", json=rule, headers=b)
        assert (theirs.status_code, theirs.json()["field"]) == (422, "channels")
        await t.http.post("/api/v1/alerts/channels", json=hook, headers=b)
        other = {**rule, "match": {"tenant": "a"}}
        refused = await t.http.post("/api/v1/alerts/rules", json=other, headers=b)
        assert (refused.status_code, refused.json()["field"]) == (422, "match.tenant")
        into = {**rule, "tenant": "a"}
        refused = await t.http.post("/api/v1/alerts/rules", json=into, headers=b)
        assert (refused.status_code, refused.json()["field"]) == (422, "tenant")
        # a viewer lists, and may not add or delete
        assert (
            await t.http.get("/api/v1/alerts/channels", headers=t.as_("a-vi"))
        ).status_code == 200
        viewer = await t.http.delete("/api/v1/alerts/rules/r", headers=t.as_("a-vi"))
        assert viewer.status_code == 403
        # the admin of every tenant names the tenant
        listed = await t.http.get("/api/v1/alerts/channels?tenant=a", headers=t.as_("admin"))
        assert [c["name"] for c in listed.json()] == ["hook"]
        # a's channel, still used by its rule, is not deleted; then it is
        used = await t.http.delete("/api/v1/alerts/channels/hook", headers=a)
        assert used.status_code == 409, used.text
        assert (await t.http.delete("/api/v1/alerts/rules/r", headers=a)).status_code == 200
        assert (await t.http.delete("/api/v1/alerts/channels/hook", headers=a)).status_code == 200


async def test_a_stored_rule_matches_its_own_tenant_s_jobs_whatever_it_says(
    db: store.Store, web_receiver: Web
) -> None:
    clock = FrozenClock(datetime.now(UTC))
    s = settings(web_receiver.base, None)
    await db.tenant_alerts.channel_add(
        tenant="b",
        name="hook",
        kind="webhook",
        config={"url": f"{web_receiver.base}/b", "secret": None},
        now=clock.now(),
        most=20,
    )
    # As if written around the checks: a match naming tenant a.
    sneaky = {"on": ["quarantined"], "channels": ["hook"], "match": {"tenant": "a"}}
    await db.tenant_alerts.rule_add(
        tenant="b", name="sneaky", rule=sneaky, now=clock.now(), most=50
    )
    assert tenant_alerts.rule_of("b", sneaky).match.tenant == "b"
    await listening(db)
    await quarantine(db, clock, queue="q", tenant="a")
    alerter = alerts.Alerter(store=db, clock=clock, settings=s)
    try:
        await alerter.read_once()
        await alerter.deliver_all()
    finally:
        await alerter.close()
    assert await db.alerts.list() == []
    assert web_receiver.seen == []


@pytest.mark.parametrize(
    ("body", "field", "said"),
    [
        ({"kind": "slack", "webhook_url": "http://10.0.0.5/hook"}, "webhook_url", "private"),
        ({"kind": "slack", "webhook_url": "http://127.0.0.1:1/hook"}, "webhook_url", "not opened"),
        ({"kind": "webhook", "url": "ftp://x"}, "url", "http"),
        ({"kind": "email", "to": ["x@example.com"]}, "kind", "alerts.tenant_smtp.url"),
        ({"kind": "pager"}, "kind", "one of"),
        ({"kind": "slack", "webhook_url": "https://x.example", "extra": 1}, "extra", "unknown"),
    ],
)
async def test_bad_channels_are_refused_naming_the_field(
    db: store.Store, web_receiver: Web, body: dict[str, Any], field: str, said: str
) -> None:
    async with tenants(db, settings(web_receiver.base, None)) as t:
        r = await t.http.post(
            "/api/v1/alerts/channels", json={"name": "x", **body}, headers=t.as_("a-op")
        )
        assert (r.status_code, r.json()["field"]) == (422, field), r.text
        assert said in r.json()["error"]


async def test_limits_channels_rules_and_tests_a_minute(db: store.Store, web_receiver: Web) -> None:
    async with tenants(db, settings(web_receiver.base, None)) as t:
        a = t.as_("a-op")
        for i in range(tenant_alerts.MAX_CHANNELS + 1):
            body = {"name": f"c{i}", "kind": "webhook", "url": f"{web_receiver.base}/{i}"}
            r = await t.http.post("/api/v1/alerts/channels", json=body, headers=a)
        assert r.status_code == 409
        assert "(20)" in r.json()["error"]
        for i in range(tenant_alerts.MAX_RULES + 1):
            body = {"name": f"r{i}", "on": ["failed"], "channels": ["c0"]}
            r = await t.http.post("/api/v1/alerts/rules", json=body, headers=a)
        assert r.status_code == 409
        assert "(50)" in r.json()["error"]
        for _ in range(tenant_alerts.TESTS_A_MINUTE):
            sent = await t.http.post("/api/v1/alerts/channels/c1/test", headers=a)
            assert sent.json()["state"] == "delivered", sent.text
            t.c.clock.advance(1)  # a test message's key is its channel's and its time
        more = await t.http.post("/api/v1/alerts/channels/c2/test", headers=a)
        assert more.status_code == 429
        assert int(more.headers["Retry-After"]) == 55  # when the first of the five is a minute old
        # b's tests are its own
        b_hook = {"name": "h", "kind": "webhook", "url": f"{web_receiver.base}/b"}
        await t.http.post("/api/v1/alerts/channels", json=b_hook, headers=t.as_("b-op"))
        theirs = await t.http.post("/api/v1/alerts/channels/h/test", headers=t.as_("b-op"))
        assert theirs.json()["state"] == "delivered"
        t.c.clock.advance(55)
        again = await t.http.post("/api/v1/alerts/channels/c2/test", headers=a)
        assert again.status_code == 200


async def test_adds_at_once_never_pass_a_tenant_s_limits_of_channels_and_rules(
    db: store.Store,
) -> None:
    """Four adds of one tenant at once, each on a connection of its own: on PostgreSQL a
    lock of the existing rows let every one of them count none."""
    now = datetime(2026, 12, 8, 12, 0, tzinfo=UTC)
    hook = {"url": "https://hooks.example.com/a"}

    async def channel(name: str) -> object:
        return await db.tenant_alerts.channel_add(
            tenant="a", name=name, kind="webhook", config=hook, now=now, most=1
        )

    async def rule(name: str) -> object:
        [made] = await db.tenant_alerts.channels(tenant="a")  # whichever add came first
        fields = {"on": ["failed"], "channels": [made.name]}
        return await db.tenant_alerts.rule_add(tenant="a", name=name, rule=fields, now=now, most=2)

    for add, many, most in ((channel, db.tenant_alerts.channels, 1),
                            (rule, db.tenant_alerts.rules, 2)):  # fmt: skip
        done = await asyncio.gather(*(add(f"n{i}") for i in range(4)), return_exceptions=True)
        refused = [d for d in done if isinstance(d, BaseException)]
        assert all(isinstance(d, errors.Conflict) for d in refused), refused
        assert all("the most a tenant may have" in str(d) for d in refused)
        assert len(await many(tenant="a")) == most
