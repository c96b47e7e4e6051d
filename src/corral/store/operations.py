"""Bulk operations: retry, cancel or discard the jobs a filter matched, on a snapshot.

A preview counts the jobs a filter matches for a tenant (only those the action can touch:
quarantined jobs for retry and discard, jobs not ended for cancel) and shows some of their
ids. Making the operation runs the same query again, in one transaction with the insert of
the operation and of one item a matched job, so the snapshot is exactly what was counted;
when the count is not what the person confirmed (`expect`), nothing is made
(errors.CountChanged).

A step takes the next batch of items not done, in job id order, and applies the action to
each job through the same transitions one job's retry, discard or cancel goes through, in
the transaction that marks the items done: a step cut short leaves nothing half-applied,
and an item is applied once whatever crashes. On PostgreSQL a step first locks its
operation's row (SKIP LOCKED), so two runners never work on one operation at once; the
other moves on. A job that no longer fits the action is skipped with a note.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Select, bindparam, func, insert, literal, select, update

from corral import errors, model
from corral.store import dialects, job_decisions, job_lists, jobs
from corral.store.tables import jobs as jobs_table
from corral.store.tables import operation_items, operations

if TYPE_CHECKING:
    from corral.store.database import Database

J, S = model.JobState, model.OperationState
SAMPLE = 20
"""How many ids a preview shows."""


@dataclass(slots=True)
class Step:
    """What one step did: items applied and skipped, the attempts its cancels stopped (to
    stop on their platform too), and whether the operation has ended."""

    applied: int = 0
    skipped: int = 0
    stopped: list[model.Attempt] = field(default_factory=list)
    ended: bool = False

    @property
    def done(self) -> int:
        return self.applied + self.skipped


# --- preview and snapshot ---------------------------------------------------------------------


def _matching(
    conn: Connection, tenant: str | None, action: model.BulkAction, given: model.JobFilter
) -> Select[Any]:
    """The ids of the jobs `given` matches for `tenant` (None: every tenant) that `action`
    can touch, at most model.BULK_MAX_JOBS + 1 of them (one more tells there are too many)."""
    fits = model.BULK_STATES[action]
    states = [s for s in given.states if s in fits] if given.states else sorted(fits)
    where = job_lists.job_where(conn, dataclasses.replace(given, states=states, tenant=tenant))
    if not states:  # states were given, and the action touches none of them
        where.append(literal(False))
    return select(jobs_table.c.id).where(*where).limit(model.BULK_MAX_JOBS + 1)


def _too_many() -> errors.InvalidInput:
    return errors.InvalidInput(
        f"filter: matches more than {model.BULK_MAX_JOBS:,} jobs, the most one operation takes;"
        " narrow it (state, queue, since, until)"
    )


def operation_preview(
    conn: Connection,
    *,
    tenant: str | None,
    action: model.BulkAction,
    given: model.JobFilter,
    sample: int = SAMPLE,
) -> model.Preview:
    """How many jobs the action would touch now (exact, up to model.BULK_MAX_JOBS;
    InvalidInput past it), and the ids of the newest `sample` of them."""
    ids = _matching(conn, tenant, action, given).subquery()
    count = conn.execute(select(func.count()).select_from(ids)).scalar_one()
    if count > model.BULK_MAX_JOBS:
        raise _too_many()
    newest = select(ids.c.id).order_by(ids.c.id.desc()).limit(sample)
    return model.Preview(count=count, sample=tuple(conn.execute(newest).scalars()))


def operation_create(
    conn: Connection,
    *,
    tenant: str | None,
    action: model.BulkAction,
    given: model.JobFilter,
    expect: int | None,
    token_id: int | None,
    made_by: str,
    now: datetime,
) -> model.Operation:
    """Make an operation on the snapshot of the jobs the action would touch now: one item
    a job, taken by the preview's query in this transaction. Raises errors.CountChanged
    (nothing made) when their number is not `expect`, InvalidInput when it is past
    model.BULK_MAX_JOBS."""
    operation_id = _operation_insert(
        conn, tenant=tenant, action=action, given=given, token_id=token_id, made_by=made_by, now=now
    )
    taken = _items_take(conn, operation_id, _matching(conn, tenant, action, given))
    if taken > model.BULK_MAX_JOBS:
        raise _too_many()
    if expect is not None and taken != expect:
        raise errors.CountChanged(taken, expect)
    ended = {"state": S.SUCCEEDED, "finished_at": now} if taken == 0 else {}
    mine = operations.c.id == operation_id
    conn.execute(update(operations).where(mine).values(total=taken, **ended))
    return operation_get(conn, operation_id=operation_id)


def _operation_insert(
    conn: Connection,
    *,
    tenant: str | None,
    action: model.BulkAction,
    given: model.JobFilter,
    token_id: int | None,
    made_by: str,
    now: datetime,
) -> int:
    """Insert a running operation with no items yet; its id."""
    made = conn.execute(
        insert(operations).values(
            tenant=tenant,
            action=action,
            filter=given.as_json(),
            state=S.RUNNING,
            total=0,
            applied=0,
            skipped=0,
            token_id=token_id,
            made_by=made_by,
            created_at=now,
            updated_at=now,
        )
    ).inserted_primary_key
    assert made is not None
    return int(made[0])


def _items_take(conn: Connection, operation_id: int, matching: Any) -> int:
    """One item of operation `operation_id` for each job `matching` selects; how many."""
    ids = matching.subquery()
    conn.execute(
        insert(operation_items).from_select(
            ["operation_id", "job_id"], select(literal(operation_id), ids.c.id)
        )
    )
    # Counted, not the insert's rowcount: a driver may not say how many an INSERT ... SELECT
    # wrote (-1).
    mine = operation_items.c.operation_id == operation_id
    return int(conn.execute(select(func.count()).where(mine)).scalar_one())


# --- steps -------------------------------------------------------------------------------------


def operation_running(conn: Connection, *, limit: int) -> list[int]:
    """The ids of running operations, the oldest first."""
    pick = (
        select(operations.c.id)
        .where(operations.c.state == S.RUNNING)
        .order_by(operations.c.id)
        .limit(limit)
    )
    return list(conn.execute(pick).scalars())


def operation_step(conn: Connection, *, operation_id: int, now: datetime, limit: int) -> Step:
    """Apply the operation to its next `limit` items not done, mark them, count them; the
    operation ends (succeeded) when none is left. An operation not running, or one another
    runner is stepping (PostgreSQL), is a step that does nothing."""
    pick = select(operations).where(
        operations.c.id == operation_id, operations.c.state == S.RUNNING
    )
    row = conn.execute(dialects.skip_locked(conn, pick)).first()
    if row is None:
        return Step()
    op = _operation(row._mapping)
    todo = (
        select(operation_items.c.job_id)
        .where(operation_items.c.operation_id == op.id, operation_items.c.done_at.is_(None))
        .order_by(operation_items.c.job_id)
        .limit(limit)
    )
    ids = list(conn.execute(todo).scalars())
    found = {j.id: j for j in jobs.job_get_many(conn, job_ids=ids)}
    step, marks = Step(), []
    for job_id in ids:
        outcome, note = _apply(conn, op, found.get(job_id), job_id, now, step)
        marks.append({"job": job_id, "outcome": outcome, "note": note})
        if outcome == model.ItemOutcome.APPLIED:
            step.applied += 1
        else:
            step.skipped += 1
    _mark(conn, op.id, marks, now)
    step.ended = len(ids) < limit or not _left(conn, op.id)
    conn.execute(
        update(operations)
        .where(operations.c.id == op.id)
        .values(
            applied=operations.c.applied + step.applied,
            skipped=operations.c.skipped + step.skipped,
            updated_at=now,
            **({"state": S.SUCCEEDED, "finished_at": now} if step.ended else {}),
        )
    )
    return step


def _left(conn: Connection, operation_id: int) -> bool:
    left = select(operation_items.c.job_id).where(
        operation_items.c.operation_id == operation_id, operation_items.c.done_at.is_(None)
    )
    return conn.execute(left.limit(1)).first() is not None


def _mark(conn: Connection, operation_id: int, marks: list[dict[str, Any]], now: datetime) -> None:
    if not marks:
        return
    conn.execute(
        update(operation_items)
        .where(
            operation_items.c.operation_id == operation_id,
            operation_items.c.job_id == bindparam("job"),
        )
        .values(outcome=bindparam("outcome"), note=bindparam("note"), done_at=now),
        marks,
    )


def misfit(action: model.BulkAction, job: model.Job | None) -> str | None:
    """Why `action` no longer fits the job, or None when it does."""
    if job is None:
        return "the job no longer exists"
    if job.state in model.BULK_STATES[action]:
        return None
    if action == model.BulkAction.CANCEL:
        return f"already {job.state}"
    return f"{job.state}, not quarantined any more"


def _apply(
    conn: Connection,
    op: model.Operation,
    job: model.Job | None,
    job_id: int,
    now: datetime,
    step: Step,
) -> tuple[model.ItemOutcome, str | None]:
    """Apply `op` to one job in a savepoint (a transition refused leaves nothing behind)."""
    if job is not None and op.tenant is not None and job.tenant != op.tenant:
        # Never met (the snapshot holds the tenant's jobs only), and never to be.
        return model.ItemOutcome.SKIPPED, "another tenant's job"
    why = misfit(op.action, job)
    if why is not None:
        return model.ItemOutcome.SKIPPED, why
    reason = f"{op.action} by bulk operation {op.id}"
    try:
        with conn.begin_nested():
            if op.action == model.BulkAction.CANCEL:
                stopped = job_decisions.job_cancel(conn, job_id=job_id, now=now, reason=reason)
                if stopped is not None:
                    step.stopped.append(stopped)
            else:
                to = J.QUEUED if op.action == model.BulkAction.RETRY else J.CANCELLED
                job_decisions.job_unquarantine(conn, job_id=job_id, to=to, now=now, reason=reason)
    except (errors.Conflict, errors.InvalidInput) as exc:
        return model.ItemOutcome.SKIPPED, str(exc)[:300]
    return model.ItemOutcome.APPLIED, None


def operation_cancel(conn: Connection, *, operation_id: int, now: datetime) -> model.Operation:
    """Stop a running operation: its items not done stay undone. Cancelling a cancelled
    one is a no-op; one that has ended otherwise is Conflict."""
    op = operation_get(conn, operation_id=operation_id)
    if op.state == S.CANCELLED:
        return op
    stop = (
        update(operations)
        .where(operations.c.id == operation_id, operations.c.state == S.RUNNING)
        .values(state=S.CANCELLED, finished_at=now, updated_at=now)
    )
    if conn.execute(stop).rowcount == 0:
        ended = operation_get(conn, operation_id=operation_id)
        raise errors.Conflict(f"operation {operation_id} has already ended ({ended.state})")
    return operation_get(conn, operation_id=operation_id)


# --- reads -------------------------------------------------------------------------------------


def _operation(m: Any) -> model.Operation:
    return model.Operation(
        **{
            **m,
            "action": model.BulkAction(m["action"]),
            "state": S(m["state"]),
            "filter": dict(m["filter"]),
        }
    )


def operation_get(conn: Connection, *, operation_id: int) -> model.Operation:
    row = conn.execute(select(operations).where(operations.c.id == operation_id)).first()
    if row is None:
        raise errors.NotFound(f"no operation {operation_id}")
    return _operation(row._mapping)


def operation_list(
    conn: Connection, *, tenant: str | None, limit: int, before: int | None = None
) -> list[model.Operation]:
    """Operations the newest first: of `tenant` only, or of every tenant (None)."""
    stmt = select(operations).order_by(operations.c.id.desc()).limit(limit)
    if tenant is not None:
        stmt = stmt.where(operations.c.tenant == tenant)
    if before is not None:
        stmt = stmt.where(operations.c.id < before)
    return [_operation(m) for m in conn.execute(stmt).mappings()]


def operation_items_list(
    conn: Connection,
    *,
    operation_id: int,
    outcome: model.ItemOutcome | None = None,
    limit: int = 100,
) -> list[model.OperationItem]:
    """An operation's items in job id order; only those with `outcome` when given."""
    stmt = (
        select(operation_items)
        .where(operation_items.c.operation_id == operation_id)
        .order_by(operation_items.c.job_id)
        .limit(limit)
    )
    if outcome is not None:
        stmt = stmt.where(operation_items.c.outcome == outcome)
    return [
        model.OperationItem(
            job_id=m["job_id"],
            outcome=None if m["outcome"] is None else model.ItemOutcome(m["outcome"]),
            note=m["note"],
            done_at=m["done_at"],
        )
        for m in conn.execute(stmt).mappings()
    ]


