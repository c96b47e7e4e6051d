"""The routes of /api/v1/flows: the flows a tenant owns (corral.flows), made, listed, shown
with what they use now, changed and deleted within its tenant (another's is not found,
404). A token of every tenant names the tenant with a `tenant` field or ?tenant= (default:
default). Viewers list and show; operators and admins make, change and delete."""

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
LIMITS = (
    'rate: "N/PERIOD", at most N attempts started within any window of PERIOD (e.g. "10/1s",'
    ' "600/1m"); parallelism: at most that many of its jobs running at once; either may be'
    " null (none)"
)


def _body_tenant(who: Caller, body: dict[str, Any]) -> str:
    plain_json(body)
    return client.tenant_alerts.whose(who.token.tenant, body.get("tenant"))


@router.get("/flows", summary="The flows of the tenant")
async def flows_list(c: Client, who: Viewer, tenant: Tenant = None) -> list[dict[str, Any]]:
    whose = path_tenant(who, tenant, f"no tenant {tenant!r}")
    return [shapes.flow_dict(f) for f in await c.flows(whose)]


@router.post("/flows", status_code=201, summary="Make a flow of the tenant")
async def flow_create(
    c: Client,
    who: Operator,
    body: Annotated[
        dict[str, Any],
        Body(description=f'{{"name": "stripe", "rate": "10/1s", "parallelism": 4}}; {LIMITS}'),
    ],
) -> dict[str, Any]:
    tenant = _body_tenant(who, body)
    made = await c.flow_add(tenant, body)
    await audit(c, who, "flows.create", f"{tenant}/{made.name}", tenant)
    return shapes.flow_dict(made)


@router.get("/flows/{name}", summary="A flow of the tenant, with what it uses now")
async def flow_show(c: Client, who: Viewer, name: Name, tenant: Tenant = None) -> dict[str, Any]:
    whose = path_tenant(who, tenant, f"no flow {name!r}")
    found, use = await c.flow(whose, name)
    return shapes.flow_dict(found, use)


@router.patch("/flows/{name}", summary="Change a flow's rate or parallelism")
async def flow_update(
    c: Client,
    who: Operator,
    name: Name,
    body: Annotated[dict[str, Any], Body(description=f'{{"rate": "600/1m"}}; {LIMITS}')],
    tenant: Tenant = None,
) -> dict[str, Any]:
    plain_json(body)
    whose = path_tenant(who, tenant, f"no flow {name!r}")
    changed = await c.flow_update(whose, name, {k: v for k, v in body.items() if k != "tenant"})
    await audit(c, who, "flows.update", f"{whose}/{name}", whose)
    return shapes.flow_dict(changed)


@router.delete("/flows/{name}", summary="Delete a flow no unfinished job or schedule names")
async def flow_delete(
    c: Client, who: Operator, name: Name, tenant: Tenant = None
) -> dict[str, Any]:
    whose = path_tenant(who, tenant, f"no flow {name!r}")
    await c.flow_delete(whose, name)
    await audit(c, who, "flows.delete", f"{whose}/{name}", whose)
    return {"deleted": True}
