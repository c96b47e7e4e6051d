"""The dispatcher's completions: what its executors show of finished attempts, pushed
(an executor's `events()`) or polled (`observe()` of the store's active attempts), queued
and written in batches through the store's compare-and-set transitions, so the same
completion arriving twice applies once.

The writer waits while a tick is in flight, so that what arrives during a tick is written
in that tick's last transaction (fewer, bigger writes); a tick never waits for the writer,
so a stuck write holds up no claim. A poll also notes in the run log why a live attempt
waits on its platform (a pod that has not started), once per reason, and that it started.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from corral import core, errors, launching, metrics, model, store
from corral.executors.base import Executor

NOTED = 10_000
"""How many waiting attempts a dispatcher remembers it noted the reason of (one it forgot
is noted again)."""

log = logging.getLogger("corral.dispatcher")
J = model.JobState
_JOB_NEXT = {J.QUEUED: "queued for retry"}


class Completions:
    """One dispatcher's queue of finished observations, and the loops that fill and write it."""

    def __init__(self, loop: core.Core) -> None:
        self.core = loop
        self._queue = asyncio.Queue[store.Finish]()
        self._pending: set[int] = set()  # fences queued or being written: polls repeat them
        self._arrived = asyncio.Event()
        # Set while no tick is in flight: the writer waits for it.
        self._between_ticks = asyncio.Event()
        self._between_ticks.set()
        self._noted: dict[int, set[str]] = {}  # why each attempt waited on its platform, noted

    def tick_begins(self) -> None:
        """A tick is in flight: what arrives now waits for its last transaction."""
        self._between_ticks.clear()

    def tick_ends(self) -> None:
        """No tick is in flight: the writer may write what arrived."""
        self._between_ticks.set()

    def queued(self) -> int:
        """How many completions wait to be written."""
        return self._queue.qsize()

    def offer(self, observation: launching.Observation, *, fence: int | None = None) -> bool:
        """Queue a finished observation for the completion writer; False if it is not one.

        `fence` is the attempt the caller observed; an observation whose labels carry another
        identity (a stale object under the same name) is ignored.
        """
        identity = observation.identity
        if not observation.phase.finished or identity is None:
            return False
        if identity.fence in self._pending:
            return True
        if fence is not None and identity.fence != fence:
            log.warning(
                "%s: carries fence %d, expected %d; ignored",
                observation.name,
                identity.fence,
                fence,
            )
            return False
        self._arrived.set()
        self._pending.add(identity.fence)
        self._queue.put_nowait(store.Finish.seen(identity.fence, observation))
        return True

    async def flush(self) -> list[store.Outcome]:
        """Apply every queued completion now, in batches of `claim_batch_limit`."""
        outcomes: list[store.Outcome] = []
        while not self._queue.empty():
            outcomes += await self._apply(self.take(self.core.settings.claim_batch_limit))
        return outcomes

    def take(self, room: int) -> list[store.Finish]:
        batch: list[store.Finish] = []
        while not self._queue.empty() and len(batch) < room:
            batch.append(self._queue.get_nowait())
        return batch

    async def _apply(self, batch: Sequence[store.Finish]) -> list[store.Outcome]:
        if not batch:
            return []
        try:
            with metrics.timed(metrics.SETTLE.labels(write="finish"), self.core.clock):
                outcomes = await self.core.store.attempts.finish(
                    finishes=batch, now=self.core.clock.now(), retry=self.core.retry
                )
        except (errors.CorralError, asyncio.CancelledError):
            # Cancelled: the loop is stopping, and its last flush writes them again (the
            # write in flight may commit too: a completion applies once however often).
            self.requeue(batch)
            raise
        self.done(batch)
        self.log_outcomes(outcomes)
        return outcomes

    def requeue(self, batch: Sequence[store.Finish]) -> None:
        """Put back completions a failed write took out: they are written next time."""
        for finish in batch:
            self._queue.put_nowait(finish)
        if batch:
            self._arrived.set()

    def done(self, batch: Sequence[store.Finish]) -> None:
        self._pending.difference_update(f.fence for f in batch)

    def log_outcomes(self, outcomes: Sequence[store.Outcome]) -> None:
        for o in outcomes:
            metrics.COMPLETIONS.labels(attempt_state=o.attempt_state, job_state=o.job_state).inc()
            log.info(
                "job %d attempt %d (fence %d) %s; job %s",
                o.job_id,
                o.attempt_no,
                o.fence,
                o.attempt_state,
                _JOB_NEXT.get(o.job_state, o.job_state),
            )

    async def write_forever(self) -> None:
        """Forever: when completions have arrived, write all that queued up, in batches.
        A failed write keeps them queued and is tried again after `dispatch_interval`."""
        retry = self.core.settings.timeouts.dispatch_interval.total_seconds()
        while True:
            await self._arrived.wait()
            await self._between_ticks.wait()
            try:
                self._arrived.clear()
                await self.flush()
            except errors.CorralError as exc:
                log.error("writing completions failed, trying again in %.1fs: %s", retry, exc)
                await self.core.clock.sleep(retry)

    async def watch(self, executor: Executor) -> None:
        """Forever: take the executor's pushed observations; polling covers any gap."""
        retry = self.core.settings.timeouts.observe_interval.total_seconds()
        while True:
            try:
                async for observation in executor.events():
                    self.offer(observation)
                return  # the executor closed its stream
            except Exception as exc:  # polling covers the gap; the stream must come back
                log.warning(
                    "%s: event stream failed, restarting in %.1fs: %s",
                    executor.kind,
                    retry,
                    exc,
                    exc_info=not isinstance(exc, errors.CorralError),
                )
                await self.core.clock.sleep(retry)

    async def poll_once(self) -> int:
        """Observe every active attempt in the store; queue the finished ones. Returns how many."""
        found = 0
        for kind, executor in self.core.executors.items():
            after = 0
            while page := await self.core.store.attempts.list_active(
                executor=kind, limit=self.core.settings.claim_batch_limit, after=after
            ):
                after = page[-1].id
                found += await self._observe_page(executor, page)
        return found

    async def _observe_page(self, executor: Executor, page: Sequence[model.Attempt]) -> int:
        try:
            seen = await executor.observe([a.launch_name for a in page])
        except errors.ExecutorError as exc:
            log.warning("%s: cannot observe %d attempts: %s", executor.kind, len(page), exc)
            return 0
        found, alive, notes = 0, [], {}
        for attempt in page:
            obs = seen.get(attempt.launch_name)
            if obs is None:
                continue
            if self.offer(obs, fence=attempt.id):
                found += 1
                self._noted.pop(attempt.id, None)
            elif obs.phase in (launching.Phase.RUNNING, launching.Phase.PENDING):
                alive.append(attempt.id)
                notes.update(self._news(attempt.id, obs))
        await self.core.store.attempts.seen(fences=alive, now=self.core.clock.now())
        if notes:
            await self.core.store.attempts.note(notes=notes, now=self.core.clock.now())
        return found

    def _news(self, fence: int, obs: launching.Observation) -> dict[int, str | None]:
        """What the run log should say of a live attempt: why it waits on its platform (a
        pod that has not started), the first time it waits for that reason (a kubelet
        goes back and forth between ErrImagePull and ImagePullBackOff), and that it
        started, once it has."""
        if obs.phase is launching.Phase.PENDING and obs.reason:
            noted = self._noted.setdefault(fence, set())
            if obs.reason in noted:
                return {}
            noted.add(obs.reason)
            while len(self._noted) > NOTED:
                self._noted.pop(next(iter(self._noted)))
            return {fence: f"{obs.reason}: {obs.message}" if obs.message else obs.reason}
        if obs.phase is launching.Phase.RUNNING and self._noted.pop(fence, None) is not None:
            return {fence: None}
        return {}

    async def poll_forever(self) -> None:
        interval = self.core.settings.timeouts.observe_interval.total_seconds()
        while True:
            try:
                await self.poll_once()
            except errors.CorralError as exc:
                log.warning("poll failed, trying again in %.1fs: %s", interval, exc)
            await self.core.clock.sleep(interval)
