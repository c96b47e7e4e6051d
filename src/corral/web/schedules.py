"""The schedules list, under /ui/schedules: the tenant's schedules by name, a page at a time
(keyset: ?after=<the last name of a page>; TENANT/NAME for a session of every tenant), each
with its next firings to the second, its last run (state, HTTP status or exit code, response
time) and a link to its page (schedule_page.py); and pause or resume."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from corral import errors
from corral.client import schedule_reads
from corral.web import auth
from corral.web.auth import Operator, Viewer
from corral.web.pages import audit, back, local, page
from corral.web.schedule_page import in_zone

FIRINGS_SHOWN = 3
"""Next firings shown for each schedule."""
SCHEDULES_PAGE = 50
"""Schedules on one page of the list."""

router = APIRouter(prefix="/ui", include_in_schema=False)


@router.get("/schedules")
async def schedules(request: Request, who: Viewer, after: str = "") -> Response:
    """The tenant's schedules by name from after `after`: their rule, next firings (those
    a DST change moved marked), last run, and pause or resume."""
    c = auth.client_of(request)
    try:
        cursor = schedule_reads.list_cursor(after, who.tenant)
    except errors.InvalidInput as exc:
        return page(request, "schedules.html", who, schedules=[], more=None, wrong=str(exc),
                    status=422)  # fmt: skip
    found, more = await c.schedules_page(tenant=who.tenant, after=cursor, limit=SCHEDULES_PAGE)
    runs = await c.last_runs(found)
    rows = [
        (s, [(in_zone(n, s.tz), n) for n in c.upcoming(s, FIRINGS_SHOWN)], runs.get(s.id))
        for s in found
    ]
    return page(
        request,
        "schedules.html",
        who,
        schedules=rows,
        more=schedule_reads.list_next(more, who.tenant),
        wrong="",
    )


@router.post("/schedules/{tenant}/{name}/{action}")
async def schedule_change(
    request: Request, acting: Operator, tenant: str, name: str, action: str
) -> Response:
    """Pause or resume a schedule, then back to the page the form was on (its `next`, a
    dashboard page; else the list)."""
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
    to = local(acting.form.get("next", "")) if acting.form.get("next") else "/ui/schedules"
    return back(to, "schedule-changed", name=name, did=f"{action}d")
