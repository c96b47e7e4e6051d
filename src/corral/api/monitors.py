"""The routes of /api/v1/monitors (a tenant's monitors, made, listed, shown, paused,
resumed, rotated and deleted within its tenant; another's is not found, 404), and the ping
routes, /ping/<key>[/start|/fail|/<exit code>], outside /api/v1 and without a token: the
random key of a monitor's ping URL is what authorises a ping. A token of every tenant
names the tenant with a `tenant` field or ?tenant= (default: default). Viewers list and
show (a ping URL with its key redacted: who holds it may ping); operators and admins
change."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Query, Request
from fastapi.responses import Response

from corral import access, client, errors, monitor_shapes, monitoring, proxies
from corral.api.auth import Caller, Client, ErrorBody, Operator, Viewer, client_of
from corral.api.routes import RESPONSES, answer, audit, path_tenant, plain_json

router = APIRouter(responses=RESPONSES)
pings = APIRouter()

Name = Annotated[str, Path(max_length=100, description="The monitor's name (within its tenant).")]
Tenant = Annotated[
    str | None,
    Query(max_length=200, description="A token of every tenant: whose (default: default)."),
]
Limit = Annotated[
    int, Query(ge=1, le=monitoring.PINGS_KEPT, description="Pings and changes shown.")
]


def _shown(c: client.Client, monitor: monitoring.Monitor, who: Caller) -> dict[str, Any]:
    """A monitor as the caller may see it: its ping URL's key redacted for a viewer."""
    secret = who.token.role.allows(access.Role.OPERATOR)
    return monitor_shapes.monitor_dict(monitor, c.ping_url(monitor, secret=secret))


@router.get("/monitors", summary="The monitors of the tenant")
async def monitors_list(c: Client, who: Viewer, tenant: Tenant = None) -> list[dict[str, Any]]:
    whose = path_tenant(who, tenant, f"no tenant {tenant!r}")
    return [_shown(c, m, who) for m in await c.monitors(whose)]


@router.post(
    "/monitors",
    status_code=201,
    summary="Make a monitor of the tenant: its ping URL is in the answer (`ping_url`)",
)
async def monitor_create(
    c: Client,
    who: Operator,
    body: Annotated[
        dict[str, Any],
        Body(
            description='{"name": "backup", "period": "1h", "grace": "5m"}, or a "cron" with'
            ' its "tz" in place of the period; "channels": the tenant\'s alert channels to'
            " tell of monitor_down, monitor_failed and monitor_up (one alert rule)"
        ),
    ],
) -> dict[str, Any]:
    plain_json(body)
    tenant = client.tenant_alerts.whose(who.token.tenant, body.get("tenant"))
    made = await c.monitor_add(tenant, body)
    await audit(c, who, "monitors.create", f"{tenant}/{made.name}", tenant)
    return _shown(c, made, who)


@router.get("/monitors/{name}", summary="A monitor, its newest pings and its state history")
async def monitor_get(
    c: Client, who: Viewer, name: Name, tenant: Tenant = None, limit: Limit = 100
) -> dict[str, Any]:
    whose = path_tenant(who, tenant, f"no monitor {name!r}")
    found = await c.monitor(whose, name)
    return {
        **_shown(c, found, who),
        "pings": [monitor_shapes.ping_dict(p) for p in await c.monitor_pings(found, limit)],
        "history": [monitor_shapes.change_dict(h) for h in await c.monitor_changes(found, limit)],
    }


async def _changed(
    c: client.Client, who: Operator, name: str, tenant: str | None, action: str
) -> dict[str, Any]:
    whose = path_tenant(who, tenant, f"no monitor {name!r}")
    if action == "pause":
        await c.monitor_pause(whose, name)
    elif action == "resume":
        await c.monitor_resume(whose, name)
    else:
        await c.monitor_rotate(whose, name)
    await audit(c, who, f"monitors.{action}", f"{whose}/{name}", whose)
    return _shown(c, await c.monitor(whose, name), who)


