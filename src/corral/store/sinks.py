"""What sinks keep: a job's checkpoint and dataset publish pointers, both fenced."""

from __future__ import annotations

import functools
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, func, select

from corral import errors, launching, model
from corral.store import dialects
from corral.store.tables import (
    attempts,
    checkpoints,
    jobs,
    publish_pointers,
)

if TYPE_CHECKING:
    from corral.store.database import Database

A, J = model.AttemptState, model.JobState


# --- checkpoints -------------------------------------------------------------------------------


def checkpoint_save(
    conn: Connection, *, job_id: int, fence: int, state: Any, now: datetime
) -> None:
    """Keep `state` as job `job_id`'s checkpoint, written by attempt `fence`. Refused with
    StaleFence when a newer attempt of the job exists or has saved: an attempt that was
    replaced cannot roll its successor's progress back. The job's row is locked first, so
    a relaunch cannot slip between the check and the write."""
    # A claim updates the job's row: locking it first orders this check against a
    # relaunch committing meanwhile (PostgreSQL; SQLite writers never overlap).
    dialects.lock_in_order(conn, jobs, [job_id])
    newest = conn.execute(
        select(func.max(attempts.c.id)).where(attempts.c.job_id == job_id)
    ).scalar_one_or_none()
    if newest is None:
        raise errors.NotFound(f"job {job_id} has no attempts: no checkpoint to keep")
    if fence < newest:
        raise errors.StaleFence(
            f"fence {fence} is stale: job {job_id}'s newest attempt has fence {newest};"
            " its checkpoint is not this attempt's to write"
        )
    insert = dialects.upsert(conn, checkpoints)
    stmt = (
        insert.values(job_id=job_id, fence=fence, state=state, saved_at=now)
        .on_conflict_do_update(
            index_elements=[checkpoints.c.job_id],
            set_={"fence": fence, "state": state, "saved_at": now},
            where=checkpoints.c.fence <= fence,
        )
        .returning(checkpoints.c.job_id)
    )
    if conn.execute(stmt).first() is None:
        held = conn.execute(
            select(checkpoints.c.fence).where(checkpoints.c.job_id == job_id)
        ).scalar_one()
        raise errors.StaleFence(
            f"fence {fence} is stale: job {job_id}'s checkpoint was saved by fence {held}"
        )


def checkpoint_load(conn: Connection, *, job_id: int) -> tuple[int, Any] | None:
    """Job `job_id`'s checkpoint: the fence that saved it and its state; None if none."""
    row = conn.execute(
        select(checkpoints.c.fence, checkpoints.c.state).where(checkpoints.c.job_id == job_id)
    ).first()
    return None if row is None else (int(row.fence), row.state)


# --- publish pointers ---------------------------------------------------------------------


def pointer_swap(
    conn: Connection,
    *,
    dataset: str,
    fence: int,
    location: str,
    code_version: str | None,
    now: datetime,
) -> launching.Pointer | int:
    """Point `dataset` of the tenant of attempt `fence`'s job at `location`: a
    compare-and-swap that applies when the stored fence is lower, or there is none (or it
    is this same publish again: same fence and location, so a retried publish is not
    refused). Returns the pointer it wrote, else the fence that holds the pointer. The
    tenant is the fence's, never the caller's word: an attempt swaps its own tenant's
    pointers only."""
    tenant = fence_tenant(conn, fence=fence)
    insert = dialects.upsert(conn, publish_pointers)
    values = {"fence": fence, "location": location, "code_version": code_version}
    held = publish_pointers.c
    stmt = (
        insert.values(tenant=tenant, dataset=dataset, published_at=now, **values)
        .on_conflict_do_update(
            index_elements=[held.tenant, held.dataset],
            set_={**values, "published_at": now},
            where=(held.fence < fence) | ((held.fence == fence) & (held.location == location)),
        )
        .returning(*publish_pointers.c)
    )
    row = conn.execute(stmt).first()
    if row is not None:
        return _pointer(row)
    mine = (held.tenant == tenant) & (held.dataset == dataset)
    return int(conn.execute(select(held.fence).where(mine)).scalar_one())


def pointer_get(
    conn: Connection, *, dataset: str, tenant: str | None = None, fence: int | None = None
) -> launching.Pointer | None:
    """Where `dataset` of `tenant` (or of the tenant of attempt `fence`'s job) points now,
    and who put it there. Another tenant's dataset of the same name is not this one."""
    if tenant is None:
        if fence is None:
            raise errors.InvalidInput("pointer: give the tenant, or the fence of an attempt")
        tenant = fence_tenant(conn, fence=fence)
    held = publish_pointers.c
    row = conn.execute(
        select(publish_pointers).where((held.tenant == tenant) & (held.dataset == dataset))
    ).first()
    return None if row is None else _pointer(row)


def fence_tenant(conn: Connection, *, fence: int) -> str:
    """The tenant of the job of attempt `fence`; `default` when no such attempt is stored
    (a fence given by hand on the store, whose holder is the operator, or one forgotten:
    as migration 0023 placed those pointers). Over the API the attempt always exists: its
    token was checked against it."""
    tenant = conn.execute(
        select(jobs.c.tenant)
        .select_from(attempts.join(jobs, jobs.c.id == attempts.c.job_id))
        .where(attempts.c.id == fence)
    ).scalar_one_or_none()
    return "default" if tenant is None else str(tenant)


def _pointer(row: Any) -> launching.Pointer:
    return launching.Pointer(
        tenant=row.tenant,
        dataset=row.dataset,
        fence=int(row.fence),
        location=row.location,
        code_version=row.code_version,
        published_at=row.published_at,
    )


# --- the handle ----------------------------------------------------------------------------


class Sinks:
    """The store's handle on what fenced sinks keep (`store.sinks`): checkpoints and
    publish pointers; each call one transaction.

    Each method runs the store function its name shortens (`pointer_swap`: pointer_swap),
    named in its body; that function's docstring says what the call does.
    """

    def __init__(self, db: Database) -> None:
        self._db = db

    async def checkpoint_save(self, *, job_id: int, fence: int, state: Any, now: datetime) -> None:
        await self._db.tx(
            functools.partial(checkpoint_save, job_id=job_id, fence=fence, state=state, now=now)
        )

    async def checkpoint_load(self, *, job_id: int) -> tuple[int, Any] | None:
        return await self._db.tx(functools.partial(checkpoint_load, job_id=job_id))

    async def pointer_swap(
        self, *, dataset: str, fence: int, location: str, code_version: str | None, now: datetime
    ) -> launching.Pointer | int:
        return await self._db.tx(
            functools.partial(
                pointer_swap,
                dataset=dataset,
                fence=fence,
                location=location,
                code_version=code_version,
                now=now,
            )
        )

    async def pointer_get(
        self, *, dataset: str, tenant: str | None = None, fence: int | None = None
    ) -> launching.Pointer | None:
        return await self._db.tx(
            functools.partial(pointer_get, dataset=dataset, tenant=tenant, fence=fence)
        )
