"""The schedule form, under /ui/schedules: make an HTTP schedule (/ui/schedules/new, sent
to POST /ui/schedules) or change one (/ui/schedules/{tenant}/{name}/edit), with the next
firings of the rule as it is typed (POST /ui/schedules/preview, an htmx fragment).

The form is read into the body `POST /api/v1/schedules` (or its `PATCH`) takes, and the
client checks it as it checks the API's (client.bodies): each refusal drawn beside the
field it names, the form drawn again with what was typed (422; 409 for a name taken, 403
past a quota, 429 with Retry-After past the submit rate). Its *Preview* button draws the
form again with the next firings and saves nothing (the live preview, without
JavaScript). A schedule's template shows its secrets redacted, and a field sent back as
shown keeps them (forms.keep_secrets).

"Once" is no schedule: corral's schedules repeat (a cron or an interval). Chosen here, it
makes a one-off HTTP job at that time, as the job form does, and goes to its page.
"""

from __future__ import annotations

import functools
import zoneinfo
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from starlette.responses import Response

from corral import access, cadence, client, errors, scheduling
from corral.web import auth, forms
from corral.web.auth import Operator, Viewer
from corral.web.pages import audit, back, page, render

PREVIEW_COUNT = 5
"""Next firings the preview shows."""
RULE_FIELDS = (
    "name", "tenant", "when", "cron", "tz", "every", "run_at", "start", "until", "catchup",
    "catchup_window", "catchup_max", "overlap", "jitter", "pause_after",
)  # fmt: skip
FIELDS = (*RULE_FIELDS, "method", "url", "headers", "body", "json", "expect", *forms.ASSERTIONS,
          "max_attempts",
          *forms.POLICY_SHORTCUTS, "queue", "pool", "priority", "labels", "payload",
          "code_version", "policy", "flow")  # fmt: skip
"""The form's fields: each named as the body's field it fills (forms.py)."""
MORE = (
    *forms.POLICY_SHORTCUTS, "catchup", "catchup_window", "catchup_max", "overlap", "jitter",
    "pause_after", "queue", "pool", "priority", "labels", "payload", "code_version", "policy",
    "flow",
)  # fmt: skip
"""The fields under "More" (opened when one of them is refused)."""
NEW = {
    "when": "cron", "tz": "UTC", "method": "GET", "expect": "2xx", "catchup": "none",
    "catchup_window": "7d", "catchup_max": "100", "overlap": "allow", "queue": "default",
    "priority": "0",
}  # fmt: skip
"""A new schedule's form, as `corral schedules add` defaults."""

router = APIRouter(prefix="/ui", include_in_schema=False)


@dataclass
class Preview:
    """The next firings of the rule the form holds, or why there are none."""

    tz: str
    nominals: list[cadence.Nominal] = field(default_factory=list)
    error: str = ""
    once: bool = False


@functools.cache
def zones() -> list[str]:
    """The IANA time zones, for the zone field's suggestions."""
    return sorted(zoneinfo.available_timezones())


def schedule_path(tenant: str, name: str) -> str:
    return f"/ui/schedules/{quote(tenant, safe='')}/{quote(name, safe='')}"


def _draw(
    request: Request,
    who: access.WebSession,
    values: dict[str, str],
    errs: forms.Errors,
    *,
    editing: scheduling.Schedule | None = None,
    status: int = 200,
    headers: dict[str, str] | None = None,
) -> Response:
    """The form, with `values` typed, `errs` beside their fields, and the rule's preview."""
    shown = page(
        request, "schedule_form.html", who, values=values, errors=errs, editing=editing,
        preview=preview_of(auth.client_of(request), values), more_open=bool(set(errs) & set(MORE)),
        zones=zones(), pools=sorted(auth.client_of(request).settings.pools), status=status,
    )  # fmt: skip
    shown.headers.update(headers or {})
    return shown


