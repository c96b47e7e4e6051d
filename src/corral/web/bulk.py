"""The dashboard's bulk actions: "Retry all… / Discard all… / Cancel all…" on the jobs list
(with its filters) and the quarantined page open a preview (the exact count and some of
the ids), whose confirm form starts the operation on the snapshot of ids the count was
taken on; the operations pages follow it live and can stop it.

The confirm form carries the previewed count: when the filter matches another number of
jobs by then, nothing starts and the preview is shown again with the new count (409).
Another tenant's operation is not found (404), as another tenant's job is not."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request
from fastapi import Path as PathParam
from starlette.responses import Response

from corral import access, client, errors, model
from corral.web import auth, live
from corral.web.auth import Operator, Viewer
from corral.web.pages import MAX_ID, audit, back, page, render

router = APIRouter(prefix="/ui", include_in_schema=False)
OperationId = Annotated[int, PathParam(ge=1, le=MAX_ID)]
OPERATIONS_PAGE = 50
"""Operations on one page of their list."""
SKIPPED_SHOWN = 20
"""Skipped jobs, with why, an operation's page shows."""
_DOING = {
    model.BulkAction.RETRY: "send back to their queues",
    model.BulkAction.DISCARD: "discard",
    model.BulkAction.CANCEL: "cancel",
}


FIELDS = ("action", "state", "queue", "label")
"""The fields a preview and its confirm form carry: the action and the jobs list's filters."""


def _chosen(given: dict[str, str]) -> tuple[model.BulkAction, model.JobFilter]:
    """The action and the jobs of a preview's fields; InvalidInput naming what is wrong."""
    action = given.get("action", "")
    if action not in model.BulkAction.__members__.values():
        raise errors.InvalidInput(f"action: {action!r} is not retry, discard or cancel")
    state, label = given.get("state", ""), given.get("label", "")
    chosen = client.operations.job_filter(
        model.BulkAction(action),
        states=[state] if state else (),
        queue=given.get("queue") or None,
        labels=[label] if label else (),
        prefix="",
    )
    return model.BulkAction(action), chosen


async def _preview(
    request: Request,
    who: access.WebSession,
    form: dict[str, str],
    status: int = 200,
    said: str = "",
) -> Response:
    """The preview page of a bulk action on the filters in `form`, with its confirm form
    (for an operator); `said` tells why it is shown again."""
    if not who.role.allows(access.Role.OPERATOR):
        raise errors.Forbidden(f"a {who.role} may look but not act; it takes an operator")
    given = {k: form.get(k, "") for k in FIELDS}
    seen, doing, wrong = None, "", ""
    try:
        action, chosen = _chosen(given)
        seen = await auth.client_of(request).bulk_preview(action, chosen, tenant=who.tenant)
        doing = _DOING[action]
    except errors.InvalidInput as exc:
        wrong = str(exc)
    return page(
        request, "bulk.html", who, status=status, given=given, seen=seen, doing=doing,
        wrong=wrong, changed=said, back_to=f"/ui/jobs?{urlencode(_filters(given))}",
    )  # fmt: skip


def _filters(given: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in given.items() if k != "action" and v}


@router.get("/bulk")
async def bulk_preview(
    request: Request, who: Viewer, action: str = "", state: str = "", queue: str = "",
    label: str = "",
) -> Response:  # fmt: skip
    """What a bulk action on these filters would touch now, and a form to start it."""
    form = {"action": action, "state": state, "queue": queue, "label": label}
    return await _preview(request, who, form)


@router.post("/operations")
async def operation_start(request: Request, acting: Operator) -> Response:
    """Start the previewed action on the jobs it counted; the preview again (409) when the
    filters now match another number of jobs."""
    c, who, form = auth.client_of(request), acting.who, acting.form
    given = form.get("expect", "")
    expect = int(given) if given.isascii() and given.isdigit() else -1  # not "²"
    try:
        action, chosen = _chosen(form)
        if expect < 0:
            raise errors.InvalidInput("expect: the form lost the previewed count: preview again")
        op = await c.bulk_start(
            action,
            chosen,
            tenant=who.tenant,
            expect=expect,
            made_by=f"{who.name} (dashboard)",
            token_id=who.token_id,
        )
    except errors.CountChanged as changed:
        said = f"The filters now match {changed.count:,} jobs, not {expect:,}: confirm again."
        return await _preview(request, who, form, status=409, said=said)
    except errors.InvalidInput as exc:
        return await _preview(request, who, form, status=400, said=str(exc))
    details = {"bulk": op.action.value, "filter": dict(op.filter), "total": op.total}
    await audit(c, who, "operations.start", str(op.id), op.tenant, **details)
    return back(f"/ui/operations/{op.id}")


@router.get("/operations")
async def operations(
    request: Request, who: Viewer, before: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None
) -> Response:
    """Bulk operations, the newest first."""
    c = auth.client_of(request)
    found = await c.operations(tenant=who.tenant, limit=OPERATIONS_PAGE, before=before)
    more = found[-1].id if len(found) == OPERATIONS_PAGE else None
    return page(request, "operations.html", who, operations=found, next_page=more)


async def _visible(c: client.Client, who: access.WebSession, operation_id: int) -> model.Operation:
    try:
        op = await c.operation(operation_id)
    except errors.NotFound:
        raise errors.PageMissing(f"no operation {operation_id}") from None
    if who.tenant is not None and op.tenant != who.tenant:
        raise errors.PageMissing(f"no operation {operation_id}")
    return op


async def _operation_values(c: client.Client, op: model.Operation) -> dict[str, Any]:
    skipped = await c.operation_skipped(op.id, limit=SKIPPED_SHOWN) if op.skipped else []
    return {"op": op, "skipped": skipped, "goes_on": op.state == model.OperationState.RUNNING}


@router.get("/operations/{operation_id}")
async def operation(request: Request, who: Viewer, operation_id: OperationId) -> Response:
    c = auth.client_of(request)
    op = await _visible(c, who, operation_id)
    return page(request, "operation.html", who, **await _operation_values(c, op))


@router.get("/operations/{operation_id}/stream")
async def operation_stream(request: Request, who: Viewer, operation_id: OperationId) -> Response:
    """The part of an operation's page that changes, pushed each time its progress moves
    (live.py), until it has stopped."""
    c = auth.client_of(request)
    await _visible(c, who, operation_id)

    async def look() -> tuple[str, int, int]:
        op = await c.operation(operation_id)
        return op.state, op.applied, op.skipped

    async def draw() -> live.Drawn:
        values = await _operation_values(c, await _visible(c, who, operation_id))
        html = render(request, "operation_live.html", who, **values)
        return live.Drawn({"live": html}, goes_on=values["goes_on"])

    return live.stream(request, look, draw)


@router.post("/operations/{operation_id}/cancel")
async def operation_cancel(
    request: Request, acting: Operator, operation_id: OperationId
) -> Response:
    """Stop an operation: the jobs it has not reached are left as they are."""
    c, who = auth.client_of(request), acting.who
    op = await _visible(c, who, operation_id)
    to = f"/ui/operations/{op.id}"
    if op.state != model.OperationState.RUNNING:
        return back(to, "operation-ended", op=op.id, state=op.state)
    stopped = await c.operation_cancel(op.id)
    await audit(c, who, "operations.cancel", str(op.id), op.tenant, left=stopped.left)
    return back(to, "operation-stopped", op=op.id, left=f"{stopped.left:,}")
