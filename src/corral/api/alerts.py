"""The routes of /api/v1/alerts/channels and /api/v1/alerts/rules: the alert channels and
rules a tenant owns, made, listed, tested and deleted within its tenant (another's is not
found, 404), beside the settings' rules that concern it. A token of every tenant names
the tenant with a `tenant` field or ?tenant= (default: default). Viewers list; operators
and admins make, test and delete."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Query

from corral import client, shapes
from corral.api.auth import Caller, Client, Operator, Viewer
from corral.api.routes import RESPONSES, audit, path_tenant, plain_json

router = APIRouter(responses=RESPONSES)

Name = Annotated[str, Path(max_length=100, description="Its name (within its tenant).")]
Tenant = Annotated[
    str | None,
    Query(max_length=200, description="A token of every tenant: whose (default: default)."),
]


def _body_tenant(who: Caller, body: dict[str, Any]) -> str:
    plain_json(body)
    return client.tenant_alerts.whose(who.token.tenant, body.get("tenant"))


@router.get("/alerts/channels", summary="The alert channels of the tenant (no secret shown)")
async def channels_list(c: Client, who: Viewer, tenant: Tenant = None) -> list[dict[str, Any]]:
    whose = path_tenant(who, tenant, f"no tenant {tenant!r}")
    return [shapes.tenant_channel_dict(ch) for ch in await c.tenant_channels(whose)]


@router.post("/alerts/channels", status_code=201, summary="Make an alert channel of the tenant")
async def channel_create(
    c: Client,
    who: Operator,
    body: Annotated[
        dict[str, Any],
        Body(
            description='{"name": "oncall", "kind": "slack", "webhook_url": "https://hooks.slack.com/..."};'
            ' kind email takes "to" (addresses), webhook "url" and "secret" (whsec_...)'
        ),
    ],
) -> dict[str, Any]:
    tenant = _body_tenant(who, body)
    made = await c.tenant_channel_add(tenant, body)
    await audit(c, who, "alerts.channels.create", f"{tenant}/{made.name}", tenant, kind=made.kind)
    return shapes.tenant_channel_dict(made)


@router.delete("/alerts/channels/{name}", summary="Delete an alert channel no rule sends to")
async def channel_delete(
    c: Client, who: Operator, name: Name, tenant: Tenant = None
) -> dict[str, Any]:
    whose = path_tenant(who, tenant, f"no alert channel {name!r}")
    await c.tenant_channel_delete(whose, name)
    await audit(c, who, "alerts.channels.delete", f"{whose}/{name}", whose)
    return {"deleted": True}


@router.post(
    "/alerts/channels/{name}/test",
    summary="Send a test message through an alert channel now (at most 5 a minute a tenant)",
)
async def channel_test(
    c: Client, who: Operator, name: Name, tenant: Tenant = None
) -> dict[str, Any]:
    whose = path_tenant(who, tenant, f"no alert channel {name!r}")
    sent = await c.tenant_channel_test(whose, name)
    await audit(c, who, "alerts.channels.test", f"{whose}/{name}", whose, state=sent.state)
    return {"channel": name, "tenant": whose, "state": sent.state, "error": sent.last_error}


@router.get(
    "/alerts/rules",
    summary="The alert rules that can concern the tenant: the settings' (of every tenant and"
    " its own) and those it owns (`tenant_rules`)",
)
async def rules_list(c: Client, who: Viewer, tenant: Tenant = None) -> dict[str, Any]:
    whose = path_tenant(who, tenant, f"no tenant {tenant!r}")
    settings = c.settings.alerts
    muted = await c.alerts_muted()
    rules = {
        name: shapes.alert_rule_dict(r, muted.get(name))
        for name, r in settings.rules.items()
        if r.match.tenant is None or who.sees(r.match.tenant)
    }
    own = [
        shapes.tenant_rule_dict(r, muted.get(client.tenant_alerts.qualified(r)))
        for r in await c.tenant_rules(whose)
    ]
    return {"rules": rules, "tenant_rules": own}


@router.post("/alerts/rules", status_code=201, summary="Make an alert rule of the tenant")
async def rule_create(
    c: Client,
    who: Operator,
    body: Annotated[
        dict[str, Any],
        Body(
            description='{"name": "broken", "on": ["quarantined", "failed"],'
            ' "channels": ["oncall"], "match": {"schedule": "nightly"}, "throttle": "10m"}'
        ),
    ],
) -> dict[str, Any]:
    tenant = _body_tenant(who, body)
    made = await c.tenant_rule_add(tenant, body)
    await audit(c, who, "alerts.rules.create", f"{tenant}/{made.name}", tenant)
    return shapes.tenant_rule_dict(made, None)


@router.delete("/alerts/rules/{name}", summary="Delete an alert rule of the tenant")
async def rule_delete(
    c: Client, who: Operator, name: Name, tenant: Tenant = None
) -> dict[str, Any]:
    whose = path_tenant(who, tenant, f"no alert rule {name!r}")
    await c.tenant_rule_delete(whose, name)
    await audit(c, who, "alerts.rules.delete", f"{whose}/{name}", whose)
    return {"deleted": True}
