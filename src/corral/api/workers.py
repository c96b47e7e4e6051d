"""Python workers and parked jobs: who is registered, what waits for a worker that can
read it, and a person's release of a parked job."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from corral import errors, model, shapes
from corral.api.auth import Client, Operator, Refused, Viewer
from corral.api.routes import RESPONSES, JobId, audit, visible_job

router = APIRouter(responses=RESPONSES)


@router.get("/workers", summary="The registered workers, with what each reads (every tenant's)")
async def workers_list(
    c: Client,
    who: Viewer,
    every: Annotated[bool, Query(alias="all", description="Stopped ones too")] = False,
) -> list[dict[str, Any]]:
    if who.token.tenant is not None:
        raise Refused(
            403, "tenant: workers serve every tenant; seeing them takes a token of every tenant"
        )
    found = await c.store.workers.list(since=c.since(), live=not every)
    return [shapes.worker_dict(w) for w in found]


@router.get("/parked", summary="The token's tenant's parked jobs, oldest first")
async def parked_list(
    c: Client,
    who: Viewer,
    task: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[dict[str, Any]]:
    found = await c.store.workers.parked_list(task=task, tenant=who.token.tenant, limit=limit)
    return [shapes.parked_dict(p) for p in found]


@router.post(
    "/jobs/{job_id}/release",
    summary="Queue a parked job again by hand (it is not parked again by itself)",
)
async def job_release(c: Client, who: Operator, job_id: JobId) -> dict[str, Any]:
    view = await visible_job(c, who, job_id)
    if view.job.state != model.JobState.PARKED:
        raise errors.Conflict(f"job {job_id} is {view.job.state}: only a parked job is released")
    await c.store.workers.parked_release(job_ids=[job_id], now=c.clock.now())
    await audit(c, who, "jobs.release", str(job_id), view.job.tenant)
    return shapes.view_dict(await visible_job(c, who, job_id))
