"""The schedules list, under /ui/schedules: the tenant's schedules by name, a page at a time
(keyset: ?after=<the last name of a page>; TENANT/NAME for a session of every tenant), each
with its next firings to the second, its last run (state, HTTP status or exit code, response
time) and a link to its page (schedule_page.py); pause and resume are
schedule_actions.py's forms."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from corral import errors
from corral.client import schedule_reads
from corral.web import auth
from corral.web.auth import Viewer
from corral.web.pages import page
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