@router.post("/monitors/{name}/pause", summary="Pause a monitor: not judged, whatever its pings")
async def monitor_pause(
    c: Client, who: Operator, name: Name, tenant: Tenant = None
) -> dict[str, Any]:
    return await _changed(c, who, name, tenant, "pause")


@router.post("/monitors/{name}/resume", summary="Resume a monitor, counted from now")
async def monitor_resume(
    c: Client, who: Operator, name: Name, tenant: Tenant = None
) -> dict[str, Any]:
    return await _changed(c, who, name, tenant, "resume")


@router.post(
    "/monitors/{name}/rotate",
    summary="Give a monitor a new ping URL: the old one is not found from now",
)
async def monitor_rotate(
    c: Client, who: Operator, name: Name, tenant: Tenant = None
) -> dict[str, Any]:
    return await _changed(c, who, name, tenant, "rotate")


@router.delete(
    "/monitors/{name}", summary="Delete a monitor, its pings, its history and its --channel rule"
)
async def monitor_delete(
    c: Client, who: Operator, name: Name, tenant: Tenant = None
) -> dict[str, Any]:
    whose = path_tenant(who, tenant, f"no monitor {name!r}")
    await c.monitor_delete(whose, name)
    await audit(c, who, "monitors.delete", f"{whose}/{name}", whose)
    return {"deleted": True}


# --- pings ----------------------------------------------------------------------------------

Key = Annotated[str, Path(max_length=36, description="The key of the monitor's ping URL.")]
Action = Annotated[
    str, Path(max_length=10, description="start (a run began), fail, or an exit code (0-255).")
]
PING = ("GET", "HEAD", "POST")
PING_ANSWERS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": what}
    for status, what in (
        (404, "No monitor has this ping URL (a wrong key, or one rotated away)"),
        (413, "The body is too large"),
        (422, "The last part is not start, fail nor an exit code 0-255"),
        (429, "Past 10 pings a second of this monitor: not recorded; Retry-After says when"),
        (503, "The database cannot be reached"),
    )
}


async def ping(request: Request, key: Key) -> Response:
    return await _pinged(request, key, None)


async def ping_action(request: Request, key: Key, action: Action) -> Response:
    return await _pinged(request, key, action)


for _method in PING:  # one route a method: each its own operation in the OpenAPI document
    pings.add_api_route(
        "/ping/{key}",
        ping,
        methods=[_method],
        operation_id=f"ping_{_method.lower()}",
        response_model=dict[str, Any],
        responses=PING_ANSWERS,
        summary="Ping a monitor: its run succeeded",
    )
    pings.add_api_route(
        "/ping/{key}/{action}",
        ping_action,
        methods=[_method],
        operation_id=f"ping_action_{_method.lower()}",
        response_model=dict[str, Any],
        responses=PING_ANSWERS,
        summary="Ping a monitor: its run began (start), failed (fail), or ended with an exit code",
    )


async def _pinged(request: Request, key: str, action: str | None) -> Response:
    """Record the ping: 200 with the monitor's state after it, 404 for a key no monitor
    has, 429 past PINGS_A_SECOND in a second (not recorded)."""
    c = client_of(request)
    body = await request.body() if request.method == "POST" else b""
    done = await c.monitor_ping(
        key,
        action,
        source=_source(request, c),
        user_agent=request.headers.get("user-agent", ""),
        body=body,
    )
    if not done.found:
        raise errors.RequestRefused(404, "path: no monitor has this ping URL")
    if done.limited:
        raise errors.RequestRefused(
            429,
            f"path: at most {monitoring.PINGS_A_SECOND} pings a second per monitor; this one"
            " was not recorded",
            headers={"Retry-After": "1"},
        )
    return answer({"ok": True, "state": done.state})  # written at once: the path is hot


def _source(request: Request, c: client.Client) -> str:
    """The pinging client's address: the peer's, or behind a trusted proxy the one it
    forwards (corral.proxies)."""
    peer = request.client.host if request.client else ""
    trusted = c.settings.api.networks
    if not trusted:
        return peer
    return proxies.client_address(peer, request.headers.getlist("x-forwarded-for"), trusted)