def preview_of(c: client.Client, form: dict[str, str]) -> Preview | None:
    """The next firings of the form's rule, by client.schedule_preview (None before a
    rule is typed)."""
    tz, when = forms.line(form, "tz") or "UTC", forms.line(form, "when")
    if when == "once":
        return _once_preview(form, tz)
    key = "every" if when == "every" else "cron"
    if not (typed := forms.line(form, key)):
        return None
    given: dict[str, Any] = {key: typed, "tz": tz, "count": PREVIEW_COUNT}
    given.update({k: v for k in ("start", "until") if (v := forms.line(form, k))})
    try:
        return Preview(tz, c.schedule_preview(**client.bodies.preview_arguments(given)))
    except errors.InvalidInput as exc:
        return Preview(tz, error=str(exc))


def _once_preview(form: dict[str, str], tz: str) -> Preview | None:
    """The one time a "once" runs at, or why it cannot (None before one is typed)."""
    if not forms.line(form, "run_at"):
        return None
    errs: forms.Errors = {}
    if (at := forms.run_at(form, errs)) is None:
        return Preview(tz, error=next(iter(errs.values())), once=True)
    instant = cadence.parse_instant(at, "run_at")  # its zone was read already, so it exists
    return Preview(
        tz, [cadence.Nominal(instant, instant.astimezone(zoneinfo.ZoneInfo(tz)))], once=True
    )


def rule_body(form: dict[str, str], errs: forms.Errors, *, creating: bool) -> dict[str, Any]:
    """The schedule's own keys of the body (`corral schedules add`'s options)."""
    when = forms.line(form, "when") or "cron"
    if when not in ("cron", "every"):
        errs.setdefault("when", "when: choose a cron expression or an interval")
    key = "every" if when == "every" else "cron"
    body: dict[str, Any] = {"name": forms.line(form, "name")} if creating else {}
    body[key] = forms.line(form, key)
    body.update(
        tz=forms.line(form, "tz") or "UTC",
        start=forms.line(form, "start") or None,
        until=forms.line(form, "until") or None,
        catchup=forms.line(form, "catchup") or "none",
        catchup_window=forms.line(form, "catchup_window") or "7d",
        catchup_max=100 if (most := forms.whole(form, "catchup_max", errs)) is None else most,
        overlap=forms.line(form, "overlap") or "allow",
        jitter=forms.line(form, "jitter") or None,
        pause_after=forms.whole(form, "pause_after", errs),  # empty: the tenant's default
    )
    return body


@router.get("/schedules/new")
async def schedule_new(request: Request, who: Viewer) -> Response:
    forms.may_act(who)
    return _draw(request, who, dict(NEW), {})


@router.post("/schedules")
async def schedule_create(request: Request, acting: Operator) -> Response:
    """Make the schedule of the form (or, for "once", a one-off job); the form again with
    the errors, or with its preview (do=preview), saving nothing."""
    c, who, form = auth.client_of(request), acting.who, forms.typed(acting.form)
    if form.get("when") == "once":
        return await _once(request, acting)
    errs: forms.Errors = {}
    job = forms.job_fields(form, errs)
    forms.keep_secrets(job, {}, errs)
    body = {**rule_body(form, errs, creating=True), **job, **forms.tenant_of(who, form)}
    if errs or form.get("do") == "preview":
        return _draw(request, who, form, errs, status=422 if errs else 200)
    try:
        made = await client.bodies.schedule_create(c, body, acts_for=who.tenant)
    except forms.REFUSALS as exc:
        status, headers = forms.refused(exc, form, FIELDS, errs)
        return _draw(request, who, form, errs, status=status, headers=headers)
    await audit(c, who, "schedules.create", f"{made.tenant}/{made.name}", made.tenant)
    return back(schedule_path(made.tenant, made.name), "schedule-made", name=made.name)


