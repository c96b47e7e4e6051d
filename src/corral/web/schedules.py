"""The schedules pages, under /ui/schedules: every schedule of the tenant with its next
firings and last run, and pause or resume (schedule_actions.py takes those forms)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from corral.web import auth
from corral.web.auth import Viewer
from corral.web.pages import page

FIRINGS_SHOWN = 3
"""Next firings shown for each schedule."""

router = APIRouter(prefix="/ui", include_in_schema=False)


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
