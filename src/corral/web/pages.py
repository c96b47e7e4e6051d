"""What every dashboard page shares: its templates, the one-line notes after a form, the
redirect back, the audit row of a change, a job the session may see; and signing in and
out. The pages themselves: jobs.py, schedules.py, overview.py, bulk.py. A page of another
tenant's job or schedule is not found (404), and the lists hold only the session's
tenant's.

GETs only read; every change is a POST form that carries the session's CSRF token, made
by an operator (or admin), written to the audit log, and answered with a redirect back
(post/redirect/get)."""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

import jinja2
from fastapi import APIRouter, Request
from fastapi import Path as PathParam
from starlette.responses import HTMLResponse, RedirectResponse, Response

from corral import access, client, errors, plain
from corral.web import auth
from corral.web.auth import Viewer

HERE = Path(__file__).parent
QUARANTINED_SHOWN = 20
"""Quarantined jobs the overview lists, and the quarantined page shows at once (each
with its attempts and events read, to say why)."""
MAX_ID = 2**63 - 1
JobId = Annotated[int, PathParam(ge=1, le=MAX_ID)]

router = APIRouter(prefix="/ui", include_in_schema=False)


class _Environment(jinja2.Environment):
    """Jinja2's environment, reading `row.field` of a plain dict as `row["field"]` at once:
    Jinja2 asks for the attribute first, and the AttributeError it catches costs more than
    the rest of the look-up, over a thousand times a list (a dict's own methods, such as
    `.get`, are still found as attributes)."""

    def getattr(self, obj: Any, attribute: str) -> Any:
        if type(obj) is dict and attribute not in _DICT_ATTRIBUTES:
            try:
                return obj[attribute]
            except KeyError:
                pass
        return super().getattr(obj, attribute)


_DICT_ATTRIBUTES = frozenset(dir(dict))

templates = _Environment(
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
    "schedule-made": "schedule {name} made",
    "schedule-saved": "schedule {name} saved",
    "schedule-copied": "schedule {name} made, a copy of {source}",
    "schedule-deleted": "schedule {name} deleted, with its firings; the jobs it made stay",
    "schedule-fired": "schedule {name} fired now: job {job}",
    "job-once": "job {job} made: a one-off request at its time (schedules repeat)",
    "job-kept": "job {job} has that idempotency key already: nothing new was made",
    "job-rerun": "job {job} runs job {old} again",
    "alert-channel-made": "alert channel {name} made",
    "alert-channel-tested": "a test message went to alert channel {name}: {state}",
    "alert-channel-deleted": "alert channel {name} deleted",
    "alert-rule-made": "alert rule {name} made",
    "alert-rule-deleted": "alert rule {name} deleted",
    "flow-made": "flow {name} made",
    "flow-changed": "flow {name} changed",
    "flow-deleted": "flow {name} deleted",
}
"""The one-line notes a page shows after a form (`?note=KEY` and its fields): a fixed
set, so that a link cannot make the dashboard say anything else."""

_NOTE_FIELDS = {
    "job": re.compile(r"^[1-9][0-9]{0,18}$"),
    "op": re.compile(r"^[1-9][0-9]{0,18}$"),
    "left": re.compile(r"^[0-9]{1,3}(,[0-9]{3})*$"),
    "state": re.compile(r"^[a-z]{1,20}$"),
    "old": re.compile(r"^[1-9][0-9]{0,18}$"),
    "did": re.compile(r"^(cancelled|sent back to its queue|discarded|paused|resumed|run again)$"),
    "name": re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$"),
    "source": re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$"),
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
    shown = page(request, "sign_in.html", None, pairing=pairing, next=local(next), failed="")
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
    went = RedirectResponse(local(form.get("next", "")), 303)
    age = int((made.expires_at - c.clock.now()).total_seconds())
    auth.set_cookie(request, went, auth.COOKIE, secret, age)
    went.delete_cookie(auth.SIGN_IN_COOKIE, path="/ui")
    return went


NOT_VALID = "That name and password, or that token, is not valid."


def _sign_in_again(request: Request, form: auth.Form, *, failed: str, status: int) -> Response:
    """The sign-in form again, saying why, with a new pairing."""
    again = secrets.token_urlsafe(24)
    shown = page(
        request, "sign_in.html", None, pairing=again, next=local(form.get("next", "")),
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


def local(target: str) -> str:
    """Where to go after signing in: a dashboard page only (never another site)."""
    return target if target.startswith("/ui/") and not target.startswith("/ui//") else "/ui/"
