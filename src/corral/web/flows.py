"""The flows a tenant owns, under /ui/flows: each one's rate and parallelism, its hold (a
Retry-After's, shown while it lasts), and what it uses now (its starts in its window, its
jobs running), read through the client; and a page per flow, /ui/flows/TENANT/NAME.

For an operator, the forms that add a flow (its name, rate and parallelism), change its
limits (on its page: every field replaces its own, empty for none) and delete it, each
through the client (corral.client.flows), audited, and answered with a redirect and a
note, as `corral flows` and the API do. A refused form is drawn again, its error beside
the field it names (422 for the client's checks, 409 for a name taken, the tenant's most
flows, or a deletion while a job or a schedule names the flow).

A session of one tenant sees its own; one of every tenant picks the tenant with
?tenant=NAME (the add form's `tenant` field; default: default). Another tenant's flow is
not found (404) by every page and form.

The add form's inputs are `flow` (the body's `name`), `rate` and `parallelism`; the change
form's `rate` and `parallelism`.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Request
from starlette.responses import Response

from corral import access, errors, shapes
from corral import flows as flow_rules
from corral.web import auth, forms, tenant_alerts
from corral.web.auth import Operator, Viewer
from corral.web.pages import audit, back, page

router = APIRouter(prefix="/ui", include_in_schema=False)

ADD_FIELDS = ("flow", "rate", "parallelism")
"""The add form's fields (`flow` is the body's `name`)."""
CHANGE_FIELDS = ("rate", "parallelism")


def here(who: access.WebSession, tenant: str) -> str:
    """The list's address: with ?tenant= for a session of every tenant."""
    return "/ui/flows" if who.tenant is not None else f"/ui/flows?{urlencode({'tenant': tenant})}"


def flow_path(tenant: str, name: str) -> str:
    return f"/ui/flows/{quote(tenant, safe='')}/{quote(name, safe='')}"


def _shown(
    found: flow_rules.Flow, use: flow_rules.Use, now: datetime, *, page_of: bool = False
) -> dict[str, Any]:
    """A flow as its row (or its page) shows it: a hold only while it lasts; on its page,
    why its jobs wait now, if they do."""
    shown = shapes.flow_dict(found, use)
    shown |= {"held": found.held(now), "path": flow_path(found.tenant, found.name)}
    if page_of:
        shown["waits"] = flow_rules.why_waiting(found, use, now)
    return shown


@router.get("/flows")
async def flows_page(request: Request, who: Viewer, tenant: str = "") -> Response:
    """The tenant's flows, with what each uses now, and for an operator the add form."""
    return await drawn(request, who, tenant_alerts.whose(who, tenant))


async def drawn(
    request: Request,
    who: access.WebSession,
    tenant: str,
    *,
    values: Mapping[str, Any] | None = None,
    errs: forms.Errors | None = None,
    status: int = 200,
) -> Response:
    """The list, with a refused form's values and errors."""
    c = auth.client_of(request)
    now = c.clock.now()
    shown = [_shown(*await c.flow(tenant, f.name), now) for f in await c.flows(tenant)]
    return page(
        request, "flows.html", who, tenant=tenant, flows=shown, values=dict(values or {}),
        errors=errs or {}, status=status,
    )  # fmt: skip


def _field(message: str, fields: tuple[str, ...]) -> str:
    """The form field a refusal names (the body's `name` is the add form's `flow`), or
    forms.FORM for one the form has no input of."""
    head = message.partition(":")[0].strip()
    head = "flow" if head == "name" else head
    return head if head in fields else forms.FORM


def _status(exc: errors.CorralError) -> int:
    return 409 if isinstance(exc, errors.Conflict) else 422


def _limits(form: Mapping[str, str], *, adding: bool) -> dict[str, Any]:
    """The body's limits of the form: a field left empty is none (when adding, left out)."""
    given = {k: forms.line(form, k) or None for k in CHANGE_FIELDS}
    return {k: v for k, v in given.items() if v is not None} if adding else given


