"""The jobs pages, under /ui/jobs: the list with its filters (each job's target, schedule,
last run and next), a page each with what the job sends and when (sends.py), its attempts
as a timeline and its run log (updated live), the command form, the actions on a job, and
the quarantined jobs (/ui/dead)."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from corral import access, client, errors, model, shapes, tenancy
from corral.web import auth, live, sends
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
    schedule: str = ""
    url: str = ""
    label: str = ""
    queue: str = ""

    def query(self, **more: Any) -> str:
        given = {**dataclasses.asdict(self), **more}
        return urlencode({k: v for k, v in given.items() if v not in ("", None)})

    def bulk_query(self, action: str) -> str | None:
        """The bulk preview's query for these filters, or None when one it does not take
        (schedule, url) is given: it would act on more jobs than the list shows."""
        if self.schedule or self.url:
            return None
        taken = {name: getattr(self, name) for name in BULK}
        return urlencode({k: v for k, v in taken.items() if v} | {"action": action})

    def matching(self, tenant: str | None) -> model.JobFilter:
        """The filter these say, for `tenant`'s session (None: every tenant's)."""
        key, _, value = self.label.partition("=")
        return model.JobFilter(
            states=[self.state] if self.state else [],
            schedule=self.schedule or None,
            url=self.url or None,
            labels={key: value} if self.label else {},
            queue=self.queue or None,
            tenant=tenant,
        )

    def wrong(self) -> dict[str, str]:
        """Why each field the list refuses is wrong, by field ({}: none is)."""
        found = {}
        if self.label and not (self.label.partition("=")[0] and "=" in self.label):
            found["label"] = f"label: {self.label!r} is not KEY=VALUE"
        checked = (
            ("state", model.JobFilter(states=[self.state] if self.state else [])),
            ("url", model.JobFilter(url=self.url or None)),
        )
        for field, given in checked:
            try:
                client.jobs.check_filter(given)
            except errors.InvalidInput as exc:
                found[field] = str(exc)
        return found


BULK = ("state", "queue", "label")
"""The filters a bulk action's preview takes (web/bulk.py's FIELDS)."""


@router.get("/jobs")
async def jobs(
    request: Request,
    who: Viewer,
    state: str = "",
    schedule: str = "",
    url: str = "",
    label: str = "",
    queue: str = "",
    before: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
) -> Response:
    """Jobs, the newest first, a page at a time (keyset: ?before=<id>), each with what it
    does, its schedule, its last run and its next."""
    filters = Filters(state=state, schedule=schedule, url=url, label=label, queue=queue)
    return await _jobs_page(request, who, filters, before=before)


async def _jobs_page(
    request: Request,
    who: access.WebSession,
    filters: Filters,
    *,
    before: int | None = None,
    wrong: str = "",
    status: int = 200,
) -> Response:
    """The jobs page, saying `wrong` (a refused form's reason) when there is one, and each
    wrong filter beside its field."""
    c = auth.client_of(request)
    errors_ = filters.wrong()
    page_ = client.jobs.JobPage([])
    if not errors_:
        page_ = await c.job_page(filters.matching(who.tenant), before=before, limit=JOBS_PAGE)
    return page(
        request,
        "jobs.html",
        who,
        rows=[_row(j, page_.runs.get(j.id)) for j in page_.jobs],
        filters=filters,
        errors=errors_,
        wrong=wrong,
        next_page=filters.query(before=page_.next) if page_.next else None,
        states=list(model.JobState),
        commands=tenancy.offered(c.settings.tenants, who.tenant, "process"),
        status=status,
    )


def _row(job: model.Job, run: client.jobs.LastRun | None) -> dict[str, Any]:
    """A job as a row of the list: the job, and what the list shows of it (shapes)."""
    return {"job": job, **shapes.listed_facts(job, run, lambda at: at)}


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
        return await _jobs_page(request, who, Filters(), wrong=str(exc), status=422)
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
        shown = await _jobs_page(request, who, Filters(), wrong=str(exc), status=429)
        shown.headers["Retry-After"] = str(exc.retry_after)
        return shown
    return await _jobs_page(request, who, Filters(), wrong=str(exc), status=403)


@router.get("/jobs/{job_id}")
async def job(request: Request, who: Viewer, job_id: JobId) -> Response:
    """A job's page: what it does (an HTTP job's whole request, secrets redacted), when it
    runs next while it waits, its attempts and its run log (updated live)."""
    c = auth.client_of(request)
    view = await visible_job(c, who, job_id)
    values = await _job_values(request, view)
    return page(request, "job.html", who, **values, **sends.what_and_when(view.job, c.clock.now()))


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
        "explained": _explained(view, c.clock.now()),
        "trimmed": shapes.TRIMMED,
    }


def _explained(view: client.jobs.JobView, now: datetime) -> str:
    """Why the job is where it is (client.explain.why); a quarantined one's in the page's
    own words, beside its Retry and Discard buttons (not the command line's)."""
    if view.job.state != J.QUARANTINED:
        return client.explain.why(view, now)
    what, decided = client.explain.quarantine_said(view)
    because = f" — {decided}" if decided else ""
    return (
        f"quarantined: {what}{because}. It waits for a person: retry it after a fix, or discard it."
    )


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
    shown = [(v.job, *client.explain.quarantine_said(v)) for v in views]
    more = found[-1].id if len(found) == QUARANTINED_SHOWN else None
    return page(request, "dead.html", who, jobs=shown, next_page=more)
