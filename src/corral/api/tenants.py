"""GET /api/v1/tenant: the calling token's own tenant, each quota with its limit and its use,
and its weight in the claims' fair share.

A token of one tenant sees its own tenant and no other: one it names that is not its own is
not found (404), whether it exists or not. A token of every tenant has no tenant of its
own: it names one (?tenant=NAME), or is refused (400) with where to look instead (every
tenant at once: `corral tenants list`, or /metrics)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from corral import errors, shapes
from corral.api.auth import Client, Viewer
from corral.api.routes import RESPONSES

router = APIRouter(responses=RESPONSES)

Tenant = Annotated[
    str | None,
    Query(
        max_length=200,
        description="A token of every tenant: which tenant (required). A token of one tenant"
        " may name its own only.",
    ),
]


@router.get("/tenant", summary="The token's tenant: each quota, its use, and its weight")
async def tenant_get(c: Client, who: Viewer, tenant: Tenant = None) -> dict[str, Any]:
    mine = who.token.tenant
    if mine is not None and tenant not in (None, mine):
        raise errors.RequestRefused(404, f"no tenant {tenant!r}")
    if mine is None and tenant is None:
        raise errors.RequestRefused(
            400,
            "tenant: a token of every tenant has no tenant of its own: name one"
            " (GET /api/v1/tenant?tenant=NAME), or see every tenant with `corral tenants list`"
            " or in /metrics",
        )
    return shapes.tenant_dict(await c.tenant_view(mine or str(tenant)))
