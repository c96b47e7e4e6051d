"""The reconciler: recovery that lives outside the thing that failed.

A dispatcher can die between any two steps of its cycle, and a platform can lose what it
was running. The reconciler is a separate loop (in `corral serve`, or alone as `corral
reconciler`) that finds attempts past their grace, asks their executor what is really
there, and repairs through the store's compare-and-set transitions, so any number of
reconcilers and dispatchers can work on one database at once.

    launching, past launch_grace      present, this identity   -> launch again, same name (to
                                                                  finish a launch cut short),
                                                                  then adopt (running)
                                      absent                   -> launch again, same name
                                      present, other identity  -> failed: launch conflict
                                      finished                 -> complete it
                                      absent, past its deadline -> superseded: never
                                                                  launched, not charged; the
                                                                  job gets a new attempt
    running, no news for lease_timeout finished                -> complete it
    past its lease (heartbeats stopped) running, past deadline  -> stop it; failed: timed out
                                        (+ cancel_grace: the platform's own stop comes first)
    or past its deadline               running, lease over     -> unknown: the job's policy
                                      absent, past recovery_grace -> lost; the job retries
    the platform cannot be asked      launching                -> nothing; note it, try again
                                      running                  -> unknown: the job's policy

The unknown state has a policy per job: `wait` leaves the attempt running until its
deadline (the lease is stretched to it, and the run log says why); `fence_and_relaunch`
supersedes it and queues the job for a new attempt with a higher fence (fenced sinks then
refuse the old one's writes), and stops the old one where the platform lets it.

A present launch is launched again before it is adopted because a launch can be more than
one object: a Kubernetes Job and then the ConfigMap of its payload and the Secret of its
attempt token, which a crash between the creates leaves missing (the pod waits for them).
Launching is idempotent by name, so this makes only what is missing and never a second copy.

It also stops orphans: launches carrying corral's labels whose attempt has ended, or whose
job was cancelled. Everything it knows about a launch it reads from the launch's labels,
never from memory, so a reconciler started after every process died rebuilds the picture.
The parts live beside it: its maintenance passes (corral.maintenance), the unknown state
(corral.unknown), its stops of overdue attempts (corral.stopping), and what they share
(corral.recovery).
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Unpack

from corral import (
    clock,
    core,
    errors,
    failpoints,
    launching,
    loops,
    maintenance,
    metrics,
    model,
    python_tasks,
    store,
)
from corral import stopping as stopping_
from corral import unknown as unknown_
from corral.executors import base
from corral.executors.base import Executor
from corral.recovery import Pass, failed, repaired

log = logging.getLogger("corral.reconciler")
A, J, P = model.AttemptState, model.JobState, launching.Phase


@dataclass(slots=True)
class _Work:
    """Repairs gathered while looking at one executor's attempts, written together."""

    adopt: list[int] = field(default_factory=list)
    present: list[model.Claimed] = field(default_factory=list)  # to launch again, then adopt
    relaunch: list[model.Claimed] = field(default_factory=list)
    relaunched: list[int] = field(default_factory=list)
    finishes: list[store.Finish] = field(default_factory=list)
    alive: list[int] = field(default_factory=list)
    overdue: list[model.Attempt] = field(default_factory=list)
    unknown: list[tuple[model.Claimed, str]] = field(default_factory=list)
    never_launched: list[int] = field(default_factory=list)
    lost: list[model.Attempt] = field(default_factory=list)


