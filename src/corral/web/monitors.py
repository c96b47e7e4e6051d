"""A tenant's monitors under /ui/monitors, and a page per monitor,
/ui/monitors/TENANT/NAME (where alerts link): where it stands, its ping URL (its key
redacted for a viewer: who holds it may ping), its ping log and its state history.
Read-only: monitors are made and changed with `corral monitors` or the API.

A session of one tenant sees its own (another tenant's monitor, or list, is not found:
404); one of every tenant picks the tenant with ?tenant=NAME (default: default)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from corral import access, client, errors, monitor_shapes, monitoring
from corral.web import auth
from corral.web.auth import Viewer
from corral.web.pages import page
from corral.web.tenant_alerts import whose

router = APIRouter(prefix="/ui", include_in_schema=False)

SHOWN = 200
"""The pings and changes a monitor's page shows, the newest first."""


@router.get("/monitors")
async def monitors_page(request: Request, who: Viewer, tenant: str = "") -> Response:
    """The tenant's monitors and where each stands."""
    mine = whose(who, tenant)
    c = auth.client_of(request)
    shown = [_shown(c, m, who) for m in await c.monitors(mine)]
    return page(request, "monitors.html", who, tenant=mine, monitors=shown)


@router.get("/monitors/{tenant}/{name}")
async def monitor_page(request: Request, who: Viewer, tenant: str, name: str) -> Response:
    """One monitor: its ping URL, its ping log and its state history."""
    if who.tenant not in (None, tenant):
        raise errors.PageMissing(f"no monitor {name!r}")
    c = auth.client_of(request)
    try:
        found = await c.monitor(tenant, name)
    except errors.NotFound:
        raise errors.PageMissing(f"no monitor {name!r}") from None
    pings = [monitor_shapes.ping_dict(p) for p in await c.monitor_pings(found, SHOWN)]
    history = [monitor_shapes.change_dict(h) for h in await c.monitor_changes(found, SHOWN)]
    shown = _shown(c, found, who)
    return page(request, "monitor.html", who, monitor=shown, pings=pings, history=history)


def _shown(
    c: client.Client, monitor: monitoring.Monitor, who: access.WebSession
) -> dict[str, object]:
    """A monitor as the session may see it: its ping URL's key redacted for a viewer."""
    secret = who.role.allows(access.Role.OPERATOR)
    return monitor_shapes.monitor_dict(monitor, c.ping_url(monitor, secret=secret))
