"""The dashboard: server-rendered pages (Jinja2 templates, htmx vendored in static/) under
/ui on the API's app, signed in with a user name and password or an API token.

    auth.py     sessions, roles and CSRF
    overview.py the overview, read in one call and kept for a few seconds
    pages.py    what the pages share, and signing in; jobs.py the jobs' pages;
                schedules.py the schedules list, schedule_page.py a schedule's page, its
                history and stats
    forms.py    what the forms of HTTP jobs and schedules share: read as the API's body,
                each error beside its field, secrets shown redacted and kept
    schedule_forms.py, schedule_actions.py   a schedule made, changed, previewed, and what
                an operator does to it; job_forms.py a one-off HTTP job, and a rerun
    live.py     live updates: the changing part of a page, pushed over server-sent events
    bulk.py     bulk actions: a preview, its confirm form, and the operations it starts
    tenant_alerts.py   the alert channels and rules a tenant owns, and their forms
    monitors.py        a tenant's monitors, and a page per monitor: its pings and history
    flows.py           the flows a tenant owns, what each uses now, and their forms
    charts.py   the charts of job ends (the overview's, a schedule's), drawn as SVG on the server
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.staticfiles import StaticFiles
from starlette.responses import RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral import errors
from corral.web import (
    auth,
    bulk,
    flows,
    job_forms,
    jobs,
    monitors,
    overview,
    pages,
    schedule_actions,
    schedule_forms,
    schedule_page,
    schedules,
    tenant_alerts,
)

__all__ = ["mount"]


CSP = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "form-action 'self'",
        "base-uri 'none'",
        "frame-ancestors 'none'",
    )
)
"""The dashboard's Content-Security-Policy: its own scripts and styles only (vendored
htmx, configured to inject none), no inline script or style, no eval, never in a frame."""

HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
]
"""What every answer under /ui carries."""


class Guarded:
    """ASGI middleware: HEADERS on every answer under /ui (pages, fragments, streams,
    static files, redirects, errors)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope.get("path", "").startswith("/ui"):
            await self.app(scope, receive, send)
            return

        async def guarded(message: Message) -> None:
            if message["type"] == "http.response.start":
                named = {k.lower() for k, _ in message.get("headers", [])}
                extra = [(k, v) for k, v in HEADERS if k not in named]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, guarded)


ROOMS = (
    overview,
    pages,
    job_forms,
    schedule_forms,
    schedule_actions,
    jobs,
    schedules,
    schedule_page,
    bulk,
    tenant_alerts,
    monitors,
    flows,
)
"""The modules whose routes the dashboard serves, in the order they are matched: the forms
before the pages whose paths take an id or a name (/ui/jobs/new is no job)."""


def mount(app: FastAPI) -> None:
    """Serve the dashboard on `app` under /ui (none of it in the OpenAPI document)."""
    app.add_middleware(Guarded)
    app.state.overview = overview.Keeper()
    app.state.sign_ins = auth.SignInLimits()
    app.add_middleware(overview.Changes, keeper=app.state.overview)
    for room in ROOMS:
        app.include_router(room.router)
    app.mount("/ui/static", StaticFiles(directory=pages.HERE / "static"), name="ui-static")

    @app.get("/ui", include_in_schema=False)
    async def ui_root() -> Response:
        return RedirectResponse("/ui/", 307)

    @app.exception_handler(errors.NeedSignIn)
    async def need_sign_in(request: Request, exc: errors.NeedSignIn) -> Response:
        to = auth.sign_in_url(exc.back)
        if request.headers.get("hx-request"):  # htmx follows this header, not a redirect
            return Response(status_code=401, headers={"HX-Redirect": to})
        return RedirectResponse(to, 303)

    @app.exception_handler(errors.Forbidden)
    async def forbidden(request: Request, exc: errors.Forbidden) -> Response:
        return pages.page(request, "error.html", None, status=403, title="Refused", said=str(exc))

    @app.exception_handler(errors.TooManyStreams)
    async def too_many(request: Request, exc: errors.TooManyStreams) -> Response:
        shown = pages.page(request, "error.html", None, status=429, title="Busy", said=str(exc))
        shown.headers["Retry-After"] = "5"
        return shown

    @app.exception_handler(errors.PageMissing)
    async def missing(request: Request, exc: errors.PageMissing) -> Response:
        return pages.page(request, "error.html", None, status=404, title="Not found", said=str(exc))
