"""The runner of bulk operations: each `corral serve` and `corral api` process runs one.

An operation (store/operations.py) is a snapshot of job ids and a mark on each when done,
so the runner keeps no state of its own: every pass it asks the store for the running
operations and takes one step (at most `operation_batch_limit` items, one transaction)
of each. A process killed mid-step loses only that step's uncommitted transaction, which
the next pass, here or in any other process, takes again; on PostgreSQL a step locks its
operation, so runners in many processes never apply an item twice. While a pass did
something the next starts at once; otherwise after `timeouts.operation_interval`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence

from corral import clock, config, errors, model, store
from corral.executors.base import Executor

log = logging.getLogger("corral.operations")

OPERATIONS_A_PASS = 10
"""The most running operations one pass takes a step of (the oldest first)."""


class Runner:
    """Takes steps of running bulk operations until stopped."""

    def __init__(
        self,
        *,
        store: store.Store,
        clock: clock.Clock,
        settings: config.Settings,
        executors: Mapping[str, Executor] | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.settings = settings
        self.executors = executors or {}

    async def run(self, stop: asyncio.Event) -> None:
        """Make passes until `stop` is set: at once after one that did something."""
        interval = self.settings.timeouts.operation_interval.total_seconds()
        while not stop.is_set():
            try:
                done = await self.run_once()
            except errors.CorralError as exc:
                log.error("bulk operations: pass failed, trying again in %.1fs: %s", interval, exc)
                done = 0
            if done == 0:
                await clock.sleep_or_stop(self.clock, stop, interval)
            else:
                await asyncio.sleep(0)  # let `stop` and the API's requests in

    async def run_once(self) -> int:
        """One step of each running operation; returns how many items were done."""
        done = 0
        for operation_id in await self.store.operations.running(limit=OPERATIONS_A_PASS):
            step = await self.store.operations.step(
                operation_id=operation_id,
                now=self.clock.now(),
                limit=self.settings.operation_batch_limit,
            )
            await self._stop_on_platforms(step.stopped)
            if step.ended:
                log.info("bulk operation %d has ended", operation_id)
            done += step.done
        return done

    async def _stop_on_platforms(self, attempts: Sequence[model.Attempt]) -> None:
        """Stop the runs of the attempts a cancel ended, where this process runs their
        executor; elsewhere their dispatcher stops them (they are cancelled in the store)."""
        grace = self.settings.timeouts.cancel_grace
        for attempt in attempts:
            executor = self.executors.get(attempt.executor)
            if executor is None:
                continue
            try:
                await executor.cancel(attempt.launch_name, grace)
            except errors.ExecutorError as exc:
                log.warning(
                    "job %d: %s could not be stopped now (%s); it is cancelled in the store",
                    attempt.job_id,
                    attempt.launch_name,
                    exc,
                )