@router.post("/flows")
async def flow_add(request: Request, acting: Operator) -> Response:
    """Make the tenant's flow of the form; the list again with the error beside its field."""
    c, who, form = auth.client_of(request), acting.who, acting.form
    tenant = tenant_alerts.whose(who, forms.line(form, "tenant"))
    body = {"name": forms.line(form, "flow"), **_limits(form, adding=True)}
    try:
        made = await c.flow_add(tenant, body)
    except errors.InvalidInput as exc:  # Conflict (409) is one too
        errs = {_field(str(exc), ADD_FIELDS): str(exc)}
        shown = {k: v for k, v in form.items() if k != "csrf"}
        return await drawn(request, who, tenant, values=shown, errs=errs, status=_status(exc))
    await audit(c, who, "flows.create", f"{tenant}/{made.name}", tenant, **_said(made))
    return back(here(who, tenant), "flow-made", name=made.name)


def _said(found: flow_rules.Flow) -> dict[str, Any]:
    """A flow's limits, as its audit row's details say them."""
    return {"rate": None if found.rate is None else str(found.rate),
            "parallelism": found.parallelism}  # fmt: skip


def _whose(who: access.WebSession, tenant: str, name: str) -> str:
    """The tenant of a flow's address, if the session sees it; PageMissing (404) if not."""
    if not auth.sees(who, tenant):
        raise errors.PageMissing(f"no flow {name!r}")
    return tenant


async def _flow(
    request: Request, who: access.WebSession, tenant: str, name: str
) -> tuple[flow_rules.Flow, flow_rules.Use]:
    """The flow, if the session sees its tenant's; PageMissing (404) otherwise, the same
    as for one that does not exist."""
    try:
        return await auth.client_of(request).flow(_whose(who, tenant, name), name)
    except errors.NotFound:
        raise errors.PageMissing(f"no flow {name!r}") from None


async def _flow_drawn(
    request: Request,
    who: access.WebSession,
    tenant: str,
    name: str,
    *,
    values: Mapping[str, Any] | None = None,
    errs: forms.Errors | None = None,
    status: int = 200,
) -> Response:
    """The flow's page, its change form filled with its limits (or what was typed)."""
    found, use = await _flow(request, who, tenant, name)
    shown = _shown(found, use, auth.client_of(request).clock.now(), page_of=True)
    held = {k: shown[k] or "" for k in CHANGE_FIELDS}
    return page(
        request, "flow.html", who, flow=shown, values=dict(values or held), errors=errs or {},
        status=status,
    )  # fmt: skip


@router.get("/flows/{tenant}/{name}")
async def flow_page(request: Request, who: Viewer, tenant: str, name: str) -> Response:
    """One flow: its limits, what it uses now, and for an operator the change form."""
    return await _flow_drawn(request, who, tenant, name)


@router.post("/flows/{tenant}/{name}/edit")
async def flow_change(request: Request, acting: Operator, tenant: str, name: str) -> Response:
    """Change the flow's limits as the form says (empty: none); its page again with the
    error beside its field."""
    c, who, form = auth.client_of(request), acting.who, acting.form
    found, _ = await _flow(request, who, tenant, name)
    try:
        changed = await c.flow_update(found.tenant, found.name, _limits(form, adding=False))
    except errors.NotFound:  # deleted meanwhile
        raise errors.PageMissing(f"no flow {name!r}") from None
    except errors.InvalidInput as exc:
        errs = {_field(str(exc), CHANGE_FIELDS): str(exc)}
        shown = {k: v for k, v in form.items() if k != "csrf"}
        return await _flow_drawn(request, who, tenant, name, values=shown, errs=errs,
                                 status=_status(exc))  # fmt: skip
    target = f"{found.tenant}/{found.name}"
    await audit(c, who, "flows.update", target, found.tenant, **_said(changed))
    return back(flow_path(found.tenant, found.name), "flow-changed", name=found.name)


@router.post("/flows/{tenant}/{name}/delete")
async def flow_delete(request: Request, acting: Operator, tenant: str, name: str) -> Response:
    """Delete the flow; refused (409, shown above the list) while a job of it has not ended
    or a schedule names it."""
    c, who = auth.client_of(request), acting.who
    whose = _whose(who, tenant, name)
    try:
        await c.flow_delete(whose, name)
    except errors.NotFound:
        raise errors.PageMissing(f"no flow {name!r}") from None
    except errors.Conflict as exc:
        errs = {forms.FORM: str(exc).removeprefix("name: ")}
        return await drawn(request, who, whose, errs=errs, status=409)
    await audit(c, who, "flows.delete", f"{whose}/{name}", whose)
    return back(here(who, whose), "flow-deleted", name=name)
