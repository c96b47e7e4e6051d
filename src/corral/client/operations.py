"""Bulk operations (retry, cancel, discard by filter): the filter a person gives, its
preview, and the operation that applies it in the background."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from corral import errors, model
from corral.client import service

if TYPE_CHECKING:
    from corral import operations as background


class Operations(service.Service):
    """Preview, start, follow and stop bulk operations."""

    def runner(self) -> background.Runner:
        """A runner of bulk operations on this client's store: what `serve`, the API and
        `corral jobs bulk` (which waits for its own) run beside their work."""
        from corral import operations as background

        return background.Runner(
            store=self.store, clock=self.clock, settings=self.settings, executors=self.executors
        )

    async def bulk_preview(
        self, action: model.BulkAction, given: model.JobFilter, *, tenant: str | None
    ) -> model.Preview:
        """How many jobs of `tenant` (None: every tenant) `action` would touch now, and the
        newest of their ids; InvalidInput past model.BULK_MAX_JOBS."""
        return await self.store.operations.preview(tenant=tenant, action=action, given=given)

    async def bulk_start(
        self,
        action: model.BulkAction,
        given: model.JobFilter,
        *,
        tenant: str | None,
        expect: int | None,
        made_by: str,
        token_id: int | None = None,
    ) -> model.Operation:
        """Start `action` on the snapshot of the jobs the preview counts now; the runner of
        each serve and api process then applies it. CountChanged (a Conflict, with the new
        count) when that is not `expect` jobs: preview again."""
        return await self.store.operations.create(
            tenant=tenant,
            action=action,
            given=given,
            expect=expect,
            token_id=token_id,
            made_by=made_by,
            now=self.clock.now(),
        )

    async def operation(self, operation_id: int) -> model.Operation:
        """A bulk operation and its progress (NotFound when there is none)."""
        return await self.store.operations.get(operation_id=operation_id)

    async def operations(
        self, *, tenant: str | None, limit: int = 100, before: int | None = None
    ) -> list[model.Operation]:
        """Bulk operations, the newest first: of `tenant`, or of every tenant (None)."""
        return await self.store.operations.list(tenant=tenant, limit=limit, before=before)

    async def operation_skipped(
        self, operation_id: int, *, limit: int = 20
    ) -> list[model.OperationItem]:
        """The first jobs an operation skipped, each with why."""
        return await self.store.operations.items(
            operation_id=operation_id, outcome=model.ItemOutcome.SKIPPED, limit=limit
        )

    async def operation_cancel(self, operation_id: int) -> model.Operation:
        """Stop a bulk operation: the jobs it has not reached yet are left as they are."""
        return await self.store.operations.cancel(operation_id=operation_id, now=self.clock.now())


def job_filter(
    action: model.BulkAction,
    *,
    states: Sequence[str] = (),
    queue: str | None = None,
    executor: str | None = None,
    labels: Sequence[str] = (),
    schedule: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    prefix: str = "filter.",
) -> model.JobFilter:
    """The jobs a bulk `action` is about, as the job list filters them; InvalidInput naming
    the field (after `prefix`): a state not one, or never touched by `action`; a label not
    KEY=VALUE."""
    fits, known = model.BULK_STATES[action], ", ".join(model.JobState)
    for state in states:
        if state not in model.JobState.__members__.values():
            raise errors.InvalidInput(
                f"{prefix}state: {state!r} is not a job state; use one of {known}"
            )
        if state not in fits:
            raise errors.InvalidInput(
                f"{prefix}state: a {action} touches {', '.join(sorted(fits))} jobs, not {state}"
            )
    pairs = {}
    for pair in labels:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise errors.InvalidInput(f"{prefix}label: {pair!r} is not KEY=VALUE")
        pairs[key] = value
    return model.JobFilter(
        states=tuple(dict.fromkeys(states)),
        queue=queue,
        executor=executor,
        labels=pairs,
        schedule=schedule,
        since=since,
        until=until,
    )
