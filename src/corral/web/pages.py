"""The dashboard's pages, under /ui: jobs (a list with filters, a page each with its
attempts as a timeline and its run log, updated live), schedules with their next firings,
and quarantined jobs (the overview: overview.py; bulk actions: bulk.py). A
page of another tenant's job is not found (404), and the lists hold only the session's
tenant's.

GETs only read; every change is a POST form that carries the session's CSRF token, made
by an operator (or admin), written to the audit log, and answered with a redirect back
(post/redirect/get)."""

from __future__ import annotations

import dataclasses
import re
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

import jinja2
from fastapi import APIRouter, Query, Request
from fastapi import Path as PathParam
from starlette.responses import HTMLResponse, RedirectResponse, Response

from corral import access, client, errors, model, plain, shapes, tenancy
from corral.web import auth, live
from corral.web.auth import Operator, Viewer

HERE = Path(__file__).parent
JOBS_PAGE = 50
"""Jobs on one page of the list."""
QUARANTINED_SHOWN = 20
"""Quarantined jobs the overview lists, and the quarantined page shows at once (each
with its attempts and events read, to say why)."""
FIRINGS_SHOWN = 3
"""Next firings shown for each schedule."""
EVENTS_LOOKED = 100
"""The most of a job's new events one look of its live page reads (it only needs to see
that there are some)."""
MAX_ID = 2**63 - 1
JobId = Annotated[int, PathParam(ge=1, le=MAX_ID)]
J = model.JobState