async def _once(request: Request, acting: auth.Acting) -> Response:
    """Once: a one-off HTTP job at the form's time (corral's schedules repeat), to its page."""
    c, who, form = auth.client_of(request), acting.who, forms.typed(acting.form)
    errs: forms.Errors = {}
    job = forms.job_fields(form, errs)
    forms.keep_secrets(job, {}, errs)
    body = {**job, "run_at": forms.run_at(form, errs), **forms.tenant_of(who, form)}
    if errs or form.get("do") == "preview":
        return _draw(request, who, form, errs, status=422 if errs else 200)
    try:
        made = await client.bodies.new_job(c, body, acts_for=who.tenant)
        [(job_id, _)] = await c.submit_many([made], limited=True)
    except forms.REFUSALS as exc:
        status, headers = forms.refused(exc, form, FIELDS, errs)
        return _draw(request, who, form, errs, status=status, headers=headers)
    await audit(c, who, "jobs.submit", str(job_id), made.tenant)
    return back(f"/ui/jobs/{job_id}", "job-once", job=job_id)


async def visible_schedule(
    c: client.Client, who: access.WebSession, tenant: str, name: str
) -> scheduling.Schedule:
    """The schedule, if the session may see its tenant's; PageMissing (404) otherwise, the
    same as for one that does not exist."""
    if not auth.sees(who, tenant):
        raise errors.PageMissing(f"no schedule {name!r}")
    try:
        return await c.schedule(name, tenant=tenant)
    except errors.NotFound:
        raise errors.PageMissing(f"no schedule {name!r}") from None


def _editable(
    request: Request, who: access.WebSession, found: scheduling.Schedule
) -> Response | None:
    """A page saying why the form cannot change this schedule (its jobs are no HTTP
    requests: `corral schedules update` or the API changes them), or None."""
    if found.template.get("executor") == "http":
        return None
    said = (f"schedule {found.name}'s jobs run on {found.template.get('executor')}, not as HTTP"
            " requests: change it with `corral schedules update` or the API")  # fmt: skip
    return page(request, "error.html", who, status=409, title="Not an HTTP schedule", said=said)


@router.get("/schedules/{tenant}/{name}/edit")
async def schedule_edit(request: Request, who: Viewer, tenant: str, name: str) -> Response:
    forms.may_act(who)
    c = auth.client_of(request)
    found = await visible_schedule(c, who, tenant, name)
    if (refusal := _editable(request, who, found)) is not None:
        return refusal
    values = {**forms.rule_values(found), **forms.template_values(found.template, c.settings)}
    return _draw(request, who, values, {}, editing=found)


@router.post("/schedules/{tenant}/{name}/edit")
async def schedule_save(request: Request, acting: Operator, tenant: str, name: str) -> Response:
    """Change the schedule as the form says (every field replaces its own); secrets left
    as shown stay. The form again with the errors, or with its preview."""
    c, who, form = auth.client_of(request), acting.who, forms.typed(acting.form)
    found = await visible_schedule(c, who, tenant, name)
    if (refusal := _editable(request, who, found)) is not None:
        return refusal
    errs: forms.Errors = {}
    job = forms.job_fields(form, errs)
    forms.keep_secrets(job, found.template, errs)
    body = {**rule_body(form, errs, creating=False), **job}
    form["name"] = found.name
    if errs or form.get("do") == "preview":
        return _draw(request, who, form, errs, editing=found, status=422 if errs else 200)
    try:
        await client.bodies.schedule_update(c, found, body, acts_for=who.tenant)
    except forms.REFUSALS as exc:
        status, headers = forms.refused(exc, form, FIELDS, errs)
        return _draw(request, who, form, errs, editing=found, status=status, headers=headers)
    await audit(c, who, "schedules.update", f"{tenant}/{name}", tenant, keys=sorted(body))
    return back(schedule_path(tenant, name), "schedule-saved", name=name)


@router.post("/schedules/preview")
async def schedule_preview(request: Request, acting: Operator) -> Response:
    """The preview of the form's rule, alone (htmx swaps it into #preview as it is typed)."""
    shown = preview_of(auth.client_of(request), forms.typed(acting.form))
    html = render(request, "schedule_preview.html", acting.who, preview=shown)
    return Response(html, media_type="text/html")
