"""The alerts a tenant owns, under /ui/alerts: its channels (their web URL shown as the
API lists it, origin and [redacted], never whole) and its rules; for an operator, the
forms that add a channel (slack, webhook or email), send a test through one (at most 5 a
minute a tenant), add a rule and delete either, each through the client, audited, and
answered with a redirect and a note. A refused form is drawn again, its error beside
the field it names (422 for the client's checks, 409 for a name taken or a limit, 429
with Retry-After for the tests).

A session of one tenant sees its own; one of every tenant picks the tenant with
?tenant=NAME (a form's `tenant` field; default: default). Another tenant's channel or
rule is not found (404) by every form.

The forms' inputs are named as the body's fields, but for the names: a channel's is
`channel`, a rule's `rule`, and the rule's match is `schedule`, `queue` and `labels`
(one key=value a line), so that both forms live on one page.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs, urlencode

from fastapi import APIRouter, Request
from starlette.responses import Response

from corral import access, alert_settings, errors, shapes
from corral.web import auth, forms
from corral.web.auth import Operator, Viewer
from corral.web.pages import audit, back, page

router = APIRouter(prefix="/ui", include_in_schema=False)

CHANNEL_FIELDS = ("channel", "kind", "webhook_url", "url", "secret", "to")
RULE_FIELDS = ("rule", "on", "channels", "schedule", "queue", "labels", "throttle", "after")
KINDS = (("slack", "slack: a Slack incoming webhook"), ("webhook", "webhook: a signed POST"),
         ("email", "email: through the operator's SMTP server"))  # fmt: skip


def whose(who: access.WebSession, given: str) -> str:
    """The tenant the page or form is of: the session's own (another's is not found), or
    for a session of every tenant the one it names (default: default)."""
    if who.tenant is None:
        return given or "default"
    if given not in ("", who.tenant):
        raise errors.PageMissing(f"no tenant {given!r}")
    return who.tenant


def here(who: access.WebSession, tenant: str) -> str:
    """The page's address: with ?tenant= for a session of every tenant."""
    return "/ui/alerts" if who.tenant is not None else f"/ui/alerts?{urlencode({'tenant': tenant})}"


@router.get("/alerts")
async def alerts_page(request: Request, who: Viewer, tenant: str = "") -> Response:
    """The tenant's channels and rules, and for an operator the forms."""
    return await drawn(request, who, whose(who, tenant))


async def drawn(
    request: Request,
    who: access.WebSession,
    tenant: str,
    *,
    values: Mapping[str, Any] | None = None,
    errs: forms.Errors | None = None,
    status: int = 200,
) -> Response:
    """The page, with a refused form's values and errors."""
    c = auth.client_of(request)
    channels = [shapes.tenant_channel_dict(ch) for ch in await c.tenant_channels(tenant)]
    rules = [shapes.tenant_rule_dict(r, None) for r in await c.tenant_rules(tenant)]
    return page(
        request, "alerts.html", who, tenant=tenant, channels=channels, rules=rules,
        causes=alert_settings.ALERT_CAUSES, kinds=KINDS, values=dict(values or {"kind": "slack"}),
        errors=errs or {}, path=here(who, tenant), status=status,
    )  # fmt: skip


async def _lists(request: Request) -> dict[str, list[str]]:
    """A form's fields given more than once (its checkboxes), every value of each."""
    body = (await request.body()).decode("utf-8", "replace")
    return parse_qs(body, keep_blank_values=False)


def _field(message: str, fields: tuple[str, ...], own_name: str) -> str:
    """The form field a refusal names: `name` is the form's own name field, a match's
    key its input; FORM for one the form has no input of."""
    head = message.partition(":")[0].strip()
    head = head.removeprefix("match.").partition(".")[0]
    head = own_name if head == "name" else head
    return head if head in fields else forms.FORM


async def _refused(
    request: Request,
    who: access.WebSession,
    tenant: str,
    exc: errors.CorralError,
    values: Mapping[str, Any],
    place: tuple[tuple[str, ...], str],
) -> Response:
    """The page again, `exc` beside the field of `place` (the form's fields, its name
    field) it names: 422, 409 for a name taken or a limit, 429 with Retry-After."""
    errs = {_field(str(exc), *place): str(exc)}
    status = 429 if isinstance(exc, errors.RateLimited) else 422
    status = 409 if isinstance(exc, errors.Conflict) else status
    shown = await drawn(request, who, tenant, values=values, errs=errs, status=status)
    if isinstance(exc, errors.RateLimited):
        shown.headers["Retry-After"] = str(exc.retry_after)
    return shown


# --- channels ----------------------------------------------------------------------------


def channel_body(form: Mapping[str, str]) -> dict[str, Any]:
    """The API's body of the channel form: the name, the kind, and that kind's fields
    (an e-mail channel's addresses one a line or comma-separated)."""
    kind = forms.line(form, "kind")
    body: dict[str, Any] = {"name": forms.line(form, "channel"), "kind": kind}
    if kind == "slack":
        body["webhook_url"] = forms.line(form, "webhook_url")
    elif kind == "webhook":
        body["url"] = forms.line(form, "url")
        if secret := forms.line(form, "secret"):
            body["secret"] = secret
    elif kind == "email":
        given = forms.lines(form, "to").replace(",", "\n").split("\n")
        body["to"] = [a.strip() for a in given if a.strip()]
    return body