router = APIRouter(prefix="/ui", include_in_schema=False)
templates = jinja2.Environment(
    loader=jinja2.FileSystemLoader(HERE / "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    # A value stored before corral refused lone surrogates is shown escaped: never a 500.
    finalize=lambda value: plain.shown(value) if isinstance(value, str) else value,
)
templates.filters["when"] = lambda at: at.strftime("%Y-%m-%d %H:%M:%S UTC") if at else "-"
templates.filters["count"] = lambda n: f"{n:,}"


def page(request: Request, name: str, who: access.WebSession | None, **values: Any) -> Response:
    """Template `name` as an HTML answer, with the session (for its CSRF token and role)."""
    status = values.pop("status", 200)
    return HTMLResponse(render(request, name, who, **values), status_code=status)


def render(request: Request, name: str, who: access.WebSession | None, **values: Any) -> str:
    """Template `name` drawn, with the session and the page's one-line note."""
    note = note_of(request.query_params)
    return templates.get_template(name).render(request=request, who=who, note=note, **values)


NOTES = {
    "command-missing": "command: give a command to run",
    "job-changed": "job {job} {did}",
    "job-unchanged": "job {job} was not {did}: it is {state}",
    "operation-ended": "operation {op} has already {state}",
    "operation-stopped": "operation {op} stopped: {left} jobs left as they were",
    "schedule-changed": "schedule {name} {did}",
}
"""The one-line notes a page shows after a form (`?note=KEY` and its fields): a fixed
set, so that a link cannot make the dashboard say anything else."""

_NOTE_FIELDS = {
    "job": re.compile(r"^[1-9][0-9]{0,18}$"),
    "op": re.compile(r"^[1-9][0-9]{0,18}$"),
    "left": re.compile(r"^[0-9]{1,3}(,[0-9]{3})*$"),
    "state": re.compile(r"^[a-z]{1,20}$"),
    "did": re.compile(r"^(cancelled|sent back to its queue|discarded|paused|resumed)$"),
    "name": re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$"),
}


def note_of(query: Mapping[str, str]) -> str:
    """The note `?note=KEY&FIELD=...` asks for, its fields each of their own form; "" for
    any other."""
    template = NOTES.get(query.get("note", ""))
    if template is None:
        return ""
    fields = {}
    for name in re.findall(r"{(\w+)}", template):
        value = query.get(name, "")
        if not _NOTE_FIELDS[name].match(value):
            return ""
        fields[name] = value
    return template.format(**fields)


def back(to: str, note: str = "", **fields: object) -> Response:
    """A redirect after a POST, to the page `to`, with a note of NOTES to show there."""
    if not note:
        return RedirectResponse(to, 303)
    assert note in NOTES, note
    sep = "&" if "?" in to else "?"
    return RedirectResponse(f"{to}{sep}{urlencode({'note': note, **fields})}", 303)


async def visible_job(c: client.Client, who: access.WebSession, job_id: int) -> client.jobs.JobView:
    try:
        view = await c.job(job_id)
    except errors.NotFound:
        raise errors.PageMissing(f"no job {job_id}") from None
    if not auth.sees(who, view.job.tenant):
        raise errors.PageMissing(f"no job {job_id}")
    return view


async def audit(
    c: client.Client,
    who: access.WebSession,
    action: str,
    target: str,
    tenant: str | None,
    **details: Any,
) -> None:
    """The audit row of a change made on the dashboard: by the session's user (or token)."""
    await c.audit_add(
        token_id=who.token_id,
        tenant=tenant,
        action=action,
        target=target,
        details={"by": who.name, "via": "dashboard", **details},
    )


# --- signing in and out -------------------------------------------------------------------


@router.get("/sign-in")
async def sign_in_page(request: Request, next: str = "/ui/") -> Response:
    pairing = secrets.token_urlsafe(24)
    shown = page(request, "sign_in.html", None, pairing=pairing, next=_local(next), failed="")
    auth.set_cookie(request, shown, auth.SIGN_IN_COOKIE, pairing, 3600)
    return shown


@router.post("/sign-in")
async def sign_in(request: Request) -> Response:
    """A user name and password, or an API token: a session cookie and back to the page
    that sent here. The form's pairing must match its cookie (SameSite keeps another site's
    form from sending one), so another site cannot sign a browser in as someone else. Past
    the failed sign-ins allowed (auth.SignInLimits), 429 before any password is hashed."""
    form = await auth.form_of(request)
    pairing = request.cookies.get(auth.SIGN_IN_COOKIE, "")
    if not pairing or not secrets.compare_digest(
        form.get("pairing", "").encode(), pairing.encode()
    ):
        raise errors.Forbidden("the sign-in form is stale: reload the page")
    c, limits = auth.client_of(request), request.app.state.sign_ins
    client, user = auth.address_of(request), form.get("name", "")
    user = "" if form.get("token") else user
    now = c.clock.monotonic()
    if refused := limits.refused(now, client=client, user=user):
        shown = _sign_in_again(request, form, failed=refused[0], status=429)
        shown.headers["Retry-After"] = str(refused[1])
        return shown
    limits.trying(now, client=client, user=user)
    if form.get("token"):
        opened = await c.sign_in_token(form["token"])
    else:
        opened = await c.sign_in(user, form.get("password", ""))
    if opened is None:
        return _sign_in_again(request, form, failed=NOT_VALID, status=401)
    limits.succeeded(now, client=client, user=user)
    secret, made = opened
    went = RedirectResponse(_local(form.get("next", "")), 303)
    age = int((made.expires_at - c.clock.now()).total_seconds())
    auth.set_cookie(request, went, auth.COOKIE, secret, age)
    went.delete_cookie(auth.SIGN_IN_COOKIE, path="/ui")
    return went


NOT_VALID = "That name and password, or that token, is not valid."


def _sign_in_again(request: Request, form: auth.Form, *, failed: str, status: int) -> Response:
    """The sign-in form again, saying why, with a new pairing."""
    again = secrets.token_urlsafe(24)
    shown = page(
        request, "sign_in.html", None, pairing=again, next=_local(form.get("next", "")),
        failed=failed, status=status,
    )  # fmt: skip
    auth.set_cookie(request, shown, auth.SIGN_IN_COOKIE, again, 3600)
    return shown


@router.post("/sign-out")
async def sign_out(request: Request, who: Viewer) -> Response:
    auth.check_csrf(request, who, await auth.form_of(request))
    await auth.client_of(request).sign_out(request.cookies.get(auth.COOKIE, ""))
    went = RedirectResponse("/ui/sign-in", 303)
    went.delete_cookie(auth.COOKIE, path="/ui")
    return went


def _local(target: str) -> str:
    """Where to go after signing in: a dashboard page only (never another site)."""
    return target if target.startswith("/ui/") and not target.startswith("/ui//") else "/ui/"


# --- jobs ---------------------------------------------------------------------------------


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
    to = _local(acting.form.get("back", "")) if acting.form.get("back") else f"/ui/jobs/{job_id}"
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


# --- schedules ----------------------------------------------------------------------------


@router.get("/schedules")
async def schedules(request: Request, who: Viewer) -> Response:
    """Every schedule of the tenant: its rule, next firings (those a DST change moved
    marked), last run, and pause or resume."""
    c = auth.client_of(request)
    found = await c.schedules(tenant=who.tenant)
    last = {j.id: j for j in await c.jobs_by_id(
        [s.last_job_id for s in found if s.last_job_id is not None]
    )}  # fmt: skip
    rows = [(s, c.upcoming(s, FIRINGS_SHOWN), last.get(s.last_job_id or 0)) for s in found]
    return page(request, "schedules.html", who, schedules=rows)


@router.post("/schedules/{tenant}/{name}/{action}")
async def schedule_change(
    request: Request, acting: Operator, tenant: str, name: str, action: str
) -> Response:
    c, who = auth.client_of(request), acting.who
    if action not in ("pause", "resume") or not auth.sees(who, tenant):
        raise errors.PageMissing(f"no schedule {name!r}")
    try:
        if action == "pause":
            await c.schedule_pause(name, tenant=tenant)
        else:
            await c.schedule_resume(name, tenant=tenant)
    except errors.NotFound:
        raise errors.PageMissing(f"no schedule {name!r}") from None
    await audit(c, who, f"schedules.{action}", name, tenant)
    return back("/ui/schedules", "schedule-changed", name=name, did=f"{action}d")
