"""Server-sent events: a job's run log as it is written, and every new event of the
token's tenant. Each message's `id` is the event's id: a client that reconnects with
`Last-Event-ID` (or `?after=`) goes on where it left off.

Event ids are handed out as transactions begin and seen as they commit, so an id can
appear after a higher one: the stream of all events holds at a missing id until no
transaction that took it can still be alive (timeouts.database_transaction_timeout),
as the alerter does, and so never skips one."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from sse_starlette.sse import EventSourceResponse
from starlette.background import BackgroundTask

from corral import client, errors, model
from corral.api.auth import ERRORS, Client, ErrorBody, Refused, Viewer
from corral.api.routes import MAX_ID, JobId, visible_job
from corral.web import live

router = APIRouter(
    responses={
        **ERRORS,
        429: {"model": ErrorBody, "description": "Too many event streams open at once"},
    }
)

POLL = 0.5
"""Seconds between looks at the store for new events."""
PAGE = 500
"""Most events one look reads."""
STILL = {*model.FINAL_JOB_STATES, model.JobState.QUARANTINED}
"""A job in one of these states changes no more unless a person acts: its stream ends."""
MAX_SECONDS = 3600.0
"""How long a job's stream lasts at most (one of a job scheduled far ahead would never
end): a client goes on where it left off with Last-Event-ID."""
MAX_STREAMS = 100
"""The most event streams one API process serves at once; one more is refused (429). The
dashboard's live pages have as many of their own (web.live.MAX_STREAMS)."""

After = Annotated[int | None, Query(ge=0, le=MAX_ID, description="Only events after this id.")]
LastEventId = Annotated[str | None, Header(include_in_schema=False)]


def _message(e: model.Event) -> dict[str, Any]:
    data = {
        "id": e.id,
        "job_id": e.job_id or None,
        "at": e.at.isoformat(),
        "entity": e.entity,
        "attempt_id": e.attempt_id,
        "from": e.from_state,
        "to": e.to_state,
        "reason": e.reason,
        "details": dict(e.details),
    }
    return {"id": str(e.id), "event": "event", "data": json.dumps(data)}


def _start(after: int | None, last_event_id: str | None) -> int:
    """Where a stream starts: after `after`, else after the Last-Event-ID header (an event
    id: ASCII digits, at most MAX_ID), else from the first event."""
    if after is not None:
        return after
    if last_event_id is None:
        return 0
    if not (last_event_id.isascii() and last_event_id.isdigit()) or int(last_event_id) > MAX_ID:
        raise errors.InvalidInput(f"Last-Event-ID: must be an event id, 0 to {MAX_ID}")
    return int(last_event_id)


def _streamed(request: Request, messages: AsyncIterator[dict[str, Any]]) -> EventSourceResponse:
    """The answer that streams `messages` in one of the process's slots, given back when it
    ends, however it ends (even if it never started)."""
    slots = getattr(request.app.state, "stream_slots", None)
    if slots is None:
        slots = request.app.state.stream_slots = live.Slots(MAX_STREAMS)
    give_back = slots.take()
    if give_back is None:
        raise Refused(
            429,
            f"stream: {slots.limit} event streams are open already; try again later",
            headers={"Retry-After": "5"},
        )

    async def held() -> AsyncIterator[dict[str, Any]]:
        try:
            async for m in messages:
                yield m
        finally:
            give_back()

    return EventSourceResponse(held(), ping=15, background=BackgroundTask(give_back))


@router.get(
    "/jobs/{job_id}/events/stream",
    summary="A job's run log as server-sent events, until the job has ended or is quarantined"
    " (at most an hour: go on with Last-Event-ID)",
    response_class=EventSourceResponse,
)
async def job_events_stream(
    request: Request,
    c: Client,
    who: Viewer,
    job_id: JobId,
    after: After = None,
    last_event_id: LastEventId = None,
) -> EventSourceResponse:
    await visible_job(c, who, job_id)
    start = _start(after, last_event_id)
    ends = c.clock.monotonic() + MAX_SECONDS

    async def messages() -> AsyncIterator[dict[str, Any]]:
        cursor = start
        while not await request.is_disconnected() and c.clock.monotonic() < ends:
            ids, found = await c.store.events.page(after=cursor, limit=PAGE, job_id=job_id)
            for e in found:
                yield _message(e)
            cursor = ids[-1] if ids else cursor
            if not ids:
                if await _still(c, job_id):
                    ids, found = await c.store.events.page(after=cursor, limit=PAGE, job_id=job_id)
                    for e in found:  # what the end wrote, then no more
                        yield _message(e)
                    return
                await c.clock.sleep(POLL)

    return _streamed(request, messages())


async def _still(c: client.Client, job_id: int) -> bool:
    """Whether the job will not change without a person (or is gone: forgotten meanwhile)."""
    try:
        return (await c.store.jobs.get(job_id=job_id)).state in STILL
    except errors.NotFound:
        return True


@router.get(
    "/events/stream",
    summary="Every new event of the token's tenant, as server-sent events",
    response_class=EventSourceResponse,
)
async def events_stream(
    request: Request,
    c: Client,
    who: Viewer,
    after: After = None,
    follow: Annotated[
        bool, Query(description="Go on as new events come (else end when caught up).")
    ] = True,
    last_event_id: LastEventId = None,
) -> EventSourceResponse:
    start = _start(after, last_event_id)
    if after is None and last_event_id is None:
        start = await c.store.alerts.event_newest()  # from now on

    async def messages() -> AsyncIterator[dict[str, Any]]:
        cursor = start
        holding = _Gaps(c)
        while not await request.is_disconnected():
            ids, found = await c.store.events.page(
                after=cursor, limit=PAGE, tenant=who.token.tenant
            )
            upto = holding.upto(cursor, ids)
            for e in found:
                if e.id <= upto:
                    yield _message(e)
            if upto == cursor:
                if not follow:
                    return
                await c.clock.sleep(POLL)
            cursor = upto

    return _streamed(request, messages())


class _Gaps:
    """How far a run of event ids can be read now: up to a missing id, until it has been
    missing longer than any transaction lives."""

    def __init__(self, c: client.Client) -> None:
        self.c = c
        self.wait = c.settings.timeouts.database_transaction_timeout.total_seconds() + 1
        self.first_missed: dict[int, float] = {}

    def upto(self, cursor: int, ids: list[int]) -> int:
        now = self.c.clock.monotonic()
        upto = cursor
        for i in ids:
            if i != upto + 1:
                seen = self.first_missed.setdefault(upto + 1, now)
                if now - seen < self.wait:
                    break
                self.first_missed.pop(upto + 1, None)
            upto = i
        return upto
