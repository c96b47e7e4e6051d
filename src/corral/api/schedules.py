"""The routes of /api/v1/schedules: make, change, delete, pause, resume, trigger, preview
and backfill schedules. A schedule is named within its tenant: a token of one tenant
finds only its own (another's is not found, 404); a token of every tenant names the
tenant with ?tenant= (default: default)."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Query

from corral import autopause, cadence, client, errors, model, planning, scheduling, shapes
from corral.api.auth import Caller, Client, Operator, Viewer
from corral.api.routes import EARLIEST, LATEST, RESPONSES, audit, instant, path_tenant
from corral.client.schedule_reads import (
    FIRINGS_PAGE,
    MAX_FIRINGS_PAGE,
    MAX_SCHEDULES_PAGE,
    SCHEDULES_PAGE,
    firing_cursor,
    list_cursor,
    list_next,
)

router = APIRouter(responses=RESPONSES)

Name = Annotated[str, Path(description="The schedule's name (within its tenant).")]
Tenant = Annotated[
    str | None, Query(description="A token of every tenant: whose schedule (default: default).")
]

MAX_BACKFILL = 10_000
"""The most firings one backfill makes (or counts, with dry_run)."""


async def _schedule(c: client.Client, who: Caller, name: str, tenant: str | None) -> Any:
    whose = path_tenant(who, tenant, f"no schedule {name!r}")
    try:
        return await c.schedule(name, tenant=whose)
    except errors.NotFound:
        raise errors.RequestRefused(404, f"no schedule {name!r}") from None


async def _audit(c: client.Client, who: Caller, action: str, found: Any, **details: Any) -> None:
    await audit(c, who, action, f"{found.tenant}/{found.name}", found.tenant, **details)


def _shown(c: client.Client, found: Any) -> dict[str, Any]:
    """A schedule as the API shows it: its own pause_after (null: its tenant's), and the one
    in effect."""
    return {
        **shapes.schedule_dict(found),
        "pause_after_in_effect": autopause.effective(found, c.settings.tenants),
        "upcoming": [shapes.nominal_dict(n) for n in c.upcoming(found)],
    }


@router.get(
    "/schedules",
    summary="The schedules of the token's tenant, by name (keyset: ?after=<a page's next>)",
)
async def schedules_list(
    c: Client,
    who: Viewer,
    tenant: Tenant = None,
    after: Annotated[
        str | None,
        Query(
            max_length=401,
            description="Only schedules after this one, by name: a page's `next` (TENANT/NAME"
            " when the list is every tenant's). With `after` or `limit`, the answer is a page:"
            ' {"schedules": [...], "next": ...}; with neither, the first 1000 as a list.',
        ),
    ] = None,
    limit: Annotated[int | None, Query(ge=1, le=MAX_SCHEDULES_PAGE)] = None,
) -> list[dict[str, Any]] | dict[str, Any]:
    paged = after is not None or limit is not None
    if who.token.tenant is not None and tenant not in (None, who.token.tenant):
        return {"schedules": [], "next": None} if paged else []
    whose = who.token.tenant or tenant
    if not paged:  # the answer of old: a list, bounded
        found, _ = await c.schedules_page(tenant=whose, limit=MAX_SCHEDULES_PAGE)
        return [_shown(c, s) for s in found]
    found, more = await c.schedules_page(
        tenant=whose, after=list_cursor(after, whose), limit=limit or SCHEDULES_PAGE
    )
    return {"schedules": [_shown(c, s) for s in found], "next": list_next(more, whose)}


@router.post("/schedules", status_code=201, summary="Make a schedule")
async def schedule_create(
    c: Client,
    who: Operator,
    body: Annotated[
        dict[str, Any],
        Body(
            description='e.g. {"name": "nightly", "cron": "0 2 * * *", "tz": "Europe/Paris",'
            ' "spec": {"command": ["sh", "-c", "echo export"]}}: the options of'
            " `corral schedules add` and a job template as a submit takes it."
        ),
    ],
) -> dict[str, Any]:
    made = await client.bodies.schedule_create(c, body, acts_for=who.token.tenant)
    await _audit(c, who, "schedules.create", made)
    return _shown(c, made)


@router.get("/schedules/{name}", summary="A schedule, its next firings and its latest ones")
async def schedule_get(
    c: Client,
    who: Viewer,
    name: Name,
    tenant: Tenant = None,
    firings: Annotated[int, Query(ge=0, le=1000)] = 10,
) -> dict[str, Any]:
    found = await _schedule(c, who, name, tenant)
    latest = await c.firings(name, tenant=found.tenant, limit=firings) if firings else []
    return {**_shown(c, found), "firings": [shapes.firing_dict(f) for f in latest]}


@router.patch("/schedules/{name}", summary="Change a schedule: the keys given replace its own")
async def schedule_update(
    c: Client,
    who: Operator,
    name: Name,
    body: Annotated[dict[str, Any], Body()],
    tenant: Tenant = None,
) -> dict[str, Any]:
    found = await _schedule(c, who, name, tenant)
    changed = await client.bodies.schedule_update(c, found, body, acts_for=who.token.tenant)
    await _audit(c, who, "schedules.update", found, keys=sorted(body))
    return _shown(c, changed)


@router.delete("/schedules/{name}", summary="Delete a schedule and its firings")
async def schedule_delete(
    c: Client, who: Operator, name: Name, tenant: Tenant = None
) -> dict[str, Any]:
    found = await _schedule(c, who, name, tenant)
    await c.schedule_delete(name, tenant=found.tenant)
    await _audit(c, who, "schedules.delete", found)
    return {"name": name, "tenant": found.tenant, "deleted": True}


@router.post("/schedules/{name}/pause", summary="Pause a schedule: nothing fires")
async def schedule_pause(
    c: Client, who: Operator, name: Name, tenant: Tenant = None
) -> dict[str, Any]:
    found = await _schedule(c, who, name, tenant)
    if found.paused_at is not None:
        raise errors.Conflict(f"schedule {name!r} is paused already; nothing to pause")
    done = await c.schedule_pause(name, tenant=found.tenant)
    await _audit(c, who, "schedules.pause", found)
    return _shown(c, done)


@router.post("/schedules/{name}/resume", summary="Resume a paused schedule")
async def schedule_resume(
    c: Client, who: Operator, name: Name, tenant: Tenant = None
) -> dict[str, Any]:
    found = await _schedule(c, who, name, tenant)
    if found.paused_at is None:
        raise errors.Conflict(f"schedule {name!r} is not paused; nothing to resume")
    done = await c.schedule_resume(name, tenant=found.tenant)
    await _audit(c, who, "schedules.resume", found)
    return _shown(c, done)


@router.post("/schedules/{name}/trigger", status_code=201, summary="Fire a schedule now")
async def schedule_trigger(
    c: Client, who: Operator, name: Name, tenant: Tenant = None
) -> dict[str, Any]:
    found = await _schedule(c, who, name, tenant)
    client.bodies.granted(c, found.tenant, found.template)
    job_id = await c.schedule_trigger(name, tenant=found.tenant, limited=True)
    await _audit(c, who, "schedules.trigger", found, job_id=job_id)
    return {"id": job_id, "schedule": name, "tenant": found.tenant}


@router.get("/schedules/{name}/preview", summary="A schedule's next nominal times")
async def schedule_preview(
    c: Client,
    who: Viewer,
    name: Name,
    tenant: Tenant = None,
    count: Annotated[int, Query(ge=1, le=1000)] = 10,
) -> list[dict[str, Any]]:
    found = await _schedule(c, who, name, tenant)
    return [shapes.nominal_dict(n) for n in c.upcoming(found, count)]


@router.post("/schedules/{name}/backfill", summary="One job per nominal time in [from, to)")
async def schedule_backfill(
    c: Client,
    who: Operator,
    name: Name,
    body: Annotated[
        dict[str, Any],
        Body(description='{"from": "2026-11-01T00:00:00Z", "to": "2026-11-08T00:00:00Z"}'),
    ],
    tenant: Tenant = None,
    dry_run: bool = False,
) -> dict[str, Any]:
    found = await _schedule(c, who, name, tenant)
    client.bodies.granted(c, found.tenant, found.template)
    unknown = sorted(set(body) - {"from", "to"})
    if unknown:
        raise errors.InvalidInput(f"{unknown[0]}: unknown field (allowed: from, to)")
    first, last = (_backfill_time(body.get(key), key, found.tz) for key in ("from", "to"))
    if last <= first:
        raise errors.InvalidInput(f"to: {model.iso(last)} is not after from {model.iso(first)}")
    count = await asyncio.to_thread(_firings, found, first, last)  # a long range takes a while
    if count > MAX_BACKFILL:
        raise errors.InvalidInput(
            f"to: more than {MAX_BACKFILL} firings in [from, to); at most {MAX_BACKFILL} a"
            " backfill: split the range"
        )
    if dry_run:
        return {"created": count, "existing": 0, "dry_run": True}
    created, existing = await c.backfill(
        name, start=first, end=last, tenant=found.tenant, limited=True
    )
    await _audit(c, who, "schedules.backfill", found, created=created)
    return {"created": created, "existing": existing, "dry_run": False}


def _backfill_time(given: Any, field: str, tz: str) -> datetime:
    """A backfill's `from` or `to` in UTC (wall time in the schedule's zone when it has no
    offset); InvalidInput naming the field when it is not a time the API takes."""
    if not isinstance(given, str):
        raise errors.InvalidInput(f"{field}: required, an ISO 8601 time")
    client.bodies.in_range(given, field)
    try:
        return instant(cadence.parse_instant(given, field, tz), field)
    except OverflowError:
        raise errors.InvalidInput(
            f"{field}: must lie from {EARLIEST.isoformat()} to before {LATEST.isoformat()}"
        ) from None


def _firings(found: scheduling.Schedule, first: datetime, last: datetime) -> int:
    """How many nominal times the schedule has in [first, last), counted up to one past
    MAX_BACKFILL (run off the event loop: a dense rule over a long range takes time)."""
    count = 0
    for _ in cadence.between(planning.rule(found, found.anchor), first, last):
        count += 1
        if count > MAX_BACKFILL:
            break
    return count


@router.post(
    "/schedules/{name}/duplicate",
    status_code=201,
    summary="Copy a schedule under a new name (its rule, options and job template)",
)
async def schedule_duplicate(
    c: Client,
    who: Operator,
    name: Name,
    body: Annotated[dict[str, Any], Body(description='The copy\'s name: {"name": "nightly-2"}')],
    tenant: Tenant = None,
) -> dict[str, Any]:
    found = await _schedule(c, who, name, tenant)
    if unknown := sorted(set(body) - {"name"}):
        raise errors.InvalidInput(f"{unknown[0]}: unknown field (allowed: name)")
    new_name = body.get("name")
    if not isinstance(new_name, str):
        raise errors.InvalidInput("name: required, the copy's name, a string")
    client.bodies.granted(c, found.tenant, found.template)
    made = await c.schedule_duplicate(
        name, new_name, tenant=found.tenant, tenant_made=True, limited=True
    )
    await _audit(c, who, "schedules.duplicate", made, source=name)
    return _shown(c, made)


@router.post("/schedules/preview", summary="The next nominal times of a rule not saved")
async def schedule_preview_rule(
    c: Client,
    who: Viewer,
    body: Annotated[
        dict[str, Any],
        Body(
            description='e.g. {"cron": "30 2 * * *", "tz": "Europe/Paris", "count": 5}, or'
            ' {"every": "10m", "start": "2026-12-24T09:00", "until": "2026-12-25"}: when a'
            " schedule made now with this rule would fire (start and until as wall time in"
            " tz when they carry no offset)."
        ),
    ],
) -> list[dict[str, Any]]:
    args = client.bodies.preview_arguments(body)
    return [shapes.nominal_dict(n) for n in c.schedule_preview(**args)]


# --- the list's pages, a schedule's history and stats ------------------------------------------


@router.get(
    "/schedules/{name}/firings",
    summary="A schedule's firings, the latest first (keyset: ?before=<a page's next>)",
)
async def schedule_firings(
    c: Client,
    who: Viewer,
    name: Name,
    tenant: Tenant = None,
    before: Annotated[
        str | None,
        Query(
            max_length=64,
            description="Only firings with a nominal time before this one (ISO 8601 with an"
            " offset): a page's `next`.",
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_FIRINGS_PAGE)] = FIRINGS_PAGE,
) -> dict[str, Any]:
    """Each firing with its nominal time, lateness (its job's first start minus the nominal
    time, in seconds; null before it starts), job, the job's state, its final attempt's
    HTTP status or exit code, response time (seconds) and outcome."""
    at = instant(firing_cursor(before), "before") if before is not None else None
    found = await _schedule(c, who, name, tenant)
    page = await c.history_of(found, before=at, limit=limit)
    return shapes.firing_page_dict(page.rows, page.next)


@router.get(
    "/schedules/{name}/stats",
    summary="A schedule's success rate and response times: 24 hours by hour, 30 days by day",
)
async def schedule_stats(
    c: Client, who: Viewer, name: Name, tenant: Tenant = None
) -> dict[str, Any]:
    """Its firings by outcome, their jobs that succeeded, failed (or wait in quarantine),
    were cancelled or have not ended, the success rate (succeeded / (succeeded + failed))
    and the mean and max response time, over the last 24 hours by hour and the last 30 days
    by day (UTC, by nominal time)."""
    found = await _schedule(c, who, name, tenant)
    stats = await c.stats_of(found)
    return {"schedule": found.name, "tenant": found.tenant, **shapes.firing_stats_dict(stats)}
