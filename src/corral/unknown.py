"""The unknown state: attempts recovery cannot see (their platform cannot be asked, or a
running one went silent past its lease), and each job's policy for them.

`wait` leaves the attempt running until its deadline (the store stretches its lease to
it, and the run log says why, once per silence); `fence_and_relaunch` supersedes it and
queues its job for a new attempt with a higher fence (fenced sinks then refuse the old
one's writes), and stops the old one where the platform lets it. An attempt that cannot
be looked at yet (a launching one on a platform that cannot be asked) is noted once in
its run log, and looked at again next pass.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence

from corral import core, model, policy, recovery
from corral.executors.base import Executor
from corral.recovery import Pass

log = logging.getLogger("corral.reconciler")


class Unknowns:
    """The unknown-state policy of one reconciler, with the attempts it noted already (by
    fence), to keep their run logs short."""

    def __init__(self, loop: core.Core) -> None:
        self.core = loop
        self._noted: set[int] = set()

    def forget(self, fences: Iterable[int]) -> None:
        """These attempts are known again (adopted, relaunched, alive or ended)."""
        self._noted.difference_update(fences)

    async def note(self, items: Sequence[model.Claimed], why: str, summary: Pass) -> None:
        """Count the attempts as unknown, and say `why` in each one's run log, once."""
        summary.unknown += len(items)
        log.warning("%d attempts: %s", len(items), why)
        for item in items:
            if item.attempt.id in self._noted:
                continue
            self._noted.add(item.attempt.id)
            await self.core.store.events.note(
                job_id=item.job.id,
                attempt_id=item.attempt.id,
                state=item.attempt.state,
                reason=why,
                now=self.core.clock.now(),
                details={"launch_name": item.attempt.launch_name},
            )

    async def apply(
        self, executor: Executor, items: Sequence[tuple[model.Claimed, str]], summary: Pass
    ) -> None:
        """Apply each job's unknown-state policy: relaunch with a higher fence, or wait."""
        relaunch = [
            (item, why)
            for item, why in items
            if policy.JobPolicy.read(item.job.policy).on_unknown == "fence_and_relaunch"
        ]
        superseded = await self._supersede(executor, relaunch, summary)
        relaunch_items = [item for item, _ in relaunch]
        # Once per silence: the store writes (and says it wrote) only an attempt whose lease
        # it has not stretched to the deadline yet. An attempt without a stored deadline
        # cannot be told apart that way, so this process remembers it instead.
        waiting = [
            (item, why if item not in relaunch_items else f"{why}; no attempts left to relaunch")
            for item, why in items
            if item.attempt.id not in superseded
            and (item.attempt.deadline_at is not None or item.attempt.id not in self._noted)
        ]
        await self._wait(waiting)

    async def _supersede(
        self, executor: Executor, relaunch: Sequence[tuple[model.Claimed, str]], summary: Pass
    ) -> set[int]:
        """Supersede the attempts whose policy is fence_and_relaunch, and stop them; the
        fences superseded (one whose job has no attempts left is not)."""
        superseded: set[int] = set()
        for why in sorted({why for _, why in relaunch}):
            superseded.update(
                await self.core.store.attempts.supersede(
                    fences=[item.attempt.id for item, w in relaunch if w == why],
                    now=self.core.clock.now(),
                    reason=f"superseded: unknown state ({why}); policy fence_and_relaunch",
                )
            )
        if superseded:
            old = [item.attempt for item, _ in relaunch if item.attempt.id in superseded]
            summary.superseded += len(old)
            for attempt in old:
                recovery.repaired(attempt, "superseded; its job gets a new attempt, a higher fence")
            # Best effort: fenced sinks refuse its writes whether or not this gets through.
            grace = self.core.t.cancel_grace
            await asyncio.gather(*(recovery.stop(executor, a.launch_name, grace) for a in old))
        return superseded

    async def _wait(self, waiting: Sequence[tuple[model.Claimed, str]]) -> None:
        """Leave the attempts running until their deadlines, and say why in the log."""
        for why in sorted({why for _, why in waiting}):
            same = {item.attempt.id: item for item, w in waiting if w == why}
            self._noted.update(same)
            written = await self.core.store.attempts.wait(
                fences=list(same),
                now=self.core.clock.now(),
                reason=f"unknown state ({why}); left to run until its deadline",
            )
            for fence in written:
                item = same[fence]
                log.warning(
                    "%s (job %d, fence %d) is in the unknown state: %s; waiting until its deadline",
                    item.attempt.launch_name,
                    item.job.id,
                    fence,
                    why,
                )
