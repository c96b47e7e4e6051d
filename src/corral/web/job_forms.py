"""The one-off HTTP job form (/ui/jobs/new, sent to POST /ui/jobs/http): a request sent
now, at a time in a zone, or after a delay; and running an ended job again (POST
/ui/jobs/{id}/rerun). A job is never edited: its page offers a copy (/ui/jobs/new?copy=ID,
the form filled from a job the session sees, its secrets redacted and kept unless
replaced) and, once it failed or was cancelled, a rerun.

The form is read into the body `POST /api/v1/jobs` takes, and the client checks it as it
checks the API's (client.bodies.new_job, as a tenant's job): each refusal drawn beside its
field (422), and the tenant's quotas said on the form (403, or 429 with Retry-After).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from corral import access, client, errors, model, tenancy
from corral.web import auth, forms
from corral.web.auth import Operator, Viewer
from corral.web.pages import MAX_ID, JobId, audit, back, page, visible_job
from corral.web.schedule_forms import zones

FIELDS = (
    "tenant", "when", "run_at", "tz", "delay", "allow_past", "method", "url", "headers", "body",
    "json", "expect", *forms.ASSERTIONS, "max_attempts", *forms.POLICY_SHORTCUTS, "queue",
    "pool", "priority", "labels", "payload", "code_version", "policy", "idempotency_key", "flow",
)  # fmt: skip
"""The form's fields: each named as the body's field it fills (forms.py)."""
MORE = (*forms.POLICY_SHORTCUTS, "queue", "pool", "priority", "labels", "payload",
        "code_version", "policy", "idempotency_key", "flow")  # fmt: skip
"""The fields under "More" (opened when one of them is refused)."""
NEW = {"when": "now", "tz": "UTC", "method": "POST", "expect": "2xx", "queue": "default",
       "priority": "0"}  # fmt: skip
"""A new job's form, as `corral submit --http` defaults (but POST, what hooks take)."""

router = APIRouter(prefix="/ui", include_in_schema=False)


def _draw(
    request: Request,
    who: access.WebSession,
    values: dict[str, str],
    errs: forms.Errors,
    *,
    status: int = 200,
    headers: dict[str, str] | None = None,
) -> Response:
    pools = sorted(auth.client_of(request).settings.pools)
    shown = page(
        request, "job_form.html", who, values=values, errors=errs, zones=zones(), pools=pools,
        more_open=bool(set(errs) & set(MORE)), status=status,
    )  # fmt: skip
    shown.headers.update(headers or {})
    return shown


async def _copied(c: client.Client, who: access.WebSession, job_id: int) -> model.Job:
    """The job a copy is made from: one the session sees, of an HTTP request."""
    view = await visible_job(c, who, job_id)
    if view.job.executor != "http":
        raise errors.PageMissing(f"job {job_id} is no HTTP request: the form makes those")
    return view.job


def _template(job: model.Job) -> dict[str, Any]:
    """A job's fields as a template (as forms.template_values and keep_secrets read it)."""
    names = ("executor", "spec", "payload", "queue", "pool", "tenant", "priority",
             "max_attempts", "labels", "policy", "code_version", "flow")  # fmt: skip
    return {name: getattr(job, name) for name in names}


@router.get("/jobs/new")
async def job_new(
    request: Request, who: Viewer, copy: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None
) -> Response:
    """The form, empty or (?copy=ID) filled from a job the session sees."""
    forms.may_act(who)
    c = auth.client_of(request)
    values = dict(NEW)
    if copy is not None:
        job = await _copied(c, who, copy)
        values.update(forms.template_values(_template(job), c.settings), copy=str(copy))
        values["tenant"] = job.tenant
    return _draw(request, who, values, {})


def when_fields(form: dict[str, str], errs: forms.Errors) -> dict[str, Any]:
    """When the job runs, as the body says it: now (nothing), `run_at` (the form's time
    in its zone, with `allow_past` when ticked), or `delay`."""
    when = forms.line(form, "when") or "now"
    if when == "at":
        return {"run_at": forms.run_at(form, errs), "allow_past": form.get("allow_past") == "yes"}
    if when == "delay":
        return {"delay": forms.line(form, "delay")}
    if when != "now":
        errs.setdefault("when", "when: choose now, at a time, or after a delay")
    return {}


@router.post("/jobs/http")
async def job_create(request: Request, acting: Operator) -> Response:
    """A one-off HTTP job of the form, in the session's tenant (a session of every tenant
    names one), to its page; the form again with the errors."""
    c, who, form = auth.client_of(request), acting.who, forms.typed(acting.form)
    errs: forms.Errors = {}
    job = forms.job_fields(form, errs)
    copy = forms.whole(form, "copy", errs)
    stored = _template(await _copied(c, who, copy)) if copy else {}
    forms.keep_secrets(job, stored, errs)
    key = forms.line(form, "idempotency_key") or None
    body = {**job, **when_fields(form, errs), "idempotency_key": key, **forms.tenant_of(who, form)}
    if errs:
        return _draw(request, who, form, errs, status=422)
    try:
        made = await client.bodies.new_job(c, body, acts_for=who.tenant)
        [(job_id, created)] = await c.submit_many([made], limited=True)
    except forms.REFUSALS as exc:
        status, headers = forms.refused(exc, form, FIELDS, errs)
        return _draw(request, who, form, errs, status=status, headers=headers)
    if not created:
        return back(f"/ui/jobs/{job_id}", "job-kept", job=job_id)
    await audit(c, who, "jobs.submit", str(job_id), made.tenant)
    return back(f"/ui/jobs/{job_id}")


@router.post("/jobs/{job_id}/rerun")
async def job_rerun(request: Request, acting: Operator, job_id: JobId) -> Response:
    """A failed or cancelled job run again, as a new job (the same request and options),
    held to its tenant's grant and quotas; to the new job's page."""
    c, who = auth.client_of(request), acting.who
    old = (await visible_job(c, who, job_id)).job
    if old.state not in (model.JobState.FAILED, model.JobState.CANCELLED):
        to = f"/ui/jobs/{job_id}"
        return back(to, "job-unchanged", job=job_id, did="run again", state=old.state)
    try:
        tenancy.check(c.settings.tenants, old.tenant, old.executor)
        made = await c.rerun(job_id, tenant_made=True, limited=True)
    except (errors.InvalidInput, errors.NotGranted, errors.QuotaExceeded) as exc:
        return forms.refused_page(request, who, exc)
    await audit(c, who, "jobs.rerun", str(job_id), old.tenant, new_job=made)
    return back(f"/ui/jobs/{made}", "job-rerun", job=made, old=job_id)
