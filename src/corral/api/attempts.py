"""Calls from inside a running attempt, made with its attempt token, not a person's.

When `api_url` is set, an attempt gets CORRAL_API_URL and CORRAL_ATTEMPT_TOKEN in place
of the database's URL. The token names one attempt of one job and is good for that
attempt's own calls only: its heartbeat, its job's payload and checkpoint, and the
pointer swap of a dataset it publishes. Every call checks the fence: once a newer attempt
exists, or this one has ended, the answer is 409 and the attempt must stop. A person's
token is refused here (401), and an attempt token everywhere else.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from corral import model
from corral.api.auth import ERRORS, Client, ErrorBody, Refused, client_of

router = APIRouter(
    prefix="/attempt",
    tags=["attempt"],
    responses={**ERRORS, 409: {"model": ErrorBody, "description": "A newer attempt exists"}},
)


@dataclasses.dataclass(frozen=True, slots=True)
class Attempt:
    """The attempt a call comes from: its job and its fence."""

    job_id: int
    fence: int


async def attempt(request: Request) -> Attempt:
    """The attempt of the request's token, while it may still act: 401 for any other
    token, 409 once a newer attempt exists or this one has ended."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    challenge = {"WWW-Authenticate": "Bearer"}
    c = client_of(request)
    found = await c.attempt_of(token.strip()) if scheme.lower() == "bearer" else None
    if found is None:
        raise Refused(
            401,
            "authorization: send Authorization: Bearer $CORRAL_ATTEMPT_TOKEN (an attempt's"
            " own token)",
            headers=challenge,
        )
    job_id, fence = found
    await c.store.attempts.check(job_id=job_id, fence=fence)
    return Attempt(job_id, fence)


Caller = Annotated[Attempt, Depends(attempt)]


class Heartbeat(BaseModel):
    job_id: int
    fence: int
    lease_until: datetime | None = Field(description="When the lease now ends; null: none.")


class Payload(BaseModel):
    job_id: int
    payload: Any = Field(description="The job's payload, as submitted (null: none).")


class Checkpoint(BaseModel):
    state: Any = Field(description="The newest state saved, by whichever attempt.")
    fence: int | None = Field(description="The attempt that saved it; null: none saved yet.")


class NewCheckpoint(BaseModel):
    state: Any = Field(description="Any JSON value.")


class Pointer(BaseModel):
    tenant: str = Field(description="The tenant whose dataset this is: the attempt's job's.")
    dataset: str
    fence: int
    location: str
    code_version: str | None
    published_at: datetime


class Swap(BaseModel):
    dataset: str = Field(min_length=1, max_length=500)
    location: str = Field(min_length=1, max_length=2000)
    code_version: str | None = Field(None, max_length=200)


def _pointer(p: model.Pointer) -> Pointer:
    return Pointer(
        tenant=p.tenant,
        dataset=p.dataset,
        fence=p.fence,
        location=p.location,
        code_version=p.code_version,
        published_at=p.published_at,
    )


@router.post("/heartbeat")
async def heartbeat(who: Caller, c: Client) -> Heartbeat:
    """This attempt is alive: its lease is renewed from now."""
    lease = await c.heartbeat(who.job_id, who.fence)
    return Heartbeat(job_id=who.job_id, fence=who.fence, lease_until=lease)


@router.get("/payload")
async def payload(who: Caller, c: Client) -> Payload:
    """The payload of this attempt's job."""
    job = await c.store.jobs.get(job_id=who.job_id)
    return Payload(job_id=job.id, payload=job.payload)


@router.get("/checkpoint")
async def checkpoint_load(who: Caller, c: Client) -> Checkpoint:
    """This job's newest checkpoint."""
    found = await c.store.sinks.checkpoint_load(job_id=who.job_id)
    return (
        Checkpoint(state=None, fence=None)
        if found is None
        else Checkpoint(state=found[1], fence=found[0])
    )


@router.put("/checkpoint", status_code=204)
async def checkpoint_save(body: NewCheckpoint, who: Caller, c: Client) -> None:
    """Keep `state` as this job's checkpoint (409 once a newer attempt has saved one)."""
    await c.store.sinks.checkpoint_save(
        job_id=who.job_id, fence=who.fence, state=body.state, now=c.clock.now()
    )


@router.get("/pointer")
async def pointer_get(
    who: Caller, c: Client, dataset: Annotated[str, Query(min_length=1, max_length=500)]
) -> Pointer | None:
    """Where `dataset` of this attempt's tenant points now; null before anything was
    published (another tenant's dataset of that name is not this one)."""
    found = await c.store.sinks.pointer_get(dataset=dataset, fence=who.fence)
    return None if found is None else _pointer(found)


@router.post("/pointer", response_model=Pointer)
async def pointer_swap(body: Swap, who: Caller, c: Client) -> Pointer | JSONResponse:
    """Point `dataset` of this attempt's tenant at `location`, this attempt's output:
    applied only over a lower fence (409, naming the newer one, when an attempt as new or
    newer published it)."""
    swapped = await c.store.sinks.pointer_swap(
        dataset=body.dataset,
        fence=who.fence,
        location=body.location,
        code_version=body.code_version,
        now=c.clock.now(),
    )
    if not isinstance(swapped, model.Pointer):
        said = (
            f"fence: {swapped} published {body.dataset} already, newer than (or the same as)"
            f" this attempt's {who.fence}"
        )
        return JSONResponse({"error": said, "field": "fence", "newer": swapped}, status_code=409)
    return _pointer(swapped)
