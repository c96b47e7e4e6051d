"""The alerts page of the dashboard (/ui/alerts), over HTTP on both databases: an operator
adds a Slack channel (a real receiver on 127.0.0.1), sees it listed with its URL redacted,
tests it, adds a rule naming it and deletes both; a refused URL is shown beside its field;
a viewer sees the lists without a form and is refused every POST; another tenant sees and
deletes none of them; a POST without the CSRF token is refused."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from corral import client, config, store
from tests.integration.test_alerts import Web, web_receiver
from tests.support.api import over_http
from tests.support.forms import error_of, forms_client, post, signed

__all__ = ["web_receiver"]  # a fixture, used by name

SECRET = "T0-B0-sekret"


def settings(web: Web) -> config.Settings:
    port = web.base.rsplit(":", 1)[1]
    return config.Settings(
        executors={"http": {"allow_networks": [f"127.0.0.1:{port}"]}},  # type: ignore[arg-type]
    )


@pytest.fixture
async def c(db: store.Store, web_receiver: Web) -> client.Client:
    return await forms_client(db, settings(web_receiver))


@pytest.fixture
async def http(c: client.Client) -> AsyncIterator[httpx.AsyncClient]:
    async with over_http(c) as made:
        yield made


async def _a_channel_and_rule(http: httpx.AsyncClient, token: str, web: Web) -> None:
    made = await post(http, "/ui/alerts/channels", token, channel="oncall", kind="slack",
                      webhook_url=f"{web.base}/services/{SECRET}")  # fmt: skip
    assert made.status_code == 303, made.text
    assert made.headers["location"] == "/ui/alerts?note=alert-channel-made&name=oncall"
    rule = {"rule": "broken", "on": ["quarantined", "failed"], "channels": ["oncall"],
            "schedule": "nightly", "throttle": "5m", "after": "2"}  # fmt: skip
    made = await http.post("/ui/alerts/rules", data={"csrf": token, **rule})
    assert made.status_code == 303, made.text
    assert made.headers["location"] == "/ui/alerts?note=alert-rule-made&name=broken"


async def test_an_operator_adds_tests_and_deletes_a_channel_and_a_rule(
    http: httpx.AsyncClient, c: client.Client, web_receiver: Web
) -> None:
    token = await signed(http, c, "ada")
    empty = await http.get("/ui/alerts")
    assert empty.status_code == 200
    assert 'id="channel-form"' in empty.text
    assert 'href="/ui/alerts"' in empty.text
    await _a_channel_and_rule(http, token, web_receiver)
    shown = await http.get("/ui/alerts?note=alert-channel-made&name=oncall")
    assert "alert channel oncall made" in shown.text
    assert SECRET not in shown.text
    assert f"{web_receiver.base}/[redacted]" in shown.text
    assert 'id="rule-broken"' in shown.text
    assert "quarantined, failed" in shown.text
    assert "schedule nightly" in shown.text
    assert "5m" in shown.text
    [rule] = await c.tenant_rules("a")
    assert rule.rule["on"] == ["quarantined", "failed"]
    assert rule.rule["after"] == 2

    tested = await post(http, "/ui/alerts/channels/oncall/test", token)
    assert tested.status_code == 303, tested.text
    assert tested.headers["location"].endswith(
        "note=alert-channel-tested&name=oncall&state=delivered"
    )
    assert [s["path"] for s in web_receiver.seen] == [f"/services/{SECRET}"]

    in_use = await post(http, "/ui/alerts/channels/oncall/delete", token)
    assert in_use.status_code == 409  # the rule still sends to it
    assert 'id="error-form"' in in_use.text
    for path in ("/ui/alerts/rules/broken/delete", "/ui/alerts/channels/oncall/delete"):
        went = await post(http, path, token)
        assert went.status_code == 303, went.text
    assert await c.tenant_channels("a") == []
    assert await c.tenant_rules("a") == []
    actions = [a.action for a in await c.audit_list(limit=20)]
    assert {"alerts.channels.create", "alerts.channels.test", "alerts.rules.create",
            "alerts.rules.delete", "alerts.channels.delete"} <= set(actions)  # fmt: skip


async def test_a_refused_form_is_drawn_again_with_the_error_beside_its_field(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    token = await signed(http, c, "ada")
    refused = await post(http, "/ui/alerts/channels", token, channel="oncall", kind="slack",
                         webhook_url="http://10.1.2.3/services/x")  # fmt: skip
    assert refused.status_code == 422
    assert error_of(refused, "webhook_url").startswith("webhook_url: refused")
    assert 'value="oncall"' in refused.text  # what was typed stays
    no_channel = await http.post("/ui/alerts/rules", data={"csrf": token, "rule": "r",
                                 "on": "failed", "channels": "none"})  # fmt: skip
    assert no_channel.status_code == 422
    assert 'id="error-channels"' in no_channel.text
    no_cause = await http.post("/ui/alerts/rules", data={"csrf": token, "rule": "r"})
    assert no_cause.status_code == 422
    assert 'id="error-on"' in no_cause.text
    assert await c.tenant_channels("a") == []


async def test_a_viewer_sees_the_lists_but_may_not_act(
    http: httpx.AsyncClient, c: client.Client, web_receiver: Web
) -> None:
    await _a_channel_and_rule(http, await signed(http, c, "ada"), web_receiver)
    token = await signed(http, c, "vic")
    shown = await http.get("/ui/alerts")
    assert 'id="channel-oncall"' in shown.text
    assert 'id="rule-broken"' in shown.text
    assert "<form" not in shown.text.replace('action="/ui/sign-out"', "").split("<main>")[1]
    for path in ("/ui/alerts/channels/oncall/delete", "/ui/alerts/rules/broken/delete",
                 "/ui/alerts/channels/oncall/test"):  # fmt: skip
        assert (await post(http, path, token)).status_code == 403
    made = await post(http, "/ui/alerts/channels", token, channel="x", kind="slack",
                      webhook_url=f"{web_receiver.base}/x")  # fmt: skip
    assert made.status_code == 403
    assert len(await c.tenant_channels("a")) == 1
    assert web_receiver.seen == []


async def test_another_tenant_sees_and_changes_none_of_them(
    http: httpx.AsyncClient, c: client.Client, web_receiver: Web
) -> None:
    await _a_channel_and_rule(http, await signed(http, c, "ada"), web_receiver)
    token = await signed(http, c, "bea")
    shown = await http.get("/ui/alerts")
    assert "oncall" not in shown.text
    assert "broken" not in shown.text
    assert (await http.get("/ui/alerts?tenant=a")).status_code == 404
    for path in ("/ui/alerts/channels/oncall/delete", "/ui/alerts/rules/broken/delete",
                 "/ui/alerts/channels/oncall/test"):  # fmt: skip
        assert (await post(http, path, token)).status_code == 404
        assert (await post(http, path, token, tenant="a")).status_code == 404
    assert len(await c.tenant_channels("a")) == 1
    assert len(await c.tenant_rules("a")) == 1
    assert web_receiver.seen == []
    await signed(http, c, "root")  # a session of every tenant picks the tenant
    assert 'id="channel-oncall"' in (await http.get("/ui/alerts?tenant=a")).text
    assert 'id="channel-oncall"' not in (await http.get("/ui/alerts?tenant=b")).text


async def test_a_post_without_the_csrf_token_is_refused(
    http: httpx.AsyncClient, c: client.Client, web_receiver: Web
) -> None:
    await signed(http, c, "ada")
    made = await http.post("/ui/alerts/channels", data={"channel": "x", "kind": "slack",
                           "webhook_url": f"{web_receiver.base}/x"})  # fmt: skip
    assert made.status_code == 403
    assert await c.tenant_channels("a") == []
