"""The jobs pages, under /ui/jobs: the list with its filters, a page each with its
attempts as a timeline and its run log (updated live), the command form, the actions on a
job, and the quarantined jobs (/ui/dead)."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from corral import access, client, errors, model, shapes, tenancy
from corral.web import auth, live
from corral.web.auth import Operator, Viewer
from corral.web.pages import (
    MAX_ID,
    QUARANTINED_SHOWN,
    JobId,
    audit,
    back,
    local,
    page,
    render,
    visible_job,
)

JOBS_PAGE = 50
"""Jobs on one page of the list."""
EVENTS_LOOKED = 100
"""The most of a job's new events one look of its live page reads (it only needs to see
that there are some)."""
J = model.JobState

router = APIRouter(prefix="/ui", include_in_schema=False)


@dataclasses.dataclass(frozen=True)
class Filters:
    """The job list's filters, as the query string gives them."""

    state: str = ""
    queue: str = ""
    label: str = ""

    def query(self, **more: Any) -> str:
        given = {**dataclasses.asdict(self), **more}
        return urlencode({k: v for k, v in given.items() if v not in ("", None)})


@router.get("/jobs")
async def jobs(
    request: Request,
    who: Viewer,
    state: str = "",
    queue: str = "",
    label: str = "",
    before: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
) -> Response:
    """Jobs, the newest first, a page at a time (keyset: ?before=<id>)."""
    return await _jobs_page(request, who, state=state, queue=queue, label=label, before=before)


async def _jobs_page(
    request: Request,
    who: access.WebSession,
    *,
    state: str = "",
    queue: str = "",
    label: str = "",
    before: int | None = None,
    wrong: str = "",
    status: int = 200,
) -> Response:
    """The jobs page, saying `wrong` (a refused form's reason) when there is one."""
    c = auth.client_of(request)
    filters = Filters(state=state, queue=queue, label=label)
    key, _, value = label.partition("=")
    wrong = _wrong_filter(state, label) or wrong
    found: list[model.Job] = []
    if not wrong:
        given = model.JobFilter(
            states=[state] if state else [],
            queue=queue or None,
            tenant=who.tenant,
            labels={key: value} if label else {},
        )
        found = await c.jobs(given, before=before, limit=JOBS_PAGE)
    more = found[-1].id if len(found) == JOBS_PAGE else None
    return page(
        request,
        "jobs.html",
        who,
        jobs=found,
        filters=filters,
        wrong=wrong,
        next_page=filters.query(before=more) if more else None,
        states=list(model.JobState),
        commands=tenancy.offered(c.settings.tenants, who.tenant, "process"),
        status=status,
    )


def _wrong_filter(state: str, label: str) -> str:
    """Why the jobs page's filter is refused, or "" when it is not."""
    key = label.partition("=")[0]
    if state and state not in model.JobState.__members__.values():
        return f"state: {state!r} is not a job state"
    if label and not (key and "=" in label):
        return f"label: {label!r} is not KEY=VALUE"
    return ""


@router.post("/jobs")
async def job_submit(request: Request, acting: Operator) -> Response:
    """A shell command as a job of the process executor, in the session's tenant: refused
    (403) unless that tenant is granted `process`; held to the tenant's quotas (refused
    on the page itself: 403 past a count, 429 with Retry-After past its submit_rate)."""
    c, who, form = auth.client_of(request), acting.who, acting.form
    command = form.get("command", "").strip()
    tenant = who.tenant or form.get("tenant", "").strip() or "default"
    if not command:
        return back("/ui/jobs", "command-missing")
    if (why := tenancy.refusal(c.settings.tenants, tenant, "process")) is not None:
        raise errors.Forbidden(why)
    try:
        job = c.new_job(
            spec={"command": ["sh", "-c", command]},
            queue=form.get("queue", "").strip() or "default",
            tenant=tenant,
        )
        made = c.validate(dataclasses.replace(job, tenant_made=True))  # runs as a stranger
        [(job_id, _)] = await c.submit_many([made], limited=True)
    except errors.InvalidInput as exc:  # shown on the page itself, never through a link
        return await _jobs_page(request, who, wrong=str(exc), status=422)
    except errors.QuotaExceeded as exc:
        return await _over_quota(request, who, exc)
    await audit(c, who, "jobs.submit", str(job_id), tenant)
    return back(f"/ui/jobs/{job_id}")


async def _over_quota(
    request: Request, who: access.WebSession, exc: errors.QuotaExceeded
) -> Response:
    """The jobs page saying which quota refused the form: 403 past a count, 429 past the
    submit_rate, with Retry-After."""
    if isinstance(exc, errors.RateLimited):
        shown = await _jobs_page(request, who, wrong=str(exc), status=429)
        shown.headers["Retry-After"] = str(exc.retry_after)
        return shown
    return await _jobs_page(request, who, wrong=str(exc), status=403)


