"""The REST API (FastAPI), under /api/v1, with its OpenAPI document at /api/v1/openapi.json.

Every route but /healthz, /readyz and a monitor's /ping/<key> (its random key authorises)
takes `Authorization: Bearer <token>`: a token acts
for one tenant (or every tenant, an admin's) in one role (corral.access.Role). A job of
another tenant is not found (404), however it is asked for: by id, in a list, by its
events or run log. Every change is written to the audit log with the token that made it.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from corral import client, errors, web
from corral.api import (
    alerts,
    apply,
    attempts,
    flows,
    metrics,
    monitors,
    operations,
    routes,
    schedules,
    streams,
    tenants,
    tokens,
    workers,
)
from corral.api.limits import MAX_BODY, RequestLimits

log = logging.getLogger("corral.api")

PREFIX = "/api/v1"
__all__ = ["MAX_BODY", "PREFIX", "create_app", "create_attempt_app"]


class Answer(JSONResponse):
    """A JSON answer; one that holds a lone surrogate stored before corral refused them is
    sent with it escaped (`\\ud800`, valid JSON), never a 500."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, allow_nan=False, separators=(",", ":")).encode("ascii")


def create_app(c: client.Client) -> FastAPI:
    """The API over the client `c` (its store, executors and settings)."""
    app = FastAPI(
        default_response_class=Answer,
        title="corral",
        version="1",
        openapi_url=f"{PREFIX}/openapi.json",
        docs_url=f"{PREFIX}/docs",
        redoc_url=None,
    )
    app.state.client = c
    _answer_errors(app)
    # /ping/<key> first: the routes are matched in order, and a ping is the hottest request
    # (its key authorises it, no token).
    app.include_router(monitors.pings)
    app.include_router(routes.router, prefix=PREFIX)
    app.include_router(schedules.router, prefix=PREFIX)
    app.include_router(alerts.router, prefix=PREFIX)
    app.include_router(flows.router, prefix=PREFIX)
    app.include_router(streams.router, prefix=PREFIX)
    app.include_router(tokens.router, prefix=PREFIX)
    app.include_router(attempts.router, prefix=PREFIX)
    app.include_router(operations.router, prefix=PREFIX)
    app.include_router(workers.router, prefix=PREFIX)
    app.include_router(tenants.router, prefix=PREFIX)
    app.include_router(monitors.router, prefix=PREFIX)
    app.include_router(apply.router, prefix=PREFIX)
    app.include_router(metrics.router)  # /metrics, beside /healthz and /readyz
    routes.add_health(app)
    web.mount(app)  # the dashboard, under /ui
    return app


def create_attempt_app(c: client.Client) -> FastAPI:
    """The attempt API alone (/api/v1/attempt/...), for the Unix socket a dispatcher
    answers its process jobs on: nothing but an attempt's own calls, with its token."""
    app = FastAPI(title="corral attempts", version="1", openapi_url=None, docs_url=None)
    app.state.client = c
    _answer_errors(app)
    app.include_router(attempts.router, prefix=PREFIX)
    return app


_STATUS: dict[type[errors.CorralError], int] = {
    errors.InvalidInput: 422,
    errors.NotGranted: 403,
    errors.QuotaExceeded: 403,
    errors.RateLimited: 429,
    errors.Conflict: 409,
    errors.NotFound: 404,
    errors.StaleFence: 409,
    errors.StoreUnavailable: 503,
}
"""The status of each error corral refuses a request with (the nearest class of an error
in this table says it)."""


def _answer_errors(app: FastAPI) -> None:
    """Every refusal as a JSON body naming the field, with its status."""
    app.add_middleware(RequestLimits, error=_error)
    app.exception_handler(errors.RequestRefused)(_refused)
    for kind in _STATUS:
        app.exception_handler(kind)(_refusal)
    app.exception_handler(RequestValidationError)(_malformed)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return _http_error(app, request, exc)


async def _refused(_: Request, exc: errors.RequestRefused) -> Response:
    return _error(exc.status, str(exc), headers=exc.headers)


async def _refusal(_: Request, exc: errors.CorralError) -> Response:
    status = next(_STATUS[kind] for kind in type(exc).__mro__ if kind in _STATUS)
    headers = None
    if isinstance(exc, errors.RateLimited):  # when to try again
        headers = {"Retry-After": str(exc.retry_after)}
    return _error(
        status,
        f"fence: {exc}" if isinstance(exc, errors.StaleFence) else str(exc),
        headers=headers,
    )


def _http_error(app: FastAPI, request: Request, exc: StarletteHTTPException) -> Response:
    headers = dict(exc.headers or {})
    if exc.status_code == 405:  # every method of the path, not only one route's
        headers["Allow"] = ", ".join(_methods(app, request.url.path))
    what = {404: "path", 405: "method", 400: "body"}.get(exc.status_code, "request")
    message = "path: no such route" if exc.status_code == 404 else f"{what}: {exc.detail}"
    return _error(exc.status_code, message, headers=headers)


async def _malformed(_: Request, exc: RequestValidationError) -> Response:
    first = exc.errors()[0]
    loc = [str(p) for p in first.get("loc", ())]
    if first.get("type") == "json_invalid":  # loc: ("body", the character it failed at)
        said = (first.get("ctx") or {}).get("error", "JSON decode error")
        at = f" at character {loc[1]}" if len(loc) > 1 else ""
        return _error(422, f"body: not valid JSON: {said}{at}")
    # Not "body" nor "query", nor the union member tried ("dict[str,any]"): the field.
    named = [p for p in loc[1:] if "[" not in p]
    where = ".".join(named) or (loc[0] if loc else "request")
    return _error(422, f"{where}: {first.get('msg', 'is not valid')}")


def _methods(app: FastAPI, path: str) -> list[str]:
    """The methods the route table has for `path` (from the OpenAPI document's paths)."""
    table = getattr(app.state, "methods", None)
    if table is None:
        table = app.state.methods = [
            (re.compile("^" + re.sub(r"\\{\w+\\}", "[^/]+", re.escape(p)) + "$"), sorted(ops))
            for p, ops in app.openapi()["paths"].items()
        ]
    found = {m.upper() for pattern, ops in table if pattern.match(path) for m in ops}
    return sorted(found)


def _error(status: int, message: str, *, headers: dict[str, str] | None = None) -> JSONResponse:
    field, sep, _ = message.partition(":")
    body: dict[str, Any] = {"error": message}
    if sep and " " not in field:
        body["field"] = field
    return Answer(body, status_code=status, headers=headers)
