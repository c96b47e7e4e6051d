"""The routes of /api/v1: jobs (submit one or many, list, get, cancel, rerun, explain, events
and run logs), quarantined jobs (retry, discard), and the audit log. Every route that
takes a job finds it through `_job`, which answers 404 for another tenant's."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Body, FastAPI, Path, Query, Request
from fastapi.responses import JSONResponse, Response

from corral import client, errors, model, shapes, tenancy
from corral.api.auth import ERRORS, Caller, Client, ErrorBody, Operator, Since, Viewer

RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERRORS,
    409: {"model": ErrorBody, "description": "The request does not fit the state it is about"},
    429: {
        "model": ErrorBody,
        "description": "The tenant submits faster than its submit_rate: Retry-After says in"
        " how many seconds to try again",
    },
}
"""ERRORS, 409 and 429, which a route that changes a job, a schedule or a token may give."""
router = APIRouter(responses=RESPONSES)

MAX_JOBS = 1000
"""The most jobs one submit takes."""

MAX_ID = 2**63 - 1
"""The largest id the databases hold (a signed 64-bit integer)."""
EARLIEST, LATEST = client.bodies.EARLIEST, client.bodies.LATEST
"""The times the API takes (since, until, run_at, a schedule's start and until, a
backfill's from and to) lie in [EARLIEST, LATEST): far from where dates overflow."""
JobId = Annotated[int, Path(ge=1, le=MAX_ID, description="The job's id.")]
Labels = Annotated[
    list[str] | None, Query(description="KEY=VALUE; the jobs with each label given.")
]
instant = client.bodies.instant
plain_json = client.bodies.plain_json


def when(value: datetime | None, field: str) -> datetime | None:
    """`instant` of a time that may be absent."""
    return None if value is None else instant(value, field)


async def visible_job(c: client.Client, who: Caller, job_id: int) -> client.jobs.JobView:
    """The job, with its attempts and run log, if the caller's tenant may see it; else
    404, the same as for a job that does not exist."""
    try:
        view = await c.job(job_id)
    except errors.NotFound:
        view = None
    if view is None or not who.sees(view.job.tenant):
        raise errors.RequestRefused(404, f"no job {job_id}")
    return view


def path_tenant(who: Caller, given: str | None, missing: str) -> str:
    """The tenant a route's ?tenant= acts on: the token's own, or for a token of every
    tenant the one it names (default: default). Another tenant's, named by a tenant's
    token, is not found (404, `missing` saying what), as if it were not there."""
    mine = who.token.tenant
    if mine is None:
        return given or "default"
    if given not in (None, mine):
        raise errors.RequestRefused(404, missing)
    return mine


async def audit(
    c: client.Client, who: Caller, action: str, target: str, tenant: str | None, **details: Any
) -> None:
    """Write the audit row of a change: `tenant` is the tenant of what was changed (for a
    token of every tenant, not its own), so that tenant's viewers see it."""
    await c.audit_add(
        token_id=who.token.id, tenant=tenant, action=action, target=target, details=details
    )


def _audit_row(
    c: client.Client,
    who: Caller,
    action: str,
    target: str,
    tenant: str | None,
    details: Mapping[str, Any],
) -> dict[str, Any]:
    return {
        "at": c.clock.now(),
        "token_id": who.token.id,
        "tenant": tenant,
        "action": action,
        "target": target,
        "details": dict(details),
    }


def _submitted(
    c: client.Client, who: Caller, new: Sequence[model.NewJob]
) -> Callable[[list[tuple[int, bool]]], list[dict[str, Any]]]:
    """The audit rows of a submit, once its ids are known: one a tenant, its job ids in
    details (an id alone as the target; a count for many, which no column could hold)."""

    def rows(made: list[tuple[int, bool]]) -> list[dict[str, Any]]:
        ids: dict[str, list[int]] = defaultdict(list)
        for job, (job_id, _) in zip(new, made, strict=True):
            ids[job.tenant].append(job_id)
        return [
            _audit_row(
                c,
                who,
                "jobs.submit",
                str(mine[0]) if len(mine) == 1 else f"{len(mine)} jobs",
                tenant,
                {"count": len(mine), "ids": mine},
            )
            for tenant, mine in ids.items()
        ]

    return rows


@router.post("/jobs", status_code=201, summary="Submit one job (an object) or many (an array)")
async def jobs_submit(
    c: Client,
    who: Operator,
    body: Annotated[
        dict[str, Any] | list[dict[str, Any]],
        Body(
            description="A job as `corral submit --from-file` reads it, e.g."
            ' {"spec": {"command": ["echo", "hi"]}, "queue": "q"}; or an array of them.',
        ),
    ],
) -> Any:
    many = isinstance(body, list)
    given = body if isinstance(body, list) else [body]
    if not given or len(given) > MAX_JOBS:
        raise errors.InvalidInput(f"body: 1 to {MAX_JOBS} jobs")
    new = []
    for n, one in enumerate(given):
        try:
            new.append(await client.bodies.new_job(c, one, acts_for=who.token.tenant))
        except errors.InvalidInput as exc:
            raise errors.InvalidInput(f"{n}.{exc}" if many else str(exc)) from None
    made = await c.submit_audited(new, audit=_submitted(c, who, new), limited=True)
    jobs = {j.id: j for j in await c.jobs_by_id([i for i, _ in made])}
    out = [{**shapes.job_dict(jobs[i]), "created": created} for i, created in made]
    return out if many else out[0]


def answer(content: Any) -> Response:
    """`content` (JSON values only, as corral.shapes makes them) as the JSON answer, written
    at once: FastAPI's check and encoding of a dict against dict[str, Any] would only walk
    it again, a cost each page of a hundred jobs feels. orjson writes it, several times
    faster than the json module, datetimes included (as isoformat writes them); what it
    does not take (an integer past 64 bits, a lone surrogate stored before corral refused
    them) the json module writes, non-ASCII characters escaped."""
    try:
        body = orjson.dumps(content)
    except TypeError:
        text = json.dumps(content, allow_nan=False, separators=(",", ":"), default=_iso)
        body = text.encode("ascii")  # escaped: a lone surrogate stored long ago included
    return Response(body, media_type=JSONResponse.media_type)


def _iso(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON")


LISTED = (
    "Each job as GET /jobs/{id} shows it (without its attempts and events), and what the list"
    " shows beside it: `target` (what it does: an HTTP job's method and URL, a command, a"
    " task; secrets redacted), `schedule`, its last attempt's `last_status` (HTTP),"
    " `last_exit_code` and `response_time` (seconds), and `next_run` (its run_at while it"
    " waits to run). `next` is the `before` of the next page (null: no more); a `url`"
    " search's page may hold fewer than `limit` jobs and still have a next."
)
"""The job list's description in the OpenAPI document."""
UrlSearch = Annotated[
    str | None,
    Query(description="HTTP jobs whose URL (as shown, secrets redacted) contains it, in any case."),
]
ScheduleName = Annotated[str | None, Query(description="The schedule whose firings made them.")]
Before = Annotated[int | None, Query(ge=1, le=MAX_ID, description="Only ids below this one.")]


@router.get(
    "/jobs",
    summary="List jobs, the newest first (keyset: ?before=<id>)",
    response_model=dict[str, Any],
    description=LISTED,
)
async def jobs_list(
    c: Client,
    who: Viewer,
    state: Annotated[list[str] | None, Query(description="Job states.")] = None,
    queue: str | None = None,
    tenant: str | None = None,
    executor: str | None = None,
    pool: str | None = None,
    schedule: ScheduleName = None,
    url: UrlSearch = None,
    label: Labels = None,
    since: Since = None,
    until: Since = None,
    before: Before = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> Response:
    if tenant is not None and not who.sees(tenant):
        return answer({"jobs": [], "next": None})
    labels = _filter_checked(state or [], label or [])
    given = model.JobFilter(
        states=state or [],
        queue=queue,
        tenant=tenant if tenant is not None else who.token.tenant,
        executor=executor,
        pool=pool,
        schedule=schedule,
        labels=labels or {},
        since=when(since, "since"),
        until=when(until, "until"),
        url=url,
    )
    page = await c.job_page(given, before=before, limit=limit)
    return answer({"jobs": shapes.listed_dicts(page, times_as_they_are=True), "next": page.next})


def _filter_checked(states: list[str], labels: list[str]) -> dict[str, str]:
    """The job list's labels as a mapping, once each label is KEY=VALUE and each state a
    job state (else InvalidInput naming the field)."""
    pairs = {}
    for pair in labels:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise errors.InvalidInput(f"label: {pair!r} is not KEY=VALUE")
        pairs[key] = value
    for s in states:
        if s not in model.JobState.__members__.values():
            raise errors.InvalidInput(
                f"state: {s!r} is not a job state; use one of {', '.join(model.JobState)}"
            )
    return pairs


@router.get(
    "/jobs/{job_id}",
    summary="A job with its attempts and its run log",
    response_model=dict[str, Any],
)
async def job_get(c: Client, who: Viewer, job_id: JobId) -> Response:
    return answer(shapes.view_dict(await visible_job(c, who, job_id)))


@router.get("/jobs/{job_id}/events", summary="A job's run log: every change of it and its attempts")
async def job_events(c: Client, who: Viewer, job_id: JobId) -> list[dict[str, Any]]:
    view = await visible_job(c, who, job_id)
    return list(shapes.view_dict(view)["events"])


@router.get("/jobs/{job_id}/logs", summary="What each attempt left to read: its streams")
async def job_logs(c: Client, who: Viewer, job_id: JobId) -> list[dict[str, Any]]:
    view = await visible_job(c, who, job_id)
    out = []
    for a in view.attempts:
        kept = view.logs.get(a.id)
        out.append(
            {
                "attempt": a.attempt_no,
                "fence": a.id,
                "state": a.state,
                **shapes.log_facts(kept),
                "streams": [] if kept is None else [s.as_json() for s in kept.streams],
            }
        )
    return out


@router.get("/jobs/{job_id}/explain", summary="Why a job is not running now, in one line")
async def job_explain(c: Client, who: Viewer, job_id: JobId) -> dict[str, Any]:
    view = await visible_job(c, who, job_id)
    said = await c.explain_view(view, tenant=who.token.tenant)  # its pool: the tenant's jobs
    return {"id": job_id, **shapes.explanation(said)}


async def _change(
    c: client.Client,
    who: Caller,
    job_id: int,
    action: str,
    do: Callable[[int, str], Awaitable[object]],
) -> dict[str, Any]:
    """Change a job the caller may see: `do(job_id, reason)`, audited; the job after.
    A change it cannot make now (a retry of a job not quarantined) is 409."""
    before = await visible_job(c, who, job_id)
    await do(job_id, f"{action.partition('.')[2]} through the API (token {who.token.id})")
    await audit(c, who, action, str(job_id), before.job.tenant)
    return shapes.view_dict(await visible_job(c, who, job_id))


@router.post("/jobs/{job_id}/cancel", summary="Cancel a job (and stop its attempt)")
async def job_cancel(c: Client, who: Operator, job_id: JobId) -> dict[str, Any]:
    view = await visible_job(c, who, job_id)
    if view.job.state == model.JobState.CANCELLED:  # nothing changes, so nothing to audit
        return shapes.view_dict(view)
    return await _change(c, who, job_id, "jobs.cancel", lambda i, why: c.cancel(i, reason=why))


@router.post(
    "/jobs/{job_id}/rerun", status_code=201, summary="Run an ended job again, as a new job"
)
async def job_rerun(c: Client, who: Operator, job_id: JobId) -> dict[str, Any]:
    old = await visible_job(c, who, job_id)
    if old.job.state not in (model.JobState.FAILED, model.JobState.CANCELLED):
        raise errors.Conflict(
            f"job {job_id} is {old.job.state}: only a failed or cancelled job is run again"
        )
    tenancy.check(c.settings.tenants, old.job.tenant, old.job.executor)
    made = await c.rerun(job_id, tenant_made=True, limited=True)
    await audit(c, who, "jobs.rerun", str(job_id), old.job.tenant, new_job=made)
    return shapes.view_dict(await visible_job(c, who, made))


@router.post("/jobs/{job_id}/retry", summary="Send a quarantined job back to its queue")
async def job_retry(c: Client, who: Operator, job_id: JobId) -> dict[str, Any]:
    return await _change(c, who, job_id, "jobs.retry", lambda i, why: c.dead_retry(i, reason=why))


@router.post("/jobs/{job_id}/discard", summary="Give up on a quarantined job (cancelled)")
async def job_discard(c: Client, who: Operator, job_id: JobId) -> dict[str, Any]:
    return await _change(
        c, who, job_id, "jobs.discard", lambda i, why: c.dead_discard(i, reason=why)
    )


@router.get("/audit", summary="The changes made through the API, the newest first")
async def audit_list(
    c: Client, who: Viewer, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> list[dict[str, Any]]:
    found = await c.audit_list(tenant=who.token.tenant, limit=limit)
    return [shapes.audit_dict(a) for a in found]


@router.get(
    "/pools",
    summary="The pools of the settings: each one's limit and the jobs of the token's tenant"
    " running in it",
)
async def pools_list(c: Client, who: Viewer) -> list[dict[str, Any]]:
    limits = dict(c.settings.pools)
    running = await c.pools_running(sorted(limits), tenant=who.token.tenant)
    return [
        {"name": name, "limit": limit, "running": running.get(name, 0)}
        for name, limit in sorted(limits.items())
    ]


@router.get("/alerts", summary="The alerts sent about the token's tenant, the newest first")
async def alerts_history(
    c: Client, who: Viewer, limit: Annotated[int, Query(ge=1, le=1000)] = 50
) -> list[dict[str, Any]]:
    found = await c.alerts(limit=limit, tenant=who.token.tenant)
    return [shapes.alert_brief_dict(a) for a in found]


def add_health(app: FastAPI) -> None:
    """/healthz (the process answers) and /readyz (and reaches its database): no token."""

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", include_in_schema=False)
    async def readyz(request: Request) -> Any:
        c: client.Client = request.app.state.client
        try:
            await c.event_newest()
        except errors.StoreError as exc:
            return JSONResponse({"status": "unready", "error": str(exc)}, status_code=503)
        return {"status": "ready"}