@router.get("/jobs/{job_id}")
async def job(request: Request, who: Viewer, job_id: JobId) -> Response:
    view = await visible_job(auth.client_of(request), who, job_id)
    return page(request, "job.html", who, **await _job_values(request, view))


@router.get("/jobs/{job_id}/stream")
async def job_stream(request: Request, who: Viewer, job_id: JobId) -> Response:
    """The part of a job's page that changes, pushed each time the job has a new event or
    a running process has written more (live.py), until the job has stopped."""
    c = auth.client_of(request)
    await visible_job(c, who, job_id)
    cursor, running = 0, True

    async def look() -> tuple[int, tuple[tuple[int, str, str], ...]]:
        nonlocal cursor
        ids, _ = await c.event_page(after=cursor, limit=EVENTS_LOOKED, job_id=job_id)
        cursor = ids[-1] if ids else cursor
        return cursor, (await _output_now(c, job_id) if running else ())

    async def draw() -> live.Drawn:
        nonlocal running
        values = await _job_values(request, await visible_job(c, who, job_id))
        running = any(a.state in model.ACTIVE_ATTEMPT_STATES for a, _ in values["attempts"])
        html = render(request, "job_live.html", who, **values)
        return live.Drawn({"live": html}, goes_on=values["goes_on"])

    return live.stream(request, look, draw)


async def _output_now(c: client.Client, job_id: int) -> tuple[tuple[int, str, str], ...]:
    """What the job's running process has written so far, when this machine runs it."""
    found = [
        (part.attempt.id, part.stream, part.text)
        async for part in c.follow(job_id, once=True)
        if part.stream and part.attempt.state in model.ACTIVE_ATTEMPT_STATES
    ]
    return tuple(found)


async def _job_values(request: Request, view: client.jobs.JobView) -> dict[str, Any]:
    c = auth.client_of(request)
    return {
        "job": view.job,
        "attempts": [(a, view.logs.get(a.id)) for a in view.attempts],
        "output": await _running_output(c, view),
        "events": view.events,
        "goes_on": view.job.state in (J.SCHEDULED, J.QUEUED, J.RUNNING, J.PARKED),
        "explained": client.explain.why(view, c.clock.now()),
        "trimmed": shapes.TRIMMED,
    }


async def _running_output(c: client.Client, view: client.jobs.JobView) -> dict[int, list[Any]]:
    """What each running attempt has written so far, by fence: read from its run folder
    when this machine has it (a process's stdout and stderr, their last part)."""
    if not any(a.state in model.ACTIVE_ATTEMPT_STATES for a in view.attempts):
        return {}
    found: dict[int, list[Any]] = {}
    async for part in c.follow(view.job.id, once=True):
        if part.stream and part.attempt.state in model.ACTIVE_ATTEMPT_STATES:
            found.setdefault(part.attempt.id, []).append(part)
    return found


_ACTIONS = {
    "cancel": ("jobs.cancel", "cancelled"),
    "retry": ("jobs.retry", "sent back to its queue"),
    "discard": ("jobs.discard", "discarded"),
}


@router.post("/jobs/{job_id}/{action}")
async def job_change(request: Request, acting: Operator, job_id: JobId, action: str) -> Response:
    """Cancel a job, or retry or discard a quarantined one; back to where the form was."""
    if action not in _ACTIONS:
        raise errors.PageMissing(f"no action {action!r}")
    c, who = auth.client_of(request), acting.who
    view = await visible_job(c, who, job_id)
    reason = f"{action} on the dashboard by {who.name}"
    to = local(acting.form.get("back", "")) if acting.form.get("back") else f"/ui/jobs/{job_id}"
    try:
        if action == "cancel":
            await c.cancel(job_id, reason=reason)
        elif action == "retry":
            await c.dead_retry(job_id, reason=reason)
        else:
            await c.dead_discard(job_id, reason=reason)
    except (errors.InvalidInput, errors.IllegalTransition):
        now = (await c.job(job_id)).job.state
        return back(to, "job-unchanged", job=job_id, did=_ACTIONS[action][1], state=now)
    await audit(c, who, _ACTIONS[action][0], str(job_id), view.job.tenant)
    return back(to, "job-changed", job=job_id, did=_ACTIONS[action][1])


@router.get("/dead")
async def dead(
    request: Request, who: Viewer, before: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None
) -> Response:
    """Quarantined jobs, the newest first, each with why it was quarantined."""
    c = auth.client_of(request)
    quarantined = model.JobFilter(states=[J.QUARANTINED], tenant=who.tenant)
    found = await c.jobs(quarantined, before=before, limit=QUARANTINED_SHOWN)
    views = [await c.job(j.id) for j in found]
    shown = [(v.job, client.explain.why(v, c.clock.now())) for v in views]
    more = found[-1].id if len(found) == QUARANTINED_SHOWN else None
    return page(request, "dead.html", who, jobs=shown, next_page=more)