@router.post("/alerts/channels")
async def channel_add(request: Request, acting: Operator) -> Response:
    c, who, form = auth.client_of(request), acting.who, acting.form
    tenant = whose(who, forms.line(form, "tenant"))
    try:
        made = await c.tenant_channel_add(tenant, channel_body(form))
    except errors.InvalidInput as exc:  # Conflict (409) is one too
        shown = {k: v for k, v in form.items() if k not in ("csrf", "secret")}
        return await _refused(request, who, tenant, exc, shown, (CHANNEL_FIELDS, "channel"))
    await audit(c, who, "alerts.channels.create", f"{tenant}/{made.name}", tenant, kind=made.kind)
    return back(here(who, tenant), "alert-channel-made", name=made.name)


@router.post("/alerts/channels/{name}/test")
async def channel_test(request: Request, acting: Operator, name: str) -> Response:
    """A test message through the channel now: the note says how it went."""
    c, who = auth.client_of(request), acting.who
    tenant = whose(who, forms.line(acting.form, "tenant"))
    try:
        sent = await c.tenant_channel_test(tenant, name)
    except errors.NotFound:
        raise errors.PageMissing(f"no alert channel {name!r}") from None
    except errors.RateLimited as exc:
        return await _refused(request, who, tenant, exc, {}, ((), ""))
    await audit(c, who, "alerts.channels.test", f"{tenant}/{name}", tenant, state=sent.state)
    return back(here(who, tenant), "alert-channel-tested", name=name, state=sent.state)


@router.post("/alerts/channels/{name}/delete")
async def channel_delete(request: Request, acting: Operator, name: str) -> Response:
    """Delete the channel; refused (409) while one of the tenant's rules sends to it."""
    c, who = auth.client_of(request), acting.who
    tenant = whose(who, forms.line(acting.form, "tenant"))
    try:
        await c.tenant_channel_delete(tenant, name)
    except errors.NotFound:
        raise errors.PageMissing(f"no alert channel {name!r}") from None
    except errors.Conflict as exc:
        return await _refused(request, who, tenant, exc, {}, ((), ""))
    await audit(c, who, "alerts.channels.delete", f"{tenant}/{name}", tenant)
    return back(here(who, tenant), "alert-channel-deleted", name=name)


# --- rules -------------------------------------------------------------------------------


def rule_body(
    form: Mapping[str, str], lists: Mapping[str, list[str]], errs: forms.Errors
) -> dict[str, Any]:
    """The API's body of the rule form: its causes and channels (checkboxes), the match
    given (schedule, queue, labels), its throttle and after when given."""
    body: dict[str, Any] = {
        "name": forms.line(form, "rule"),
        "on": lists.get("on", []),
        "channels": lists.get("channels", []),
    }
    match: dict[str, Any] = {k: v for k in ("schedule", "queue") if (v := forms.line(form, k))}
    labels = {}
    for n, row in enumerate(forms.lines(form, "labels").split("\n"), start=1):
        key, eq, value = row.strip().partition("=")
        if row.strip() and (not eq or not key.strip()):
            errs.setdefault("labels", f"labels: line {n}, {row.strip()!r}: write key=value")
        elif row.strip():
            labels[key.strip()] = value.strip()
    if labels:
        match["labels"] = labels
    if match:
        body["match"] = match
    if throttle := forms.line(form, "throttle"):
        body["throttle"] = throttle
    if (after := forms.whole(form, "after", errs)) is not None:
        body["after"] = after
    return body


@router.post("/alerts/rules")
async def rule_add(request: Request, acting: Operator) -> Response:
    c, who, form = auth.client_of(request), acting.who, acting.form
    tenant = whose(who, forms.line(form, "tenant"))
    lists = await _lists(request)
    errs: forms.Errors = {}
    body = rule_body(form, lists, errs)
    shown: dict[str, Any] = {**form, "on": lists.get("on", []),
                             "channels": lists.get("channels", [])}  # fmt: skip
    if errs:
        return await drawn(request, who, tenant, values=shown, errs=errs, status=422)
    try:
        made = await c.tenant_rule_add(tenant, body)
    except errors.InvalidInput as exc:  # Conflict (409) is one too
        return await _refused(request, who, tenant, exc, shown, (RULE_FIELDS, "rule"))
    await audit(c, who, "alerts.rules.create", f"{tenant}/{made.name}", tenant)
    return back(here(who, tenant), "alert-rule-made", name=made.name)


@router.post("/alerts/rules/{name}/delete")
async def rule_delete(request: Request, acting: Operator, name: str) -> Response:
    c, who = auth.client_of(request), acting.who
    tenant = whose(who, forms.line(acting.form, "tenant"))
    try:
        await c.tenant_rule_delete(tenant, name)
    except errors.NotFound:
        raise errors.PageMissing(f"no alert rule {name!r}") from None
    await audit(c, who, "alerts.rules.delete", f"{tenant}/{name}", tenant)
    return back(here(who, tenant), "alert-rule-deleted", name=name)
