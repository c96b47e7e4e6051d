"""The routes of /api/v1: jobs (submit one or many, list, get, cancel, rerun, explain, events
and run logs), quarantined jobs (retry, discard), and the audit log. Every route that
takes a job finds it through `_job`, which answers 404 for another tenant's."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Body, FastAPI, Path, Query, Request
from fastapi.responses import JSONResponse

from corral import client, errors, model, shapes
from corral.api.auth import ERRORS, Caller, Client, Operator, Refused, Since, Viewer

router = APIRouter(responses=ERRORS)

MAX_JOBS = 1000
"""The most jobs one submit takes."""

MAX_ID = 2**63 - 1
"""The largest id the databases hold (a signed 64-bit integer)."""
JobId = Annotated[int, Path(ge=1, le=MAX_ID, description="The job's id.")]
Labels = Annotated[
    list[str] | None, Query(description="KEY=VALUE; the jobs with each label given.")
]


async def visible_job(c: client.Client, who: Caller, job_id: int) -> client.JobView:
    """The job, with its attempts and run log, if the caller's tenant may see it; else
    404, the same as for a job that does not exist."""
    try:
        view = await c.job(job_id)
    except errors.NotFound:
        view = None
    if view is None or not who.sees(view.job.tenant):
        raise Refused(404, f"no job {job_id}")
    return view


async def _audit(c: client.Client, who: Caller, action: str, target: str, **details: Any) -> None:
    await c.store.audit_add(
        at=c.clock.now(),
        token_id=who.token.id,
        tenant=who.token.tenant,
        action=action,
        target=target,
        details=details,
    )


def _tenant_of(who: Caller, given: dict[str, Any]) -> dict[str, Any]:
    """A submitted job's arguments with its tenant: the caller's when not given; one
    the caller may not act for is refused naming the field."""
    tenant = given.get("tenant")
    if tenant is None:
        return {**given, "tenant": who.token.tenant or "default"}
    if not isinstance(tenant, str) or not who.sees(tenant):
        raise errors.InvalidInput(f"tenant: this token acts for tenant {who.token.tenant!r} only")
    return given


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
            args = client.submit_arguments(_tenant_of(who, one))
            new.append(c.validate(c.new_job(**args)))
        except errors.InvalidInput as exc:
            raise errors.InvalidInput(f"{n}.{exc}" if many else str(exc)) from None
    made = await c.submit_many(new)
    await _audit(c, who, "jobs.submit", ",".join(str(i) for i, _ in made), count=len(made))
    jobs = {j.id: j for j in await c.store.job_get_many(job_ids=[i for i, _ in made])}
    out = [{**shapes.job_dict(jobs[i]), "created": created} for i, created in made]
    return out if many else out[0]


@router.get("/jobs", summary="List jobs, the newest first (keyset: ?before=<id>)")
async def jobs_list(
    c: Client,
    who: Viewer,
    state: Annotated[list[str] | None, Query(description="Job states.")] = None,
    queue: str | None = None,
    tenant: str | None = None,
    executor: str | None = None,
    pool: str | None = None,
    schedule: str | None = None,
    label: Labels = None,
    since: Since = None,
    until: Since = None,
    before: Annotated[
        int | None, Query(ge=1, le=MAX_ID, description="Only ids below this one.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    if tenant is not None and not who.sees(tenant):
        return {"jobs": [], "next": None}
    labels = {}
    for pair in label or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise errors.InvalidInput(f"label: {pair!r} is not KEY=VALUE")
        labels[key] = value
    for s in state or []:
        if s not in model.JobState.__members__.values():
            raise errors.InvalidInput(
                f"state: {s!r} is not a job state; use one of {', '.join(model.JobState)}"
            )
    found = await c.store.job_list(
        states=state or [],
        queue=queue,
        tenant=tenant if tenant is not None else who.token.tenant,
        executor=executor,
        pool=pool,
        schedule=schedule,
        labels=labels,
        since=since,
        until=until,
        before=before,
        limit=limit,
    )
    return {
        "jobs": [shapes.job_dict(j) for j in found],
        "next": found[-1].id if len(found) == limit else None,
    }


@router.get("/jobs/{job_id}", summary="A job with its attempts and its run log")
async def job_get(c: Client, who: Viewer, job_id: JobId) -> dict[str, Any]:
    return shapes.view_dict(await visible_job(c, who, job_id))


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
    await visible_job(c, who, job_id)
    said = await c.explain(job_id)
    return {"id": job_id, "cause": said.partition(":")[0], "explanation": said}


async def _change(
    c: client.Client,
    who: Caller,
    job_id: int,
    action: str,
    do: Callable[[int, str], Awaitable[object]],
) -> dict[str, Any]:
    """Change a job the caller may see: `do(job_id, reason)`, audited; the job after."""
    await visible_job(c, who, job_id)
    await do(job_id, f"{action.partition('.')[2]} through the API (token {who.token.id})")
    await _audit(c, who, action, str(job_id))
    return shapes.view_dict(await visible_job(c, who, job_id))


@router.post("/jobs/{job_id}/cancel", summary="Cancel a job (and stop its attempt)")
async def job_cancel(c: Client, who: Operator, job_id: JobId) -> dict[str, Any]:
    return await _change(c, who, job_id, "jobs.cancel", lambda i, why: c.cancel(i, reason=why))


@router.post(
    "/jobs/{job_id}/rerun", status_code=201, summary="Run an ended job again, as a new job"
)
async def job_rerun(c: Client, who: Operator, job_id: JobId) -> dict[str, Any]:
    await visible_job(c, who, job_id)
    made = await c.rerun(job_id)
    await _audit(c, who, "jobs.rerun", str(job_id), new_job=made)
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
    found = await c.store.audit_list(tenant=who.token.tenant, limit=limit)
    return [
        {
            "id": a.id,
            "at": a.at.isoformat(),
            "token_id": a.token_id,
            "tenant": a.tenant,
            "action": a.action,
            "target": a.target,
            "details": dict(a.details),
        }
        for a in found
    ]


@router.get("/pools", summary="The pools of the settings: each one's limit and jobs running")
async def pools_list(c: Client, who: Viewer) -> list[dict[str, Any]]:
    limits = dict(c.settings.pools)
    running = await c.store.pool_running(pools=sorted(limits))
    return [
        {"name": name, "limit": limit, "running": running.get(name, 0)}
        for name, limit in sorted(limits.items())
    ]


@router.get("/alerts/rules", summary="The alert rules of the settings (admins: channels too)")
async def alert_rules(c: Client, who: Viewer) -> dict[str, Any]:
    settings = c.settings.alerts
    muted = await c.store.alert_muted(now=c.clock.now())
    rules = {
        name: {
            "on": list(r.on),
            "match": r.match.model_dump(exclude_defaults=True),
            "channels": list(r.channels),
            "throttle": r.throttle.total_seconds(),
            "muted_until": muted[name].isoformat() if name in muted else None,
        }
        for name, r in settings.rules.items()
        if r.match.tenant is None or who.sees(r.match.tenant)
    }
    return {"rules": rules}


@router.get("/alerts", summary="The alerts sent about the token's tenant, the newest first")
async def alerts_history(
    c: Client, who: Viewer, limit: Annotated[int, Query(ge=1, le=1000)] = 50
) -> list[dict[str, Any]]:
    found = await c.store.alert_list(limit=limit if who.token.tenant is None else 1000)
    mine = [
        a for a in found if who.token.tenant is None or a.details.get("tenant") == who.token.tenant
    ]
    return [
        {
            "id": a.id,
            "rule": a.rule,
            "channel": a.channel,
            "kind": a.kind,
            "cause": a.cause,
            "subject": a.subject,
            "job_id": a.job_id,
            "state": a.state,
            "created_at": a.created_at.isoformat(),
            "delivered_at": shapes.iso(a.delivered_at),
            "tries": a.tries,
            "last_error": a.last_error,
        }
        for a in mine[:limit]
    ]


def add_health(app: FastAPI) -> None:
    """/healthz (the process answers) and /readyz (and reaches its database): no token."""

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", include_in_schema=False)
    async def readyz(request: Request) -> Any:
        c: client.Client = request.app.state.client
        try:
            await c.store.event_newest()
        except errors.StoreError as exc:
            return JSONResponse({"status": "unready", "error": str(exc)}, status_code=503)
        return {"status": "ready"}
