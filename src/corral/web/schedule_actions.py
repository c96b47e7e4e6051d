"""What an operator does to a schedule from its page (templates/schedule_actions.html) or
the schedules list: pause, resume, run now, duplicate and delete, each a POST form under
/ui/schedules/{tenant}/{name}/, audited, answered with a redirect and a note.

Delete asks first: its form without `confirmed` draws a page that says what goes (the
schedule and its firings; the jobs it made stay) with the form that deletes, so it needs
no script. Duplicate takes the copy's name, `new_name`; a refused one is drawn again
beside its field. Run now and duplicate are held to the tenant's grant and quotas, as
the API's are. Another tenant's schedule is not found (404) by every action.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from corral import access, client, errors, scheduling
from corral.web import auth, forms
from corral.web.auth import Operator
from corral.web.pages import audit, back, local, page
from corral.web.schedule_forms import schedule_path, visible_schedule

router = APIRouter(prefix="/ui", include_in_schema=False)


def _back_to(acting: auth.Acting, default: str) -> str:
    """Where the form asked to go next (its `next`: a dashboard page only), else `default`."""
    asked = acting.form.get("next", "")
    return local(asked) if asked else default


@router.post("/schedules/{tenant}/{name}/pause")
async def schedule_pause(request: Request, acting: Operator, tenant: str, name: str) -> Response:
    c, who = auth.client_of(request), acting.who
    await visible_schedule(c, who, tenant, name)
    await c.schedule_pause(name, tenant=tenant)
    await audit(c, who, "schedules.pause", f"{tenant}/{name}", tenant)
    return back(_back_to(acting, "/ui/schedules"), "schedule-changed", name=name, did="paused")


@router.post("/schedules/{tenant}/{name}/resume")
async def schedule_resume(request: Request, acting: Operator, tenant: str, name: str) -> Response:
    """Resume: what passed while it was paused is recorded as skipped, never fired."""
    c, who = auth.client_of(request), acting.who
    await visible_schedule(c, who, tenant, name)
    await c.schedule_resume(name, tenant=tenant)
    await audit(c, who, "schedules.resume", f"{tenant}/{name}", tenant)
    return back(_back_to(acting, "/ui/schedules"), "schedule-changed", name=name, did="resumed")


@router.post("/schedules/{tenant}/{name}/trigger")
async def schedule_trigger(request: Request, acting: Operator, tenant: str, name: str) -> Response:
    """Run now: fire the schedule outside its times (its next time stays); back to its
    page, saying the job it made."""
    c, who = auth.client_of(request), acting.who
    found = await visible_schedule(c, who, tenant, name)
    try:
        client.bodies.granted(c, found.tenant, found.template)
        job_id = await c.schedule_trigger(name, tenant=tenant, limited=True)
    except (errors.NotGranted, errors.QuotaExceeded, errors.FieldRefused) as exc:
        return forms.refused_page(request, who, exc)
    await audit(c, who, "schedules.trigger", f"{tenant}/{name}", tenant, job_id=job_id)
    return back(schedule_path(tenant, name), "schedule-fired", name=name, job=job_id)


@router.post("/schedules/{tenant}/{name}/duplicate")
async def schedule_duplicate(
    request: Request, acting: Operator, tenant: str, name: str
) -> Response:
    """A copy named `new_name` (its rule, options and job template, secrets too), to its
    page; a name refused (taken, or not a name), drawn again beside its field."""
    c, who = auth.client_of(request), acting.who
    found = await visible_schedule(c, who, tenant, name)
    new_name = forms.line(acting.form, "new_name")
    try:
        client.bodies.granted(c, found.tenant, found.template)
        made = await c.schedule_duplicate(
            name, new_name, tenant=tenant, tenant_made=True, limited=True
        )
    except errors.InvalidInput as exc:  # the name: taken (409) or not a name (422)
        return _copy_again(request, who, found, new_name, exc)
    except (errors.NotGranted, errors.QuotaExceeded, errors.FieldRefused) as exc:
        return forms.refused_page(request, who, exc)
    await audit(c, who, "schedules.duplicate", f"{tenant}/{made.name}", tenant, source=name)
    return back(schedule_path(tenant, made.name), "schedule-copied", name=made.name, source=name)


def _copy_again(
    request: Request,
    who: access.WebSession,
    found: scheduling.Schedule,
    new_name: str,
    exc: errors.InvalidInput,
) -> Response:
    """The duplicate form alone, with the name typed and why it was refused."""
    said = str(exc)
    if said.startswith("name:"):  # the copy's name is this form's new_name
        said = "new_name:" + said.removeprefix("name:")
    status = 409 if isinstance(exc, errors.Conflict) else 422
    return page(
        request, "schedule_copy.html", who, schedule=found, values={"new_name": new_name},
        errors={"new_name": said}, path=schedule_path(found.tenant, found.name), status=status,
    )  # fmt: skip


@router.post("/schedules/{tenant}/{name}/delete")
async def schedule_delete(request: Request, acting: Operator, tenant: str, name: str) -> Response:
    """Without `confirmed`: the page that asks. With it: the schedule and its firings
    deleted (the jobs it made stay), to the schedules list."""
    c, who = auth.client_of(request), acting.who
    found = await visible_schedule(c, who, tenant, name)
    if acting.form.get("confirmed") != "yes":
        path = schedule_path(tenant, name)
        return page(request, "schedule_delete.html", who, schedule=found, path=path)
    await c.schedule_delete(name, tenant=tenant)
    await audit(c, who, "schedules.delete", f"{tenant}/{name}", tenant)
    return back("/ui/schedules", "schedule-deleted", name=name)
