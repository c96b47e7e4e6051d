"""The dispatcher: claim due jobs, launch their attempts, record them, and apply completions.

The cycle follows the outbox rule. (1) Claim: one transaction moves up to
`claim_batch_limit` jobs to running and creates their attempts in `launching`, and
commits. (2) Launch: outside any transaction, each attempt is created on its platform
under its deterministic launch name; "already exists" counts as launched. (3) Record:
the launched attempts move to `running`. A crash between any two steps leaves an attempt
that recovery can finish from the store and the platform alone, never a lost job. The
launches themselves are corral.launches's; this module runs the tick around them.

Completions arrive pushed (an executor's `events()`) or polled (`observe()` of the
store's active attempts) and are written in batches through the store's compare-and-set
transitions, so the same completion arriving twice applies once (corral.completions).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Unpack

from corral import clock, completions, core, errors, failpoints, launches, metrics, model, store
from corral.executors import base
from corral.executors.base import Executor

log = logging.getLogger("corral.dispatcher")
J, A = model.JobState, model.AttemptState
_STOP_IF_LAUNCHED = frozenset({A.CANCELLED, A.SUPERSEDED})
"""Attempt states that, reached while the attempt was being launched, mean it must stop."""


FLOWS_PROBE = 1.0
"""How often (seconds) a running dispatcher reads whether any tenant has a flow, beside its
ticks: a flow made now has its jobs claimed within that, and a store without flows is asked
nothing more."""
UNSENT_PAST_GRACE = "claimed longer ago than launch_grace before its turn to be sent"


@dataclass(frozen=True, slots=True)
class Tick:
    """What one claim -> launch -> record cycle did."""

    claimed: int = 0
    launched: int = 0
    launch_errors: int = 0
    recorded: int = 0
    carried: int = 0  # claimed but not launched before tick_deadline: first in the next tick
    more: bool = field(default=False, compare=False)  # full claim or carried: tick again now


class Dispatcher(core.Core):
    """Runs the dispatch cycle and applies completions for a set of executors."""

    def __init__(self, **needs: Unpack[core.Needs]) -> None:
        super().__init__(**needs)
        if not self.executors:
            raise errors.ConfigError(
                "executors.enabled: the dispatcher needs at least one executor"
            )
        self.limits = store.DefaultLimits(self.t.attempt_deadline, self.t.lease_timeout)
        self.completions = completions.Completions(self)
        self._carried: list[model.Claimed] = []  # claimed, not yet launched: next tick's first
        # The next tick's claim, made while this tick launches (a full claim says there is
        # more): ticks overlap by at most this one claim.
        self._next_claim: asyncio.Task[list[model.Claimed]] | None = None
        self._overlap = False  # on while run() runs (not for a lone run_once), off at its stop
        self._unrecorded: list[int] = []  # launched, `running` not written yet (a failed settle)
        self._stopping: set[asyncio.Task[None]] = set()  # cancels of attempts cancelled mid-launch
        self._flows_next = float("-inf")  # when (monotonic) the next flow claim is due
        self._flows_exist = False  # has any tenant a flow? (`_flows_seen`, while run() runs)
        self.launches = launches.Launches(self)

    # --- the cycle -------------------------------------------------------------------------

    async def run_once(self) -> Tick:
        """One cycle: claim, launch, record. Launch errors leave attempts for recovery.

        No launch starts later than `tick_deadline` after the claim: the attempts not
        launched by then stay claimed by this dispatcher and are launched first in the next
        tick (which claims that many fewer), so a slow platform makes ticks shorter.

        A failed claim does not hold those attempts back: their deadlines are running, so
        they are launched and recorded all the same, and then the claim's error is raised.
        Completions have a writer of their own: a completion write that waits (on a lock,
        on a slow network) never holds up a claim."""
        self.completions.tick_begins()
        try:
            return await self._tick()
        finally:
            self.completions.tick_ends()

    async def _tick(self) -> Tick:
        carried, self._carried = self._carried, []
        room = self.settings.claim_batch_limit - len(carried)
        fresh: list[model.Claimed] = []
        failed_claim: errors.StoreError | None = None
        ahead, self._next_claim = self._next_claim, None
        if ahead is not None or room > 0:
            try:
                fresh = await ahead if ahead is not None else await self._claim(room)
            except errors.StoreError as exc:
                if not carried:
                    raise
                failed_claim = exc
                log.error(
                    "claim failed (%s); launching the %d attempts held from the last tick"
                    " all the same",
                    exc,
                    len(carried),
                )
        if self._overlap and failed_claim is None and fresh and len(fresh) >= room and not carried:
            # A full claim: there is more. The next one runs while these launch, so the
            # store's round trips overlap the platform's. Not while launches lag behind
            # (attempts carried over): a full batch claimed ahead on top of them would
            # pile up claims that wait past their launch_grace.
            self._next_claim = asyncio.create_task(self._claim(self.settings.claim_batch_limit))
        claimed = len(fresh)
        fresh = await self.launches.record_before_sending(fresh)
        tick = await self._launch_and_record(carried + fresh, fresh=claimed, room=room)
        if failed_claim is not None:
            raise failed_claim
        return tick

    async def _claim(self, room: int) -> list[model.Claimed]:
        flowed = await self._flow_claim(room)
        room -= len(flowed)
        if room <= 0:
            return flowed
        with metrics.timed(metrics.CLAIM, self.clock):
            return flowed + await self.store.jobs.claim(
                now=self.clock.now(),
                limit=room,
                executors=list(self.executors),
                limits=self.limits,
                pools=self.settings.pools,
                tenants=self.settings.tenant_caps,
                weights=self.settings.tenant_weights,
            )

    async def _flow_claim(self, room: int) -> list[model.Claimed]:
        """The flows' jobs with room (store/flow_claims.py), claimed first, within the same
        pools, tenants' max_running and fair shares as the claim after it, and at most
        their tenants' fair part of `room`: while the last flow claim took some, every
        claim; else once a dispatch_interval (a flow's job waits at most that long for one).
        None at all while no tenant has a flow: whether one has is read beside the ticks
        (`_flows_seen`), so a tick of jobs of no flow is the same two statements as ever."""
        at = self.clock.monotonic()
        if at < self._flows_next or not self._flows_exist:
            return []
        flowed = await self.store.flows.claim(
            now=self.clock.now(),
            limit=room,
            executors=list(self.executors),
            limits=self.limits,
            pools=self.settings.pools,
            tenants=self.settings.tenant_caps,
            weights=self.settings.tenant_weights,
        )
        interval = self.settings.timeouts.dispatch_interval.total_seconds()
        # Half an interval: the idle tick after this one, an interval from its start, is
        # past it however long this one took.
        self._flows_next = at if flowed else at + interval / 2
        return flowed

    async def _launch_and_record(self, todo: list[model.Claimed], *, fresh: int, room: int) -> Tick:
        if not todo and not self._unrecorded:
            return Tick()
        # Counted from the claim's commit: the launches are what the deadline bounds.
        until = self.clock.monotonic() + self.settings.timeouts.tick_deadline.total_seconds()
        if fresh:
            failpoints.hit("after_claim_commit")
        results = await self.launches.launch_all(todo, until)
        done = dict(zip((c.attempt.id for c in todo), results, strict=True))
        self._carried = [c for c in todo if done[c.attempt.id] is launches.Result.LATER]
        launched = [c.attempt.id for c in todo if done[c.attempt.id] is launches.Result.LAUNCHED]
        # Recorded running before they were sent: nothing to settle.
        blind = self.launches.sent_blind(
            c.attempt.id for c in todo if done[c.attempt.id] is not launches.Result.LATER
        )
        unrecorded = [fence for fence in launched if fence not in blind]
        failpoints.hit("before_record_running")
        recorded, outcomes = await self._settle(unrecorded)
        late = await self._give_up(todo, done, blind)
        self.completions.log_outcomes(outcomes)
        moved = set(unrecorded) - set(recorded) - {o.fence for o in outcomes}
        await self._stop_moved([c.attempt for c in todo if c.attempt.id in moved])
        tick = Tick(
            claimed=fresh,
            launched=len(launched),
            launch_errors=sum(r is launches.Result.FAILED for r in results),
            recorded=len(recorded),
            carried=len(self._carried),
            more=fresh >= room or bool(self._carried) or self._next_claim is not None,
        )
        _log_tick(tick, late)
        return tick

    async def _give_up(
        self, todo: Sequence[model.Claimed], done: dict[int, launches.Result], blind: set[int]
    ) -> int:
        """Write the attempts too late to launch, or recorded running and never sent, as
        never launched (`blind`: those recorded running before their send); how many."""
        too_late = [c.attempt.id for c in todo if done[c.attempt.id] is launches.Result.TOO_LATE]
        unsent = [c.attempt.id for c in todo if done[c.attempt.id] is launches.Result.UNSENT]
        await self._never_launched([f for f in too_late if f not in blind], recorded=False)
        await self._never_launched([f for f in too_late if f in blind], recorded=True)
        await self._never_launched(unsent, recorded=True, why=UNSENT_PAST_GRACE)
        return len(too_late) + len(unsent)

    async def _never_launched(
        self, fences: list[int], *, recorded: bool, why: str = base.DEADLINE_BEFORE_LAUNCH
    ) -> None:
        """Give up on attempts this process never sent: each is superseded, not charged, and
        its job queued for a new attempt at once (not after recovery_grace)."""
        if fences:
            await self.store.attempts.never_launched(
                fences=fences, now=self.clock.now(), why=why, recorded=recorded
            )

    async def _settle(self, launched: list[int]) -> tuple[list[int], list[store.Outcome]]:
        """Record the launched attempts as running, with the completions that have arrived
        meanwhile, in one transaction. If that fails, the launched ones are recorded next
        tick (recovery adopts them should this process die first)."""
        finishes = self.completions.take(self.settings.claim_batch_limit)
        fences = self._unrecorded + launched
        try:
            with metrics.timed(metrics.SETTLE.labels(write="settle"), self.clock):
                recorded, outcomes = await self.store.attempts.settle(
                    launched=fences, finishes=finishes, now=self.clock.now(), retry=self.retry
                )
        except errors.CorralError:
            self.completions.requeue(finishes)
            self._unrecorded = fences
            raise
        self._unrecorded = []
        self.completions.done(finishes)
        return recorded, outcomes

    async def _stop_moved(self, attempts: Sequence[model.Attempt]) -> None:
        """Attempts that left `launching` while being launched: if they were cancelled or
        superseded meanwhile they must not keep running, so stop them, without holding up
        the loop. Ones that finished (their completion was written meanwhile) or that
        recovery adopted are left alone."""
        if not attempts:
            return
        states = await self.store.attempts.states(fences=[a.id for a in attempts])
        grace = self.settings.timeouts.cancel_grace
        for attempt in attempts:
            status = states.get(attempt.id)
            if status is None or not (
                status.attempt_state in _STOP_IF_LAUNCHED or status.job_state == J.CANCELLED
            ):
                continue
            log.info("%s ended while launching; stopping it", attempt.launch_name)
            executor = self.executors[attempt.executor]
            task = asyncio.create_task(self._cancel_quietly(executor, attempt.launch_name, grace))
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)

    @staticmethod
    async def _cancel_quietly(executor: Executor, name: str, grace: timedelta) -> None:
        try:
            await executor.cancel(name, grace)
        except errors.CorralError as exc:
            log.warning("%s: could not stop it: %s", name, exc)

    # --- the loop ------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, *, on_tick: Callable[[], None] | None = None) -> None:
        """Dispatch until `stop` is set; then finish the tick in hand and write completions.

        `on_tick` is called after every tick, one that failed included: the loop is alive
        (corral.health). It runs on the event loop, so it must return at once."""
        helpers = [asyncio.create_task(self.completions.write_forever(), name="completions")]
        helpers.append(asyncio.create_task(self.completions.poll_forever(), name="poll"))
        helpers.append(asyncio.create_task(self._flows_seen(stop), name="flows"))
        helpers += [
            asyncio.create_task(self.completions.watch(e), name=f"watch-{e.kind}")
            for e in self.executors.values()
        ]
        log.info(
            "dispatcher started: executors %s, claim batch %d",
            ", ".join(self.executors),
            self.settings.claim_batch_limit,
        )
        self._overlap = True
        try:
            await self._loop(stop, on_tick)
        finally:
            self._overlap = False
            if self._next_claim is not None and not self._next_claim.done():
                self._next_claim.cancel()  # what it claimed, if anything, recovery launches
            await self._drain_executors()
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, *self._stopping, return_exceptions=True)
            await self._final_flush()
            log.info("dispatcher stopped")

    async def _flows_seen(self, stop: asyncio.Event) -> None:
        """Read whether any tenant has a flow, once every FLOWS_PROBE, until `stop`: the
        flow claim is made only while one has."""
        while not stop.is_set():
            try:
                self._flows_exist = await self.store.flows.exist()
            except errors.StoreError as exc:
                log.warning("could not read whether any flow exists (%s); again soon", exc)
            await clock.sleep_or_stop(self.clock, stop, FLOWS_PROBE)

    async def _drain_executors(self) -> None:
        """Let the launches that run inside this process (HTTP requests) end, and queue their
        outcomes for the last flush: stopped, they would be lost and sent again."""
        for executor in self.executors.values():
            if isinstance(executor, base.Drains):
                try:
                    for observation in await executor.drain():
                        self.completions.offer(observation)
                except Exception as exc:
                    log.warning("%s: could not drain: %s", executor.kind, exc)

    async def _final_flush(self) -> None:
        try:
            await self.completions.flush()
        except errors.CorralError as exc:
            log.error(
                "%d completions not written (%s); the next start finds them again by polling",
                self.completions.queued(),
                exc,
            )

    async def _loop(self, stop: asyncio.Event, on_tick: Callable[[], None] | None) -> None:
        """A tick every `dispatch_interval` (start to start); at once while there is more."""
        interval = self.settings.timeouts.dispatch_interval.total_seconds()
        while not stop.is_set():
            began = self.clock.monotonic()
            try:
                tick = await asyncio.shield(self.run_once())
            except errors.StoreError as exc:
                log.error("tick failed, trying again in %.1fs: %s", interval, exc)
                tick = Tick()
            took = self.clock.monotonic() - began
            metrics.TICK.observe(max(took, 0.0))
            if on_tick is not None:
                on_tick()
            if not tick.more:
                await clock.sleep_or_stop(self.clock, stop, max(interval - took, 0.0))
        self._overlap = False
        if self._next_claim is not None:  # claimed ahead: launch those before stopping
            try:
                await asyncio.shield(self.run_once())
            except errors.StoreError as exc:
                log.error("last tick failed: %s; recovery launches what it held", exc)
        if self._carried:
            log.info(
                "%d claimed attempts were not launched before the stop; recovery launches them",
                len(self._carried),
            )


def _log_tick(tick: Tick, late: int) -> None:
    """Say in the log what a tick did; `late`: attempts too late to launch."""
    log.info(
        "tick: claimed %d, launched %d, launch errors %d, recorded running %d%s%s",
        tick.claimed,
        tick.launched,
        tick.launch_errors,
        tick.recorded,
        f", {tick.carried} left for the next tick (tick_deadline)" if tick.carried else "",
        f", {late} too late to launch (new attempts, not charged)" if late else "",
    )
