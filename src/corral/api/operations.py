"""The routes of bulk actions: preview what a retry, cancel or discard by filter would touch
(/jobs/bulk/preview), start it as an operation on that snapshot of ids (/operations), and
follow or stop it. An operation belongs to the tenant of the token that made it (a token
of every tenant may name one in the filter, or act on every tenant); another tenant's
operation is not found (404), as another tenant's job is not."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from corral import client, errors, model, shapes
from corral.api.auth import Caller, Client, Operator, Viewer
from corral.api.routes import MAX_ID, RESPONSES, audit, plain_json, when

router = APIRouter(responses=RESPONSES)

OperationId = Annotated[int, Path(ge=1, le=MAX_ID, description="The operation's id.")]
SKIPPED_SHOWN = 20
"""How many skipped jobs, with why, an operation's page shows."""


class Filter(BaseModel):
    """Which jobs: the job list's filters. Only the jobs the action can touch count (a
    retry or discard: quarantined jobs; a cancel: jobs not ended)."""

    model_config = ConfigDict(extra="forbid")

    state: list[str] | None = Field(None, description='Job states, e.g. ["quarantined"].')
    queue: str | None = None
    executor: str | None = None
    label: list[str] | None = Field(None, description="KEY=VALUE; jobs with each label.")
    schedule: str | None = Field(None, description="Jobs fired by this schedule.")
    since: datetime | None = Field(None, description="Created at or after (ISO 8601).")
    until: datetime | None = Field(None, description="Created before (ISO 8601).")
    tenant: str | None = Field(
        None, description="A token of every tenant: whose jobs (default: every tenant's)."
    )


class PreviewBody(BaseModel):
    """A bulk action and the jobs it is about."""

    model_config = ConfigDict(extra="forbid")

    action: model.BulkAction
    filter: Filter = Field(default_factory=Filter)


class OperationBody(PreviewBody):
    """A bulk action to start, with the count its preview showed."""

    expect: int = Field(
        ge=0,
        le=model.BULK_MAX_JOBS,
        description="The count the preview showed: if the filter now matches another number"
        " of jobs, nothing starts (409, with the new count).",
    )


def _scope(who: Caller, body: PreviewBody) -> tuple[str | None, model.JobFilter]:
    """Whose jobs (None: every tenant's) and which, checked; InvalidInput naming the field."""
    given = body.filter
    plain_json(given.model_dump(mode="json", exclude_none=True), prefix="filter.")
    mine = who.token.tenant
    if mine is not None and given.tenant not in (None, mine):
        raise errors.InvalidInput(f"filter.tenant: this token acts for tenant {mine!r} only")
    chosen = client.operations.job_filter(
        body.action,
        states=given.state or (),
        queue=given.queue,
        executor=given.executor,
        labels=given.label or (),
        schedule=given.schedule,
        since=when(given.since, "filter.since"),
        until=when(given.until, "filter.until"),
    )
    return (mine if mine is not None else given.tenant), chosen


async def _visible(c: client.Client, who: Caller, operation_id: int) -> model.Operation:
    """The operation, if the caller's tenant may see it (one of every tenant: only a token
    of every tenant); else 404, the same as for one that does not exist."""
    try:
        op = await c.operation(operation_id)
    except errors.NotFound:
        op = None
    mine = who.token.tenant
    if op is None or (mine is not None and op.tenant != mine):
        raise errors.RequestRefused(404, f"no operation {operation_id}")
    return op


@router.post(
    "/jobs/bulk/preview",
    summary="What a bulk retry, cancel or discard would touch now: the exact count and the"
    " newest ids",
)
async def bulk_preview(c: Client, who: Operator, body: PreviewBody) -> dict[str, Any]:
    tenant, chosen = _scope(who, body)
    seen = await c.bulk_preview(body.action, chosen, tenant=tenant)
    return {
        "action": body.action.value,
        "tenant": tenant,
        "filter": chosen.as_json(),
        "count": seen.count,
        "sample": list(seen.sample),
        "limit": model.BULK_MAX_JOBS,
    }


@router.post(
    "/operations",
    status_code=202,
    summary="Start a bulk action on the jobs its preview counted (a snapshot of their ids)",
)
async def operation_start(c: Client, who: Operator, body: OperationBody) -> Any:
    tenant, chosen = _scope(who, body)
    try:
        op = await c.bulk_start(
            body.action,
            chosen,
            tenant=tenant,
            expect=body.expect,
            made_by=f"token {who.token.name}",
            token_id=who.token.id,
        )
    except errors.CountChanged as changed:
        return JSONResponse(
            {"error": str(changed), "field": "expect", "count": changed.count}, status_code=409
        )
    details = {"bulk": op.action.value, "filter": dict(op.filter), "total": op.total}
    await audit(c, who, "operations.start", str(op.id), op.tenant, **details)
    return shapes.operation_dict(op)


@router.get("/operations", summary="Bulk operations, the newest first")
async def operations_list(
    c: Client,
    who: Viewer,
    before: Annotated[
        int | None, Query(ge=1, le=MAX_ID, description="Only ids below this one.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    found = await c.operations(tenant=who.token.tenant, limit=limit, before=before)
    return {
        "operations": [shapes.operation_dict(op) for op in found],
        "next": found[-1].id if len(found) == limit else None,
    }


@router.get(
    "/operations/{operation_id}",
    summary="A bulk operation's progress, and the first jobs it skipped with why",
)
async def operation_get(c: Client, who: Viewer, operation_id: OperationId) -> dict[str, Any]:
    op = await _visible(c, who, operation_id)
    skipped = await c.operation_skipped(op.id, limit=SKIPPED_SHOWN) if op.skipped else []
    return {
        **shapes.operation_dict(op),
        "skipped_jobs": [{"job_id": i.job_id, "note": i.note} for i in skipped],
    }


@router.post(
    "/operations/{operation_id}/cancel",
    summary="Stop a bulk operation: the jobs it has not reached are left as they are",
)
async def operation_cancel(c: Client, who: Operator, operation_id: OperationId) -> dict[str, Any]:
    op = await _visible(c, who, operation_id)
    if op.state == model.OperationState.CANCELLED:  # nothing changes, so nothing to audit
        return shapes.operation_dict(op)
    stopped = await c.operation_cancel(op.id)
    await audit(c, who, "operations.cancel", str(op.id), op.tenant, left=stopped.left)
    return shapes.operation_dict(stopped)
