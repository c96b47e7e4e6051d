"""The dispatcher: claim due jobs, launch their attempts, record them, and apply completions.

The cycle follows the outbox rule. (1) Claim: one transaction moves up to
`claim_batch_limit` jobs to running and creates their attempts in `launching`, and
commits. (2) Launch: outside any transaction, each attempt is created on its platform
under its deterministic launch name; "already exists" counts as launched. (3) Record:
the launched attempts move to `running`. A crash between any two steps leaves an attempt
that recovery can finish from the store and the platform alone, never a lost job.

Completions arrive pushed (an executor's `events()`) or polled (`observe()` of the
store's active attempts) and are written in batches through the store's compare-and-set
transitions, so the same completion arriving twice applies once.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from corral import clock, config, errors, failpoints, metrics, model, retry, store
from corral import retry as retry_  # the modules, where a parameter has their name
from corral import store as store_
from corral.executors import base
from corral.executors.base import Executor

NOTED = 10_000
"""How many waiting attempts a dispatcher remembers it noted the reason of (one it forgot
is noted again)."""

log = logging.getLogger("corral.dispatcher")
J, A = model.JobState, model.AttemptState
_JOB_NEXT = {J.QUEUED: "queued for retry"}
_STOP_IF_LAUNCHED = frozenset({A.CANCELLED, A.SUPERSEDED})
"""Attempt states that, reached while the attempt was being launched, mean it must stop."""


UNSENT_PAST_GRACE = "claimed longer ago than launch_grace before its turn to be sent"


class _Result(enum.Enum):
    """What became of one launch in a tick."""

    LAUNCHED = "launched"
    FAILED = "failed"  # left `launching` for recovery
    LATER = "later"  # the tick's deadline came first: first in the next tick
    TOO_LATE = "too late"  # its deadline passed before launch: never launched, not charged
    UNSENT = "unsent"  # recorded running before its send, then past launch_grace: the same


@dataclass(frozen=True, slots=True)
class Tick:
    """What one claim -> launch -> record cycle did."""

    claimed: int = 0
    launched: int = 0
    launch_errors: int = 0
    recorded: int = 0
    carried: int = 0  # claimed but not launched before tick_deadline: first in the next tick
    more: bool = field(default=False, compare=False)  # full claim or carried: tick again now


class Dispatcher:
    """Runs the dispatch cycle and applies completions for a set of executors."""

    def __init__(
        self,
        *,
        store: store.Store,
        executors: Mapping[str, Executor],
        clock: clock.Clock,
        settings: config.Settings,
        retry: retry.Retry | None = None,
        sender: str | None = None,
    ) -> None:
        """`sender`: this process's id in the loops table, recorded on each attempt it
        sends blind (before it is sent), so recovery ends those at once if it dies."""
        if not executors:
            raise errors.ConfigError(
                "executors.enabled: the dispatcher needs at least one executor"
            )
        self.store = store
        self.executors = dict(executors)
        self.clock = clock
        self.settings = settings
        self.retry = retry or retry_.Retry.from_settings(settings)
        self.sender = sender
        self.limits = store_.DefaultLimits(
            settings.timeouts.attempt_deadline, settings.timeouts.lease_timeout
        )
        self._carried: list[model.Claimed] = []  # claimed, not yet launched: next tick's first
        # The next tick's claim, made while this tick launches (a full claim says there is
        # more): ticks overlap by at most this one claim.
        self._next_claim: asyncio.Task[list[model.Claimed]] | None = None
        self._overlap = False  # on while run() runs (not for a lone run_once), off at its stop
        self._completions = asyncio.Queue[store_.Finish]()
        self._pending: set[int] = set()  # fences queued or being written: polls repeat them
        self._arrived = asyncio.Event()
        self._unrecorded: list[int] = []  # launched, `running` not written yet (a failed settle)
        # Set while no tick is in flight. The completion writer waits for it, so that what
        # arrives during a tick is written in that tick's last transaction (fewer, bigger
        # writes); a tick never waits for the writer, so a stuck write holds up no claim.
        self._between_ticks = asyncio.Event()
        self._between_ticks.set()
        self._stopping: set[asyncio.Task[None]] = set()  # cancels of attempts cancelled mid-launch
        self._reaches = base.Reaches(settings)
        self._recorded_first: set[int] = set()  # recorded running before sending, not yet sent
        self._noted: dict[int, set[str]] = {}  # why each attempt waited on its platform, noted

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
        self._between_ticks.clear()
        try:
            return await self._tick()
        finally:
            self._between_ticks.set()

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
        fresh = await self._record_before_sending(fresh)
        tick = await self._launch_and_record(carried + fresh, fresh=claimed, room=room)
        if failed_claim is not None:
            raise failed_claim
        return tick

    async def _record_before_sending(self, fresh: list[model.Claimed]) -> list[model.Claimed]:
        """Record as running, before they are launched, the attempts of executors that leave
        nothing on a platform to observe (an HTTP request): a crash after the send then
        leaves a running attempt that recovery calls lost (the job retries, a new fence),
        never a launching one that it would send again. What cannot be recorded now stays
        launching, unsent, for recovery (or was cancelled meanwhile): not launched."""
        blind = [
            c.attempt.id
            for c in fresh
            if not base.observable(self.executors[c.attempt.executor]) and self._in_time(c)
        ]
        if not blind:
            return fresh
        try:
            recorded = set(
                await self.store.attempts.record_running(
                    fences=blind,
                    now=self.clock.now(),
                    reason="recorded running before it is sent",
                    sent_by=self.sender,
                )
            )
        except errors.StoreError as exc:
            log.error(
                "%d attempts not recorded before sending (%s); left for recovery", len(blind), exc
            )
            recorded = set()
        self._recorded_first.update(recorded)
        return [c for c in fresh if c.attempt.id in recorded or c.attempt.id not in blind]

    def _in_time(self, claimed: model.Claimed) -> bool:
        """Whether the attempt can still be launched (its deadline has not passed): one that
        cannot is left launching, to end as never launched (not charged)."""
        try:
            base.launch_for(claimed, self.settings, self.clock.now(), reaches=self._reaches)
        except errors.LaunchTooLate:
            return False
        return True

    async def _claim(self, room: int) -> list[model.Claimed]:
        with metrics.timed(metrics.CLAIM, self.clock):
            return await self.store.jobs.claim(
                now=self.clock.now(),
                limit=room,
                executors=list(self.executors),
                limits=self.limits,
                pools=self.settings.pools,
                tenants=self.settings.tenant_caps,
            )

    async def _launch_and_record(self, todo: list[model.Claimed], *, fresh: int, room: int) -> Tick:
        if not todo and not self._unrecorded:
            return Tick()
        # Counted from the claim's commit: the launches are what the deadline bounds.
        until = self.clock.monotonic() + self.settings.timeouts.tick_deadline.total_seconds()
        if fresh:
            failpoints.hit("after_claim_commit")
        results = await self._launch_all(todo, until)
        done = dict(zip((c.attempt.id for c in todo), results, strict=True))
        self._carried = [c for c in todo if done[c.attempt.id] is _Result.LATER]
        launched = [c.attempt.id for c in todo if done[c.attempt.id] is _Result.LAUNCHED]
        # Recorded running before they were sent: nothing to settle.
        blind = self._recorded_first.intersection(
            c.attempt.id for c in todo if done[c.attempt.id] is not _Result.LATER
        )
        self._recorded_first -= blind
        unrecorded = [fence for fence in launched if fence not in blind]
        failpoints.hit("before_record_running")
        recorded, outcomes = await self._settle(unrecorded)
        too_late = [c.attempt.id for c in todo if done[c.attempt.id] is _Result.TOO_LATE]
        unsent = [c.attempt.id for c in todo if done[c.attempt.id] is _Result.UNSENT]
        await self._never_launched([f for f in too_late if f not in blind], recorded=False)
        await self._never_launched([f for f in too_late if f in blind], recorded=True)
        await self._never_launched(unsent, recorded=True, why=UNSENT_PAST_GRACE)
        self._log_outcomes(outcomes)
        moved = set(unrecorded) - set(recorded) - {o.fence for o in outcomes}
        await self._stop_moved([c.attempt for c in todo if c.attempt.id in moved])
        tick = Tick(
            claimed=fresh,
            launched=len(launched),
            launch_errors=sum(r is _Result.FAILED for r in results),
            recorded=len(recorded),
            carried=len(self._carried),
            more=fresh >= room or bool(self._carried) or self._next_claim is not None,
        )
        log.info(
            "tick: claimed %d, launched %d, launch errors %d, recorded running %d%s%s",
            tick.claimed,
            tick.launched,
            tick.launch_errors,
            tick.recorded,
            f", {tick.carried} left for the next tick (tick_deadline)" if tick.carried else "",
            f", {len(too_late) + len(unsent)} too late to launch (new attempts, not charged)"
            if too_late or unsent
            else "",
        )
        return tick

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
        finishes = self._drain(self.settings.claim_batch_limit)
        fences = self._unrecorded + launched
        try:
            with metrics.timed(metrics.SETTLE.labels(write="settle"), self.clock):
                recorded, outcomes = await self.store.attempts.settle(
                    launched=fences, finishes=finishes, now=self.clock.now(), retry=self.retry
                )
        except errors.CorralError:
            self._requeue(finishes)
            self._unrecorded = fences
            raise
        self._unrecorded = []
        self._done(finishes)
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

    async def _launch_all(self, todo: Sequence[model.Claimed], until: float) -> list[_Result]:
        """Launch `todo` in order, `launch_concurrency` at a time; an attempt whose turn
        comes after the tick's deadline is not launched (LATER). A few workers take the
        attempts one after another: no task per launch."""
        results = [_Result.LATER] * len(todo)
        turns = iter(enumerate(todo))

        async def worker() -> None:
            for i, claimed in turns:
                if self.clock.monotonic() > until:
                    return  # the rest stay LATER
                results[i] = await self._launch_now(claimed)

        workers = min(self.settings.launch_concurrency, len(todo))
        await asyncio.gather(*(worker() for _ in range(workers)))
        return results

    async def _launch_now(self, claimed: model.Claimed) -> _Result:
        now = self.clock.now()
        age = now - claimed.attempt.created_at
        if age > self.settings.timeouts.launch_grace:
            if claimed.attempt.id in self._recorded_first:
                # Recorded running before its send, and never sent: recovery would wait
                # recovery_grace to call it lost; this process knows, so says so now.
                return _Result.UNSENT
            # Recovery may already have launched, finished and (on some platforms) deleted it:
            # a launch this late could run it a second time. Leave it to recovery.
            await self._note_launch_error(
                claimed,
                errors.ExecutorError(f"claimed {age.total_seconds():.0f}s ago, past launch_grace"),
            )
            return _Result.FAILED
        try:
            launch = base.launch_for(claimed, self.settings, now, reaches=self._reaches)
        except errors.LaunchTooLate:
            return _Result.TOO_LATE  # nothing was asked of the platform: a new attempt, free
        try:
            await self.executors[launch.executor].launch(launch)
        except Exception as exc:  # any failure: the attempt stays `launching` for recovery
            await self._note_launch_error(claimed, exc)
            return _Result.FAILED
        failpoints.hit("after_launch")
        return _Result.LAUNCHED

    async def _note_launch_error(self, claimed: model.Claimed, exc: Exception) -> None:
        metrics.LAUNCH_ERRORS.labels(executor=claimed.attempt.executor).inc()
        why = (
            f"launch failed: {exc}"
            if isinstance(exc, errors.CorralError)
            else f"launch failed: {exc!r}"
        )
        left = (
            "recorded running before it was sent: recovery calls it lost"
            if claimed.attempt.id in self._recorded_first
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
        await self.store.events.note(
            job_id=claimed.job.id,
            attempt_id=claimed.attempt.id,
            state=A.RUNNING if claimed.attempt.id in self._recorded_first else A.LAUNCHING,
            reason=f"{why}; {left}",
            now=self.clock.now(),
            details={"launch_name": claimed.attempt.launch_name, "error": type(exc).__name__},
        )

    # --- completions ---------------------------------------------------------------------------

    def offer(self, observation: model.Observation, *, fence: int | None = None) -> bool:
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
        self._completions.put_nowait(store.Finish.seen(identity.fence, observation))
        return True

    async def flush_completions(self) -> list[store.Outcome]:
        """Apply every queued completion now, in batches of `claim_batch_limit`."""
        outcomes: list[store.Outcome] = []
        while not self._completions.empty():
            outcomes += await self._apply(self._drain(self.settings.claim_batch_limit))
        return outcomes

    def _drain(self, room: int) -> list[store.Finish]:
        batch: list[store.Finish] = []
        while not self._completions.empty() and len(batch) < room:
            batch.append(self._completions.get_nowait())
        return batch

    async def _apply(self, batch: Sequence[store.Finish]) -> list[store.Outcome]:
        if not batch:
            return []
        try:
            with metrics.timed(metrics.SETTLE.labels(write="finish"), self.clock):
                outcomes = await self.store.attempts.finish(
                    finishes=batch, now=self.clock.now(), retry=self.retry
                )
        except (errors.CorralError, asyncio.CancelledError):
            # Cancelled: the loop is stopping, and its last flush writes them again (the
            # write in flight may commit too: a completion applies once however often).
            self._requeue(batch)
            raise
        self._done(batch)
        self._log_outcomes(outcomes)
        return outcomes

    def _requeue(self, batch: Sequence[store.Finish]) -> None:
        """Put back completions a failed write took out: they are written next time."""
        for finish in batch:
            self._completions.put_nowait(finish)
        if batch:
            self._arrived.set()

    def _done(self, batch: Sequence[store.Finish]) -> None:
        self._pending.difference_update(f.fence for f in batch)

    def _log_outcomes(self, outcomes: Sequence[store.Outcome]) -> None:
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

    async def _write_completions(self) -> None:
        """Forever: when completions have arrived, write all that queued up, in batches.
        A failed write keeps them queued and is tried again after `dispatch_interval`."""
        retry = self.settings.timeouts.dispatch_interval.total_seconds()
        while True:
            await self._arrived.wait()
            await self._between_ticks.wait()
            try:
                self._arrived.clear()
                await self.flush_completions()
            except errors.CorralError as exc:
                log.error("writing completions failed, trying again in %.1fs: %s", retry, exc)
                await self.clock.sleep(retry)

    async def _watch(self, executor: Executor) -> None:
        """Forever: take the executor's pushed observations; polling covers any gap."""
        retry = self.settings.timeouts.observe_interval.total_seconds()
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
                await self.clock.sleep(retry)

    async def poll_once(self) -> int:
        """Observe every active attempt in the store; queue the finished ones. Returns how many."""
        found = 0
        for kind, executor in self.executors.items():
            after = 0
            while page := await self.store.attempts.list_active(
                executor=kind, limit=self.settings.claim_batch_limit, after=after
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
            elif obs.phase in (model.Phase.RUNNING, model.Phase.PENDING):
                alive.append(attempt.id)
                notes.update(self._news(attempt.id, obs))
        await self.store.attempts.seen(fences=alive, now=self.clock.now())
        if notes:
            await self.store.attempts.note(notes=notes, now=self.clock.now())
        return found

    def _news(self, fence: int, obs: model.Observation) -> dict[int, str | None]:
        """What the run log should say of a live attempt: why it waits on its platform (a
        pod that has not started), the first time it waits for that reason (a kubelet
        goes back and forth between ErrImagePull and ImagePullBackOff), and that it
        started, once it has."""
        if obs.phase is model.Phase.PENDING and obs.reason:
            noted = self._noted.setdefault(fence, set())
            if obs.reason in noted:
                return {}
            noted.add(obs.reason)
            while len(self._noted) > NOTED:
                self._noted.pop(next(iter(self._noted)))
            return {fence: f"{obs.reason}: {obs.message}" if obs.message else obs.reason}
        if obs.phase is model.Phase.RUNNING and self._noted.pop(fence, None) is not None:
            return {fence: None}
        return {}

    async def _poll(self) -> None:
        interval = self.settings.timeouts.observe_interval.total_seconds()
        while True:
            try:
                await self.poll_once()
            except errors.CorralError as exc:
                log.warning("poll failed, trying again in %.1fs: %s", interval, exc)
            await self.clock.sleep(interval)

    # --- the loop ------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, *, on_tick: Callable[[], None] | None = None) -> None:
        """Dispatch until `stop` is set; then finish the tick in hand and write completions.

        `on_tick` is called after every tick, one that failed included: the loop is alive
        (corral.health). It runs on the event loop, so it must return at once."""
        helpers = [asyncio.create_task(self._write_completions(), name="completions")]
        helpers.append(asyncio.create_task(self._poll(), name="poll"))
        helpers += [
            asyncio.create_task(self._watch(e), name=f"watch-{e.kind}")
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

    async def _drain_executors(self) -> None:
        """Let the launches that run inside this process (HTTP requests) end, and queue their
        outcomes for the last flush: stopped, they would be lost and sent again."""
        for executor in self.executors.values():
            if isinstance(executor, base.Drains):
                try:
                    for observation in await executor.drain():
                        self.offer(observation)
                except Exception as exc:
                    log.warning("%s: could not drain: %s", executor.kind, exc)

    async def _final_flush(self) -> None:
        try:
            await self.flush_completions()
        except errors.CorralError as exc:
            log.error(
                "%d completions not written (%s); the next start finds them again by polling",
                self._completions.qsize(),
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