# --- the handle ----------------------------------------------------------------------------


class Operations:
    """The store's handle on bulk operations (`store.operations`): each call one
    transaction.

    Each method runs the store function its name shortens (`step`: operation_step),
    named in its body; that function's docstring says what the call does.
    """

    def __init__(self, db: Database) -> None:
        self._db = db

    async def preview(
        self, *, tenant: str | None, action: model.BulkAction, given: model.JobFilter
    ) -> model.Preview:
        return await self._db.read(
            functools.partial(operation_preview, tenant=tenant, action=action, given=given)
        )

    async def create(
        self,
        *,
        tenant: str | None,
        action: model.BulkAction,
        given: model.JobFilter,
        expect: int | None,
        token_id: int | None,
        made_by: str,
        now: datetime,
    ) -> model.Operation:
        return await self._db.tx(
            functools.partial(
                operation_create,
                tenant=tenant,
                action=action,
                given=given,
                expect=expect,
                token_id=token_id,
                made_by=made_by,
                now=now,
            )
        )

    async def running(self, *, limit: int = 10) -> list[int]:
        return await self._db.read(functools.partial(operation_running, limit=limit))

    async def step(self, *, operation_id: int, now: datetime, limit: int) -> Step:
        return await self._db.tx(
            functools.partial(operation_step, operation_id=operation_id, now=now, limit=limit)
        )

    async def cancel(self, *, operation_id: int, now: datetime) -> model.Operation:
        return await self._db.tx(
            functools.partial(operation_cancel, operation_id=operation_id, now=now)
        )

    async def get(self, *, operation_id: int) -> model.Operation:
        return await self._db.read(functools.partial(operation_get, operation_id=operation_id))

    async def items(
        self, *, operation_id: int, outcome: model.ItemOutcome | None = None, limit: int = 100
    ) -> list[model.OperationItem]:
        return await self._db.read(
            functools.partial(
                operation_items_list, operation_id=operation_id, outcome=outcome, limit=limit
            )
        )

    async def list(
        self, *, tenant: str | None, limit: int = 100, before: int | None = None
    ) -> list[model.Operation]:
        return await self._db.read(
            functools.partial(operation_list, tenant=tenant, limit=limit, before=before)
        )
