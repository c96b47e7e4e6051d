"""The flows a tenant owns, under /ui/flows: each one's rate and parallelism, its hold (a
Retry-After's), and what it uses now (its starts in its window, its jobs running), read
through the client. A session of one tenant sees its own; one of every tenant picks the
tenant with ?tenant=NAME (default: default). Flows are made and changed with `corral flows`
or the API; this page only shows them."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from corral import shapes
from corral.web import auth, tenant_alerts
from corral.web.auth import Viewer
from corral.web.pages import page

router = APIRouter(prefix="/ui", include_in_schema=False)


@router.get("/flows")
async def flows_page(request: Request, who: Viewer, tenant: str = "") -> Response:
    """The tenant's flows, with what each uses now."""
    whose = tenant_alerts.whose(who, tenant)
    c = auth.client_of(request)
    shown = [shapes.flow_dict(*await c.flow(whose, f.name)) for f in await c.flows(whose)]
    return page(request, "flows.html", who, tenant=whose, flows=shown)