class Reconciler(core.Core):
    """Finds attempts past their grace and repairs them from what the platform shows; its
    maintenance passes, its unknown-state policy and its stops are parts of their own."""

    def __init__(self, **needs: Unpack[core.Needs]) -> None:
        super().__init__(**needs)
        self._here = loops.Here.this_host()
        self.maintenance = maintenance.Maintenance(self)
        self.unknown = unknown_.Unknowns(self)
        self.stops = stopping_.Stops(self)
        # Where the last pass stopped: attempts that must wait (absent but not yet lost, or on
        # a platform that cannot be asked) must not keep the ones behind them from a look.
        self._cursor = 0

    async def run(self, stop: asyncio.Event, *, on_pass: Callable[[], None] | None = None) -> None:
        """Make a pass every `reconcile_interval` until `stop` is set.

        `on_pass` is called after every pass, one that failed included: the loop is alive
        (corral.health). It runs on the event loop, so it must return at once."""
        interval = self.t.reconcile_interval.total_seconds()
        log.info(
            "reconciler started: every %.1fs, at most %d attempts a pass",
            interval,
            self.settings.recovery_batch_limit,
        )
        while not stop.is_set():
            try:
                await self.run_once()
            except errors.CorralError as exc:
                log.error("pass failed, trying again in %.1fs: %s", interval, exc)
            if on_pass is not None:
                on_pass()
            await clock.sleep_or_stop(self.clock, stop, interval)
        log.info("reconciler stopped")

    async def run_once(self) -> Pass:
        """One pass: repair at most `recovery_batch_limit` attempts, then stop orphans."""
        summary = Pass()
        await self.maintenance.before(summary)
        await self._lose_blind_of_the_dead(summary)
        due = await self._due()
        summary.looked = len(due)
        by_kind: dict[str, list[model.Claimed]] = defaultdict(list)
        for item in due:
            by_kind[item.attempt.executor].append(item)
        for kind, items in by_kind.items():
            if kind == python_tasks.PYTHON:
                await self._repair_tasks(items, summary)
            else:
                await self._repair_all(kind, items, summary)
        await self.maintenance.after(summary)
        metrics.repairs({f.name: getattr(summary, f.name) for f in fields(summary)})
        done = (
            summary.orphans_cancelled,
            summary.forgotten,
            summary.jobs_removed,
            summary.logs_trimmed,
            summary.parked,
            summary.unparked,
        )
        if summary.looked or summary.slas_missed or any(done):
            log.info("pass: %s", summary)
        return summary

    async def _due(self) -> list[model.Claimed]:
        """The attempts due for recovery, at most `recovery_batch_limit`, from where the
        last pass stopped."""
        due = await self.store.attempts.list_for_recovery(
            now=self.clock.now(),
            launch_grace=self.t.launch_grace,
            lease_timeout=self.t.lease_timeout,
            attempt_deadline=self.t.attempt_deadline,
            limit=self.settings.recovery_batch_limit,
            after=self._cursor,
        )
        full = len(due) == self.settings.recovery_batch_limit
        self._cursor = due[-1].attempt.id if full else 0
        if not full:  # every attempt due is here: one not due has ended some other way
            self.stops.forget({item.attempt.id for item in due})
        return due

    # --- repairs ---------------------------------------------------------------------------

    async def _lose_blind_of_the_dead(self, summary: Pass) -> None:
        """Blind attempts (recorded running before they were sent: an HTTP request) whose
        sender the loops table shows dead are lost now, not after recovery_grace: nothing
        will ever record their outcome. Each job gets a new attempt at once (a new fence,
        the same Idempotency-Key), not charged (store.attempt_ends.attempt_lost_with_sender)."""
        now = self.clock.now()
        dead = loops.dead(
            await self.store.loops.all(),
            now=now,
            heartbeat=self.t.heartbeat_interval,
            here=self._here,
            me=self.sender,
            # A silence counts only while this process beats steadily itself.
            silence_counts=self.pulse is None or self.pulse.sees_silence(),
        )
        if not dead:
            return
        blind = await self.store.loops.sent_by(
            senders=sorted(dead), limit=self.settings.recovery_batch_limit
        )
        by_sender: dict[str, list[model.Attempt]] = defaultdict(list)
        for attempt, sender in blind:
            by_sender[sender].append(attempt)
        for sender, cut in sorted(by_sender.items()):
            why = dead[sender]
            ended = await self.store.loops.lost_with_sender(
                fences=[a.id for a in cut], now=now, why=why
            )
            summary.lost += len(ended)
            for attempt in cut:
                if attempt.id in ended:
                    repaired(attempt, f"lost with its sender ({why})")

    async def _repair_tasks(self, items: Sequence[model.Claimed], summary: Pass) -> None:
        """Python tasks' attempts: a `corral worker` is their platform, and its heartbeats
        (which renew each attempt's lease) are all there is to observe. One past its
        deadline whose worker did not stop it is failed as timed out (the worker stops the
        run at its next heartbeat). One whose lease ran out lost its worker: if a live
        worker reads its payload, it is lost and the job's policy retries it; if none does,
        the job is parked, not charged, until one that reads it registers."""
        now = self.clock.now()
        since = now - self.t.lease_timeout
        finishes: list[store.Finish] = []
        silent: list[model.Claimed] = []
        for item in items:
            attempt = item.attempt
            deadline = attempt.deadline_at or (
                (attempt.started_at or attempt.created_at) + self.t.attempt_deadline
            )
            if deadline + self.t.cancel_grace <= now:
                summary.timed_out += 1
                repaired(attempt, "timed out")
                finishes.append(failed(attempt, "timed out: ran past its deadline"))
            elif (
                _past(attempt.lease_until, now)
                or _past(attempt.last_seen_at, since)
                or attempt.state == A.LAUNCHING
            ):
                silent.append(item)
        park = await self._lost_tasks(silent, since, finishes, summary)
        if finishes:
            await self.store.attempts.finish(finishes=finishes, now=now, retry=self.retry)
        await self._park(park, now, summary)

    async def _lost_tasks(
        self,
        silent: Sequence[model.Claimed],
        since: datetime,
        finishes: list[store.Finish],
        summary: Pass,
    ) -> dict[tuple[str, int], list[int]]:
        """Of tasks' attempts whose worker went silent, those a live worker reads are lost
        (their ends join `finishes`); the others, by task and version, to park."""
        readers = await self.store.workers.task_readers(
            pairs=[(*python_tasks.task_of(i.job.spec), i.job.queue) for i in silent], since=since
        )
        park: dict[tuple[str, int], list[int]] = defaultdict(list)
        for item in silent:
            pair = python_tasks.task_of(item.job.spec)
            if (*pair, item.job.queue) in readers:
                summary.lost += 1
                repaired(item.attempt, "lost: its worker went silent")
                finishes.append(
                    store.Finish(
                        item.attempt.id,
                        A.LOST,
                        None,
                        "lost: its worker stopped sending heartbeats (killed, or cut off)",
                        failure_class=model.FailureClass.TRANSIENT,
                    )
                )
            else:
                park[pair].append(item.attempt.id)
        return park

    async def _park(
        self, park: dict[tuple[str, int], list[int]], now: datetime, summary: Pass
    ) -> None:
        """Park the jobs of attempts no live worker reads, not charged."""
        for (task, version), fences in sorted(park.items()):
            parked = await self.store.attempts.park(
                fences=fences,
                task=task,
                version=version,
                now=now,
                why=f"its worker went silent and no live worker reads task {task}"
                f" version {version}",
            )
            summary.parked += len(parked)
            for fence in parked:
                log.warning(
                    "attempt %d: its worker went silent; no live worker reads task %s version"
                    " %d: its job is parked, not charged",
                    fence,
                    task,
                    version,
                )

    async def _repair_all(self, kind: str, items: Sequence[model.Claimed], summary: Pass) -> None:
        executor = self.executors.get(kind)
        if executor is None:
            log.warning(
                "%d attempts need executor %r, which this corral does not run", len(items), kind
            )
            summary.unknown += len(items)
            return
        work = _Work()
        try:
            seen = await executor.observe([i.attempt.launch_name for i in items])
        except errors.ExecutorError as exc:
            seen = {}
            why = f"platform unknown: {exc}"
        else:
            why = "platform unknown: no answer for this name"
        for item in items:
            obs = seen.get(item.attempt.launch_name)
            if obs is None and item.attempt.state == A.RUNNING:
                summary.unknown += 1
                work.unknown.append((item, why))
            elif obs is None:
                await self.unknown.note([item], why, summary)
            elif item.attempt.state == A.LAUNCHING:
                self._repair_launching(item, obs, work, summary)
            else:
                self._repair_running(item, obs, work, summary)
        slots = asyncio.Semaphore(self.settings.launch_concurrency)
        await asyncio.gather(
            *(self._relaunch(executor, i, slots, work, summary) for i in work.relaunch),
            *(self._adopt(executor, i, slots, work, summary) for i in work.present),
        )
        if work.relaunched:
            failpoints.hit("mid_repair")
        await self._write(executor, work, summary)

    def _repair_launching(
        self,
        item: model.Claimed,
        obs: launching.Observation,
        work: _Work,
        summary: Pass,
    ) -> None:
        attempt = item.attempt
        if obs.phase is not P.ABSENT and obs.identity != _identity(attempt):
            summary.conflicts += 1
            repaired(attempt, "launch conflict")
            work.finishes.append(failed(attempt, _conflict(obs, attempt)))
        elif obs.phase.finished:
            summary.completed += 1
            repaired(attempt, f"completed ({obs.phase})")
            work.finishes.append(store.Finish.seen(attempt.id, obs))
        elif obs.phase is P.ABSENT and _past(attempt.deadline_at, self.clock.now()):
            # Too late to launch it now, and it never ran: not the job's fault, so it costs
            # no attempt; the job gets a new one (higher fence, fresh deadline).
            summary.never_launched += 1
            repaired(attempt, "never launched; its job gets a new attempt, not charged")
            work.never_launched.append(attempt.id)
        elif obs.phase is P.ABSENT:
            work.relaunch.append(item)
        else:
            work.present.append(item)

    async def _launch_again(
        self, executor: Executor, item: model.Claimed, slots: asyncio.Semaphore
    ) -> errors.CorralError | None:
        """Launch an attempt again under its own name (idempotent: if a launch of it got
        through, the platform refuses a second copy); the error, or None."""
        try:
            launch = base.launch_for(item, self.settings, self.clock.now(), relaunch=True)
            if not base.observable(executor) and not await self.store.attempts.record_running(
                fences=[item.attempt.id],
                now=self.clock.now(),
                reason="recorded running before it is sent",
                sent_by=self.sender,
            ):
                return None  # no longer launching: another process has it
            async with slots:
                await executor.launch(launch)
        except errors.CorralError as exc:
            return exc
        return None

    def _refused(
        self, item: model.Claimed, exc: errors.CorralError, work: _Work, summary: Pass
    ) -> bool:
        """Fail the attempt if its platform will never take its launch: True if so."""
        if isinstance(exc, errors.LaunchConflict):
            summary.conflicts += 1
            repaired(item.attempt, "launch conflict")
            work.finishes.append(failed(item.attempt, f"launch conflict: {exc}"))
            return True
        if isinstance(exc, errors.LaunchRefused):  # the platform refuses it: no retry helps
            summary.conflicts += 1
            repaired(item.attempt, "launch refused")
            work.finishes.append(
                store.Finish(
                    item.attempt.id,
                    A.FAILED,
                    None,
                    f"launch refused by the platform: {exc}",
                    model.FailureClass.PERMANENT,
                )
            )
            return True
        return False

    async def _adopt(
        self,
        executor: Executor,
        item: model.Claimed,
        slots: asyncio.Semaphore,
        work: _Work,
        summary: Pass,
    ) -> None:
        """Adopt an attempt found on its platform, once launched again so that what a crash
        kept its launch from making is made (a Job's payload ConfigMap, its token's
        Secret). One past its deadline is adopted as it is: its platform is stopping it. A
        launch that fails otherwise leaves it `launching` for the next pass."""
        exc = await self._launch_again(executor, item, slots)
        if exc is None or isinstance(exc, errors.LaunchTooLate):
            summary.adopted += 1
            repaired(item.attempt, "adopted")
            work.adopt.append(item.attempt.id)
        elif not self._refused(item, exc, work, summary):
            await self.unknown.note(
                [item],
                f"adopting it, its launch asked again failed; will try again: {exc}",
                summary,
            )

    async def _relaunch(
        self,
        executor: Executor,
        item: model.Claimed,
        slots: asyncio.Semaphore,
        work: _Work,
        summary: Pass,
    ) -> None:
        """Launch an attempt again under its own name: if the first launch did get through
        after all, the platform refuses a second copy."""
        exc = await self._launch_again(executor, item, slots)
        if exc is None:
            summary.relaunched += 1
            repaired(item.attempt, "relaunched")
            work.relaunched.append(item.attempt.id)
        elif self._refused(item, exc, work, summary):
            return
        elif item.attempt.created_at + self.t.recovery_grace <= self.clock.now():
            summary.conflicts += 1  # it never got onto the platform: give up on it
            repaired(item.attempt, "launch failed for good")
            work.finishes.append(failed(item.attempt, f"launch failed past recovery_grace: {exc}"))
        else:
            await self.unknown.note([item], f"relaunch failed, will try again: {exc}", summary)

    def _repair_running(
        self, item: model.Claimed, obs: launching.Observation, work: _Work, summary: Pass
    ) -> None:
        attempt, now = item.attempt, self.clock.now()
        started = attempt.started_at or attempt.created_at
        deadline = attempt.deadline_at or started + self.t.attempt_deadline
        if obs.phase is not P.ABSENT and obs.identity != _identity(attempt):
            summary.unknown += 1  # someone else's object under our name: never adopt or fail on it
            log.warning(
                "%s shows another identity (%s); leaving it", attempt.launch_name, obs.labels
            )
        elif attempt.id in self.stops:
            # Being stopped: overdue whether its launch is still there, gone, or finished (a
            # deleted Job's pods run on in their grace): it ends once nothing of it runs.
            work.overdue.append(attempt)
        elif obs.phase.finished:
            summary.completed += 1
            repaired(attempt, f"completed ({obs.phase}), missed while no dispatcher watched")
            work.finishes.append(store.Finish.seen(attempt.id, obs))
        elif obs.phase is not P.ABSENT and deadline + self.t.cancel_grace <= now:
            summary.timed_out += 1  # its platform had its own stop and grace: the backstop
            repaired(attempt, "timed out")
            work.overdue.append(attempt)
        elif obs.phase is not P.ABSENT and deadline <= now:
            work.alive.append(attempt.id)  # its platform is stopping it (TERM, then KILL)
        elif obs.phase is P.RUNNING and _past(attempt.lease_until, now):
            summary.unknown += 1  # (a pending one has not started: it cannot send heartbeats)
            work.unknown.append((item, f"silent: no heartbeat for its lease; it shows {obs.phase}"))
        elif obs.phase is not P.ABSENT:
            work.alive.append(attempt.id)
        elif started + self.t.recovery_grace <= now:
            work.lost.append(attempt)  # unless parts of it still run (_lose)
        else:
            summary.waiting += 1  # absent, but not for long enough to be sure

    async def _write(self, executor: Executor, work: _Work, summary: Pass) -> None:
        work.finishes += await self.stops.lose(executor, work.lost, work.overdue, summary)
        work.finishes += await self.stops.stop_overdue(executor, work.overdue, work.alive, summary)
        await self.unknown.apply(executor, work.unknown, summary)
        now = self.clock.now()
        if work.adopt:
            await self.store.attempts.record_running(
                fences=work.adopt, now=now, reason="adopted: found on the platform with its labels"
            )
        if work.relaunched:
            await self.store.attempts.record_running(
                fences=work.relaunched,
                now=now,
                reason="relaunched: nothing was on the platform under its name",
            )
        if work.finishes:
            await self.store.attempts.finish(finishes=work.finishes, now=now, retry=self.retry)
        if work.never_launched:
            await self.store.attempts.never_launched(
                fences=work.never_launched, now=now, why=base.DEADLINE_BEFORE_LAUNCH
            )
        await self.store.attempts.seen(fences=work.alive, now=now)
        self.unknown.forget(
            work.adopt
            + work.relaunched
            + work.alive
            + work.never_launched
            + [f.fence for f in work.finishes]
        )


def _identity(attempt: model.Attempt) -> model.Identity:
    return model.Identity(attempt.job_id, attempt.attempt_no, attempt.id)


def _past(at: datetime | None, now: datetime) -> bool:
    return at is not None and at <= now


def _conflict(obs: launching.Observation, attempt: model.Attempt) -> str:
    owner = obs.identity or "something corral does not manage"
    return f"launch conflict: {attempt.launch_name} holds {owner}, not fence {attempt.id}"
