"""Recovery's stops: attempts past their deadline, and absent ones whose parts still run.

An attempt past its deadline (and its platform's own stop and grace) is stopped, and its
end recorded from what the platform then shows: a stop that did not get through records
nothing (the next pass tries again), so a retry never runs beside a copy still going. On
a platform whose launches stop slowly (pods in their termination grace), the attempt
stays running, with a `stopping` event, until nothing of it runs; what it wrote is read
before the first stop, since it is gone once its pods have ended. An attempt absent past
recovery_grace is lost, unless parts of it still run: those are stopped first.

What this process is stopping it remembers by fence (`Stops`), for as long as recovery
finds the attempt due.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from corral import core, errors, launching, model, recovery, store
from corral.executors import base
from corral.executors.base import Executor
from corral.recovery import Pass

log = logging.getLogger("corral.reconciler")
A, P = model.AttemptState, launching.Phase


@dataclass(frozen=True, slots=True)
class _Stopping:
    """An attempt recovery is stopping, waiting for its pods to end."""

    since: datetime
    lost: bool = False  # absent past recovery_grace, its pods running on: it ends lost
    noted: bool = False  # its `stopping` event is written
    read: bool = False  # what it wrote was read, before the stop: `output`
    output: launching.RunLog | None = None


class Stops:
    """The attempts this process is stopping, by fence: since when (their pods' grace
    counts from it), whether they were lost (else timed out), what they wrote before."""

    def __init__(self, loop: core.Core) -> None:
        self.core = loop
        self._stopping: dict[int, _Stopping] = {}

    def __contains__(self, fence: int) -> bool:
        return fence in self._stopping

    def forget(self, due: set[int]) -> None:
        """Forget what this process kept of attempts it was stopping that are no longer due
        for recovery (ended by a dispatcher, a cancel, or another reconciler)."""
        for fence in [f for f in self._stopping if f not in due]:
            del self._stopping[fence]

    async def lose(
        self,
        executor: Executor,
        lost: Sequence[model.Attempt],
        overdue: list[model.Attempt],
        summary: Pass,
    ) -> list[store.Finish]:
        """Attempts absent past recovery_grace are lost, unless parts of them still run (a
        Job deleted without its pods, or while recovery did not know it was stopping them:
        a restart): those join `overdue`, to be stopped, and end lost once nothing of them
        runs."""
        if lost and isinstance(executor, base.StopsSlowly):
            try:
                running = await executor.still_running([a.launch_name for a in lost])
            except errors.ExecutorError as exc:
                log.warning("%d absent attempts: cannot look for their pods: %s", len(lost), exc)
                return []
            now = self.core.clock.now()
            for a in lost:
                if a.launch_name in running:
                    self._stopping[a.id] = _Stopping(since=now, lost=True)
                    overdue.append(a)
            lost = [a for a in lost if a.launch_name not in running]
        summary.lost += len(lost)
        for a in lost:
            recovery.repaired(a, "lost")
        why = "lost: not on the platform past recovery_grace"
        return [store.Finish(a.id, A.LOST, None, why) for a in lost]

    async def stop_overdue(
        self,
        executor: Executor,
        overdue: Sequence[model.Attempt],
        alive: list[int],
        summary: Pass,
    ) -> list[store.Finish]:
        """Stop attempts past their deadline, then the ends to record from what the
        platform shows (one that finished in time succeeded). Those still stopping on a
        platform whose launches stop slowly join `alive`."""
        if not overdue:
            return []
        if isinstance(executor, base.StopsSlowly):
            await self._read_last_output(executor, overdue)
        grace = self.core.t.cancel_grace
        stopped = await asyncio.gather(
            *(recovery.stop(executor, a.launch_name, grace) for a in overdue)
        )
        done = [a for a, ok in zip(overdue, stopped, strict=True) if ok]
        try:
            seen = await executor.observe([a.launch_name for a in done])
            if isinstance(executor, base.StopsSlowly):
                done = await self._still_stopping(executor, done, alive, summary)
        except errors.ExecutorError as exc:
            log.warning("%d stopped attempts: cannot look again: %s", len(done), exc)
            return []
        return [self._end(a, seen.get(a.launch_name)) for a in done]

    def _end(self, attempt: model.Attempt, obs: launching.Observation | None) -> store.Finish:
        """The end of an attempt recovery stopped, now that nothing of it runs: succeeded
        if the platform shows it finished so in time; else timed out, or lost (absent
        past recovery_grace, its pods running on until they were stopped)."""
        was = self._stopping.pop(attempt.id, None)
        if obs is not None and obs.phase is P.SUCCEEDED and obs.exit_code in (0, None):
            return store.Finish.seen(attempt.id, obs)
        output = was.output if was is not None else None
        if was is not None and was.lost:
            why = "lost: not on the platform past recovery_grace; its pods were stopped"
            return store.Finish(attempt.id, A.LOST, None, why, output=output)
        why = "timed out: ran past its deadline, stopped by recovery"
        return dataclasses.replace(recovery.failed(attempt, why), output=output)

    async def _read_last_output(
        self, executor: base.StopsSlowly, overdue: Sequence[model.Attempt]
    ) -> None:
        """Before attempts are first stopped, what they wrote so far (a pod's log): kept,
        with the time of the stop, for the run log of their end, which comes once their pods
        have ended and it is gone."""
        now = self.core.clock.now()
        kept = self._stopping
        first = [a for a in overdue if a.id not in kept or not kept[a.id].read]
        read = await asyncio.gather(
            *(executor.last_output(a.launch_name) for a in first), return_exceptions=True
        )
        for a, output in zip(first, read, strict=True):
            if isinstance(output, errors.ExecutorError):
                log.info(
                    "%s: its output could not be read before its stop: %s", a.launch_name, output
                )
            elif isinstance(output, BaseException):
                raise output
            got = output if isinstance(output, launching.RunLog) else None
            known = kept.get(a.id) or _Stopping(since=now)
            kept[a.id] = dataclasses.replace(known, read=True, output=got)

    async def _still_stopping(
        self,
        executor: base.StopsSlowly,
        stopped: Sequence[model.Attempt],
        alive: list[int],
        summary: Pass,
    ) -> list[model.Attempt]:
        """Of attempts just stopped, those that may end now: nothing of them runs, or what
        does has had its whole grace (it is taken for stuck on a node that is gone, and
        said so). The others stay running (`alive`), noted once as stopping."""
        running = await executor.still_running([a.launch_name for a in stopped])
        now, ending = self.core.clock.now(), []
        for a in stopped:
            what = running.get(a.launch_name)
            if what is None:
                ending.append(a)
                continue
            known = self._stopping.get(a.id) or _Stopping(since=now)
            if known.since + executor.stop_grace + self.core.t.margin <= now:
                log.warning(
                    "%s: %s still runs past its termination grace (its node may be lost);"
                    " ending the attempt anyway: stop it by hand",
                    a.launch_name,
                    what,
                )
                ending.append(a)
                continue
            alive.append(a.id)
            summary.stopping += 1
            self._stopping[a.id] = dataclasses.replace(known, noted=True)
            if not known.noted:
                await self._note(a, what, now)
        return ending

    async def _note(self, attempt: model.Attempt, what: str, now: datetime) -> None:
        """Say once in the run log that the attempt is stopping while `what` ends."""
        await self.core.store.events.note(
            job_id=attempt.job_id,
            attempt_id=attempt.id,
            state=attempt.state,
            reason=f"stopping: {what} is ending (SIGTERM, then SIGKILL after its"
            " termination grace); the attempt ends, and its job may retry, once it"
            " is gone",
            now=now,
            details={"launch_name": attempt.launch_name, "running": what},
        )
        log.info("%s: stopping; %s is still ending", attempt.launch_name, what)
