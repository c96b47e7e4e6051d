"""The dispatcher's launches: each claimed attempt created on its platform under its
launch name, at most `launch_concurrency` at once, none after the tick's deadline.

An attempt whose executor leaves nothing on a platform to observe (an HTTP request) is
recorded running before it is sent, so that a crash after the send leaves an attempt
recovery calls lost, never one it would send again. An attempt claimed longer ago than
launch_grace is left to recovery (or, recorded running and never sent, given up at once);
one whose deadline passed before its launch is never launched, and not charged. What
became of each launch (`Result`) the tick then records (corral.dispatcher).
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Iterable, Sequence

from corral import core, errors, failpoints, metrics, model
from corral.executors import base

log = logging.getLogger("corral.dispatcher")
A = model.AttemptState


class Result(enum.Enum):
    """What became of one launch in a tick."""

    LAUNCHED = "launched"
    FAILED = "failed"  # left `launching` for recovery
    LATER = "later"  # the tick's deadline came first: first in the next tick
    TOO_LATE = "too late"  # its deadline passed before launch: never launched, not charged
    UNSENT = "unsent"  # recorded running before its send, then past launch_grace: the same


class Launches:
    """One dispatcher's launches, and the attempts it recorded running before sending."""

    def __init__(self, loop: core.Core) -> None:
        self.core = loop
        self.reaches = base.Reaches(loop.settings)
        self.recorded_first: set[int] = set()  # recorded running before sending, not yet sent

    def sent_blind(self, fences: Iterable[int]) -> set[int]:
        """Of `fences`, whose launches are done with, those recorded running before they
        were sent (nothing to settle for them); forgotten here."""
        blind = self.recorded_first.intersection(fences)
        self.recorded_first -= blind
        return blind

    async def record_before_sending(self, fresh: list[model.Claimed]) -> list[model.Claimed]:
        """Record as running, before they are launched, the attempts of executors that leave
        nothing on a platform to observe (an HTTP request): a crash after the send then
        leaves a running attempt that recovery calls lost (the job retries, a new fence),
        never a launching one that it would send again. What cannot be recorded now stays
        launching, unsent, for recovery (or was cancelled meanwhile): not launched."""
        blind = [
            c.attempt.id
            for c in fresh
            if not base.observable(self.core.executors[c.attempt.executor]) and self.in_time(c)
        ]
        if not blind:
            return fresh
        try:
            recorded = set(
                await self.core.store.attempts.record_running(
                    fences=blind,
                    now=self.core.clock.now(),
                    reason="recorded running before it is sent",
                    sent_by=self.core.sender,
                )
            )
        except errors.StoreError as exc:
            log.error(
                "%d attempts not recorded before sending (%s); left for recovery", len(blind), exc
            )
            recorded = set()
        self.recorded_first.update(recorded)
        return [c for c in fresh if c.attempt.id in recorded or c.attempt.id not in blind]

    def in_time(self, claimed: model.Claimed) -> bool:
        """Whether the attempt can still be launched (its deadline has not passed): one that
        cannot is left launching, to end as never launched (not charged)."""
        try:
            base.launch_for(
                claimed, self.core.settings, self.core.clock.now(), reaches=self.reaches
            )
        except errors.LaunchTooLate:
            return False
        return True

    async def launch_all(self, todo: Sequence[model.Claimed], until: float) -> list[Result]:
        """Launch `todo` in order, `launch_concurrency` at a time; an attempt whose turn
        comes after the tick's deadline is not launched (LATER). A few workers take the
        attempts one after another: no task per launch."""
        results = [Result.LATER] * len(todo)
        turns = iter(enumerate(todo))

        async def worker() -> None:
            for i, claimed in turns:
                if self.core.clock.monotonic() > until:
                    return  # the rest stay LATER
                results[i] = await self._launch_now(claimed)

        workers = min(self.core.settings.launch_concurrency, len(todo))
        await asyncio.gather(*(worker() for _ in range(workers)))
        return results

    async def _launch_now(self, claimed: model.Claimed) -> Result:
        now = self.core.clock.now()
        age = now - claimed.attempt.created_at
        if age > self.core.settings.timeouts.launch_grace:
            if claimed.attempt.id in self.recorded_first:
                # Recorded running before its send, and never sent: recovery would wait
                # recovery_grace to call it lost; this process knows, so says so now.
                return Result.UNSENT
            # Recovery may already have launched, finished and (on some platforms) deleted it:
            # a launch this late could run it a second time. Leave it to recovery.
            await self._note_launch_error(
                claimed,
                errors.ExecutorError(f"claimed {age.total_seconds():.0f}s ago, past launch_grace"),
            )
            return Result.FAILED
        try:
            launch = base.launch_for(claimed, self.core.settings, now, reaches=self.reaches)
        except errors.LaunchTooLate:
            return Result.TOO_LATE  # nothing was asked of the platform: a new attempt, free
        try:
            await self.core.executors[launch.executor].launch(launch)
        except Exception as exc:  # any failure: the attempt stays `launching` for recovery
            await self._note_launch_error(claimed, exc)
            return Result.FAILED
        failpoints.hit("after_launch")
        return Result.LAUNCHED

    async def _note_launch_error(self, claimed: model.Claimed, exc: Exception) -> None:
        metrics.LAUNCH_ERRORS.labels(executor=claimed.attempt.executor).inc()
        why = (
            f"launch failed: {exc}"
            if isinstance(exc, errors.CorralError)
            else f"launch failed: {exc!r}"
        )
        left = (
            "recorded running before it was sent: recovery calls it lost"
            if claimed.attempt.id in self.recorded_first
            else "left launching for recovery"
        )
        log.warning(
            "job %d attempt %s: %s (%s)",
            claimed.job.id,
            claimed.attempt.launch_name,
            why,
            left,
            exc_info=not isinstance(exc, errors.CorralError),
        )
        await self.core.store.events.note(
            job_id=claimed.job.id,
            attempt_id=claimed.attempt.id,
            state=A.RUNNING if claimed.attempt.id in self.recorded_first else A.LAUNCHING,
            reason=f"{why}; {left}",
            now=self.core.clock.now(),
            details={"launch_name": claimed.attempt.launch_name, "error": type(exc).__name__},
        )
