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
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta

from corral import clock, config, errors, failpoints, loops, metrics, model, retry, store
from corral import retry as retry_  # the module, where a parameter has its name
from corral.executors import base
from corral.executors.base import Executor

log = logging.getLogger("corral.reconciler")
A, J, P = model.AttemptState, model.JobState, model.Phase


REMOVE_BATCH = 500
REMOVE_BATCHES = 20
RETENTION_EVERY = 600.0
"""Seconds between two looks for jobs past their retention, once a look found them all."""
LABEL_EVERY = 60.0
"""Seconds between two looks for launches an earlier corral made without the installation
label, once a look labelled none (an upgrade's older processes may still be making them)."""


@dataclass(slots=True)
class Pass:
    """What one reconciler pass did."""

    looked: int = 0
    adopted: int = 0
    relaunched: int = 0
    completed: int = 0
    timed_out: int = 0
    labelled: int = 0  # an earlier corral's launches, given this installation's label
    stopping: int = 0  # stopped, but a part still runs (a pod in its termination grace)
    lost: int = 0
    conflicts: int = 0
    unknown: int = 0
    waiting: int = 0
    superseded: int = 0
    never_launched: int = 0
    orphans_cancelled: int = 0
    forgotten: int = 0
    jobs_removed: int = 0
    slas_missed: int = 0
    parked: int = 0  # Python tasks' jobs no live worker reads (queued, or whose worker went)
    unparked: int = 0  # parked ones a live worker reads after all (a race, a silence ended)

    def __str__(self) -> str:
        return ", ".join(
            f"{f.name.replace('_', ' ')} {getattr(self, f.name)}" for f in fields(self)
        )


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


@dataclass(frozen=True, slots=True)
class _Stopping:
    """An attempt recovery is stopping, waiting for its pods to end."""

    since: datetime
    lost: bool = False  # absent past recovery_grace, its pods running on: it ends lost
    noted: bool = False  # its `stopping` event is written
    read: bool = False  # what it wrote was read, before the stop: `output`
    output: model.RunLog | None = None


class Reconciler:
    """Finds attempts past their grace and repairs them from what the platform shows."""

    def __init__(
        self,
        *,
        store: store.Store,
        executors: Mapping[str, Executor],
        clock: clock.Clock,
        settings: config.Settings,
        retry: retry.Retry | None = None,
        pulse: loops.Pulse | None = None,
    ) -> None:
        """`pulse`: this process's row in the loops table: its id is recorded on each
        attempt it relaunches blind (an HTTP request, recorded running before it is sent),
        and it says when another loop's silence may be taken for its death."""
        self.store = store
        self.executors = dict(executors)
        self.clock = clock
        self.settings = settings
        self.t = settings.timeouts
        self.retry = retry or retry_.Retry.from_settings(settings)
        self.pulse = pulse
        self.sender = pulse.id if pulse is not None else None
        self._here = loops.Here.this_host()
        self._noted_unknown: set[int] = set()  # fences already noted, to keep the run log short
        # Attempts this process is stopping, by fence: since when (their pods' grace counts
        # from it), whether they were lost (else timed out), what they wrote before.
        self._stopping: dict[int, _Stopping] = {}
        self._label_due = 0.0  # when to look for launches without the installation label
        # Where the last pass stopped: attempts that must wait (absent but not yet lost, or on
        # a platform that cannot be asked) must not keep the ones behind them from a look.
        self._cursor = 0
        self._retention_due = 0.0  # when (clock.monotonic) finished jobs are next looked for

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
        if self.clock.monotonic() >= self._label_due:
            await self._label_unlabelled(summary)
        await self._lose_blind_of_the_dead(summary)
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
            self._forget_stopping({item.attempt.id for item in due})
        summary.looked = len(due)
        by_kind: dict[str, list[model.Claimed]] = defaultdict(list)
        for item in due:
            by_kind[item.attempt.executor].append(item)
        for kind, items in by_kind.items():
            if kind == model.PYTHON:
                await self._repair_tasks(items, summary)
            else:
                await self._repair_all(kind, items, summary)
        since = self.clock.now() - self.t.lease_timeout
        summary.parked += await self.store.workers.park_unread(now=self.clock.now(), since=since)
        summary.unparked += await self.store.workers.unpark_read(now=self.clock.now(), since=since)
        for executor in self.executors.values():
            await self._stop_orphans(executor, summary)
        if self.clock.monotonic() >= self._retention_due:
            await self._remove_old_jobs(summary)
        summary.slas_missed = await self.store.alerts.sla_check(now=self.clock.now())
        metrics.repairs({f.name: getattr(summary, f.name) for f in fields(summary)})
        done = (
            summary.orphans_cancelled,
            summary.forgotten,
            summary.jobs_removed,
            summary.parked,
            summary.unparked,
        )
        if summary.looked or summary.slas_missed or any(done):
            log.info("pass: %s", summary)
        return summary

    # --- repairs ---------------------------------------------------------------------------

    async def _lose_blind_of_the_dead(self, summary: Pass) -> None:
        """Blind attempts (recorded running before they were sent: an HTTP request) whose
        sender the loops table shows dead are lost now, not after recovery_grace: nothing
        will ever record their outcome. Each job gets a new attempt at once (a new fence,
        the same Idempotency-Key), not charged (store.attempts.attempt_lost_with_sender)."""
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
                    self._repaired(attempt, f"lost with its sender ({why})")

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
                self._repaired(attempt, "timed out")
                finishes.append(_failed(attempt, "timed out: ran past its deadline"))
            elif (
                _past(attempt.lease_until, now)
                or _past(attempt.last_seen_at, since)
                or attempt.state == A.LAUNCHING
            ):
                silent.append(item)
        readers = await self.store.workers.task_readers(
            pairs=[(*model.task_of(i.job.spec), i.job.queue) for i in silent], since=since
        )
        park: dict[tuple[str, int], list[int]] = defaultdict(list)
        for item in silent:
            pair = model.task_of(item.job.spec)
            if (*pair, item.job.queue) in readers:
                summary.lost += 1
                self._repaired(item.attempt, "lost: its worker went silent")
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
        if finishes:
            await self.store.attempts.finish(finishes=finishes, now=now, retry=self.retry)
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
                await self._note_unknown([item], why, summary)
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
        obs: model.Observation,
        work: _Work,
        summary: Pass,
    ) -> None:
        attempt = item.attempt
        if obs.phase is not P.ABSENT and obs.identity != _identity(attempt):
            summary.conflicts += 1
            self._repaired(attempt, "launch conflict")
            work.finishes.append(_failed(attempt, _conflict(obs, attempt)))
        elif obs.phase.finished:
            summary.completed += 1
            self._repaired(attempt, f"completed ({obs.phase})")
            work.finishes.append(store.Finish.seen(attempt.id, obs))
        elif obs.phase is P.ABSENT and _past(attempt.deadline_at, self.clock.now()):
            # Too late to launch it now, and it never ran: not the job's fault, so it costs
            # no attempt; the job gets a new one (higher fence, fresh deadline).
            summary.never_launched += 1
            self._repaired(attempt, "never launched; its job gets a new attempt, not charged")
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
            self._repaired(item.attempt, "launch conflict")
            work.finishes.append(_failed(item.attempt, f"launch conflict: {exc}"))
            return True
        if isinstance(exc, errors.LaunchRefused):  # the platform refuses it: no retry helps
            summary.conflicts += 1
            self._repaired(item.attempt, "launch refused")
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
            self._repaired(item.attempt, "adopted")
            work.adopt.append(item.attempt.id)
        elif not self._refused(item, exc, work, summary):
            await self._note_unknown(
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
            self._repaired(item.attempt, "relaunched")
            work.relaunched.append(item.attempt.id)
        elif self._refused(item, exc, work, summary):
            return
        elif item.attempt.created_at + self.t.recovery_grace <= self.clock.now():
            summary.conflicts += 1  # it never got onto the platform: give up on it
            self._repaired(item.attempt, "launch failed for good")
            work.finishes.append(_failed(item.attempt, f"launch failed past recovery_grace: {exc}"))
        else:
            await self._note_unknown([item], f"relaunch failed, will try again: {exc}", summary)

    def _repair_running(
        self, item: model.Claimed, obs: model.Observation, work: _Work, summary: Pass
    ) -> None:
        attempt, now = item.attempt, self.clock.now()
        started = attempt.started_at or attempt.created_at
        deadline = attempt.deadline_at or started + self.t.attempt_deadline
        if obs.phase is not P.ABSENT and obs.identity != _identity(attempt):
            summary.unknown += 1  # someone else's object under our name: never adopt or fail on it
            log.warning(
                "%s shows another identity (%s); leaving it", attempt.launch_name, obs.labels
            )
        elif attempt.id in self._stopping:
            # Being stopped: overdue whether its launch is still there, gone, or finished (a
            # deleted Job's pods run on in their grace): it ends once nothing of it runs.
            work.overdue.append(attempt)
        elif obs.phase.finished:
            summary.completed += 1
            self._repaired(attempt, f"completed ({obs.phase}), missed while no dispatcher watched")
            work.finishes.append(store.Finish.seen(attempt.id, obs))
        elif obs.phase is not P.ABSENT and deadline + self.t.cancel_grace <= now:
            summary.timed_out += 1  # its platform had its own stop and grace: the backstop
            self._repaired(attempt, "timed out")
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
        work.finishes += await self._lose(executor, work, summary)
        work.finishes += await self._stop_overdue(executor, work, summary)
        await self._unknown(executor, work.unknown, summary)
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
        self._noted_unknown.difference_update(
            work.adopt
            + work.relaunched
            + work.alive
            + work.never_launched
            + [f.fence for f in work.finishes]
        )

    async def _stop_overdue(
        self, executor: Executor, work: _Work, summary: Pass
    ) -> list[store.Finish]:
        """Stop attempts past their deadline, then record what the platform shows: a stop
        that did not get through records nothing (the next pass tries again), so a retry
        never runs beside a copy that is still going; one that finished in time succeeded.
        On a platform whose launches stop slowly (pods in their termination grace), an
        attempt stays running, with a `stopping` event, until nothing of it runs."""
        if not work.overdue:
            return []
        if isinstance(executor, base.StopsSlowly):
            await self._read_last_output(executor, work.overdue)
        grace = self.t.cancel_grace
        stopped = await asyncio.gather(
            *(self._stop(executor, a.launch_name, grace) for a in work.overdue)
        )
        done = [a for a, ok in zip(work.overdue, stopped, strict=True) if ok]
        try:
            seen = await executor.observe([a.launch_name for a in done])
            if isinstance(executor, base.StopsSlowly):
                done = await self._still_stopping(executor, done, work, summary)
        except errors.ExecutorError as exc:
            log.warning("%d stopped attempts: cannot look again: %s", len(done), exc)
            return []
        finishes = []
        for a in done:
            was = self._stopping.pop(a.id, None)
            obs = seen.get(a.launch_name)
            if obs is not None and obs.phase is P.SUCCEEDED and obs.exit_code in (0, None):
                finishes.append(store.Finish.seen(a.id, obs))
            else:
                output = was.output if was is not None else None
                finishes.append(dataclasses.replace(_stopped(a, was), output=output))
        return finishes

    def _forget_stopping(self, due: set[int]) -> None:
        """Forget what this process kept of attempts it was stopping that are no longer due
        for recovery (ended by a dispatcher, a cancel, or another reconciler)."""
        for fence in [f for f in self._stopping if f not in due]:
            del self._stopping[fence]

    async def _lose(self, executor: Executor, work: _Work, summary: Pass) -> list[store.Finish]:
        """Attempts absent past recovery_grace are lost, unless parts of them still run (a
        Job deleted without its pods, or while recovery did not know it was stopping them:
        a restart): those are stopped, and end lost once nothing of them runs."""
        lost = work.lost
        if lost and isinstance(executor, base.StopsSlowly):
            try:
                running = await executor.still_running([a.launch_name for a in lost])
            except errors.ExecutorError as exc:
                log.warning("%d absent attempts: cannot look for their pods: %s", len(lost), exc)
                return []
            now = self.clock.now()
            for a in lost:
                if a.launch_name in running:
                    self._stopping[a.id] = _Stopping(since=now, lost=True)
                    work.overdue.append(a)
            lost = [a for a in lost if a.launch_name not in running]
        summary.lost += len(lost)
        for a in lost:
            self._repaired(a, "lost")
        why = "lost: not on the platform past recovery_grace"
        return [store.Finish(a.id, A.LOST, None, why) for a in lost]

    async def _read_last_output(
        self, executor: base.StopsSlowly, overdue: Sequence[model.Attempt]
    ) -> None:
        """Before attempts are first stopped, what they wrote so far (a pod's log): kept,
        with the time of the stop, for the run log of their end, which comes once their pods
        have ended and it is gone."""
        now = self.clock.now()
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
            got = output if isinstance(output, model.RunLog) else None
            known = kept.get(a.id) or _Stopping(since=now)
            kept[a.id] = dataclasses.replace(known, read=True, output=got)

    async def _still_stopping(
        self,
        executor: base.StopsSlowly,
        stopped: Sequence[model.Attempt],
        work: _Work,
        summary: Pass,
    ) -> list[model.Attempt]:
        """Of attempts just stopped, those that may end now: nothing of them runs, or what
        does has had its whole grace (it is taken for stuck on a node that is gone, and
        said so). The others stay running, noted once as stopping, for the next pass."""
        running = await executor.still_running([a.launch_name for a in stopped])
        now, ending = self.clock.now(), []
        for a in stopped:
            what = running.get(a.launch_name)
            if what is None:
                ending.append(a)
                continue
            known = self._stopping.get(a.id) or _Stopping(since=now)
            if known.since + executor.stop_grace + self.t.margin <= now:
                log.warning(
                    "%s: %s still runs past its termination grace (its node may be lost);"
                    " ending the attempt anyway: stop it by hand",
                    a.launch_name,
                    what,
                )
                ending.append(a)
                continue
            work.alive.append(a.id)
            summary.stopping += 1
            self._stopping[a.id] = dataclasses.replace(known, noted=True)
            if not known.noted:
                await self.store.events.note(
                    job_id=a.job_id,
                    attempt_id=a.id,
                    state=a.state,
                    reason=f"stopping: {what} is ending (SIGTERM, then SIGKILL after its"
                    " termination grace); the attempt ends, and its job may retry, once it"
                    " is gone",
                    now=now,
                    details={"launch_name": a.launch_name, "running": what},
                )
                log.info("%s: stopping; %s is still ending", a.launch_name, what)
        return ending

    # --- the unknown state -------------------------------------------------------------------

    async def _unknown(
        self, executor: Executor, items: Sequence[tuple[model.Claimed, str]], summary: Pass
    ) -> None:
        """Apply each job's unknown-state policy: relaunch with a higher fence, or wait."""
        relaunch = [
            (item, why)
            for item, why in items
            if config.JobPolicy.read(item.job.policy).on_unknown == "fence_and_relaunch"
        ]
        relaunch_items = [item for item, _ in relaunch]
        superseded: set[int] = set()
        for why in sorted({why for _, why in relaunch}):
            superseded.update(
                await self.store.attempts.supersede(
                    fences=[item.attempt.id for item, w in relaunch if w == why],
                    now=self.clock.now(),
                    reason=f"superseded: unknown state ({why}); policy fence_and_relaunch",
                )
            )
        if superseded:
            old = [item.attempt for item, _ in relaunch if item.attempt.id in superseded]
            summary.superseded += len(old)
            for attempt in old:
                self._repaired(attempt, "superseded; its job gets a new attempt, a higher fence")
            # Best effort: fenced sinks refuse its writes whether or not this gets through.
            await asyncio.gather(
                *(self._stop(executor, a.launch_name, self.t.cancel_grace) for a in old)
            )
        # Once per silence: the store writes (and says it wrote) only an attempt whose lease
        # it has not stretched to the deadline yet. An attempt without a stored deadline
        # cannot be told apart that way, so this process remembers it instead.
        waiting = [
            (item, why if item not in relaunch_items else f"{why}; no attempts left to relaunch")
            for item, why in items
            if item.attempt.id not in superseded
            and (item.attempt.deadline_at is not None or item.attempt.id not in self._noted_unknown)
        ]
        for why in sorted({why for _, why in waiting}):
            same = {item.attempt.id: item for item, w in waiting if w == why}
            self._noted_unknown.update(same)
            written = await self.store.attempts.wait(
                fences=list(same),
                now=self.clock.now(),
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

    # --- an upgrade: launches made before the installation label ----------------------------

    async def _label_unlabelled(self, summary: Pass) -> None:
        """Give this installation's label to the launches an earlier corral made without it
        whose name and identity labels match an attempt in this store, before they are
        looked at: unlabelled, they are not this installation's to read, and would be taken
        for lost and launched again. Others (another installation's) are left alone."""
        labelled = 0
        for executor in self.executors.values():
            if isinstance(executor, base.SharesPlatform):
                labelled += await self._label_ours(executor)
        summary.labelled += labelled
        self._label_due = 0.0 if labelled else self.clock.monotonic() + LABEL_EVERY

    async def _label_ours(self, executor: base.SharesPlatform) -> int:
        try:
            found = await executor.list_unlabelled()
        except errors.ExecutorError as exc:
            log.warning("cannot list launches without the installation label: %s", exc)
            return 0
        named = {o.identity.fence: o for o in found if o.identity is not None}
        states = await self.store.attempts.states(fences=list(named)) if named else {}
        ours = [
            obs.name
            for fence, obs in named.items()
            if (st := states.get(fence)) is not None
            and st.identity == obs.identity
            and obs.name == model.launch_name(st.identity.job_id, st.identity.attempt_no)
        ]
        if not ours:
            return 0
        try:
            labelled = await executor.label(ours)
        except errors.ExecutorError as exc:
            log.warning("could not label %d launches, will try again: %s", len(ours), exc)
            return 0
        if labelled:
            log.info("labelled %d launches an earlier corral made: %s", len(labelled), labelled)
        return len(labelled)

    # --- orphans ---------------------------------------------------------------------------

    async def _stop_orphans(self, executor: Executor, summary: Pass) -> None:
        mine = {model.MANAGED_BY: model.MANAGER}
        try:
            if isinstance(executor, base.Forgets):
                managed = await executor.list_live(mine)
            else:
                managed = await executor.list_managed(mine)
        except errors.ExecutorError as exc:
            log.warning("%s: cannot list launches for orphans: %s", executor.kind, exc)
            return
        if isinstance(executor, base.Forgets):
            await self._forget_old(executor, summary)
        live = {
            o.identity.fence: o
            for o in managed
            if o.identity is not None and o.phase in (P.PENDING, P.RUNNING)
        }
        states = await self.store.attempts.states(fences=list(live))
        orphans = [
            (obs, status)
            for fence, obs in live.items()
            if (status := states.get(fence)) is not None
            and status.identity == obs.identity  # the very attempt, not a namesake fence
            and (
                status.attempt_state in model.FINAL_ATTEMPT_STATES
                or status.job_state == J.CANCELLED
            )
        ]
        await asyncio.gather(
            *(self._stop_orphan(executor, obs, st, summary) for obs, st in orphans)
        )
        if isinstance(executor, base.LeavesStrays):
            await self._stop_strays(executor, summary)

    async def _stop_strays(self, executor: base.LeavesStrays, summary: Pass) -> None:
        """Stop the parts a launch left running (pods) whose launch is gone, whatever
        their attempt's state (with no launch to observe, recovery calls it lost): a pod
        orphaned by its Job's delete must not run beside the attempt that replaces its
        own. A pod whose launch is still there goes with it: the launch is the orphan
        sweep's to stop (a Job deleted, its pods with it), never the pod alone, which
        would end the Job as failed first and leave it, finished, for its TTL."""
        try:
            strays = await executor.list_strays({model.MANAGED_BY: model.MANAGER})
        except errors.ExecutorError as exc:
            log.warning("cannot list stray pods for orphans: %s", exc)
            return
        why = "orphan pod stopped: its launch is gone"
        doomed = [s for s in strays if s.launch_gone]
        await asyncio.gather(*(self._stop_one_stray(executor, s, why, summary) for s in doomed))

    async def _stop_one_stray(
        self, executor: base.LeavesStrays, stray: base.Stray, why: str, summary: Pass
    ) -> None:
        try:
            await executor.stop_stray(stray)
        except errors.ExecutorError as exc:
            log.warning("%s: could not stop it, will try again: %s", stray.name, exc)
            return
        log.info("%s/%s (of %s): %s", stray.namespace, stray.name, stray.launch_name, why)
        summary.orphans_cancelled += 1

    async def _forget_old(self, executor: base.Forgets, summary: Pass) -> None:
        """Forget launches that finished more than the executor's retention ago, once the
        store holds their attempts as ended (never one recovery may still read)."""
        try:
            ended = await executor.list_ended(self.clock.now() - executor.retention)
        except errors.ExecutorError as exc:
            log.warning("%s: cannot list old launches: %s", executor.kind, exc)
            return
        old = {
            o.identity.fence: o
            for o in ended
            if o.identity is not None and o.labels.get(model.MANAGED_BY) == model.MANAGER
        }
        if not old:
            return
        states = await self.store.attempts.states(fences=list(old))
        names = [
            obs.name
            for fence, obs in old.items()
            if (st := states.get(fence)) is not None
            and st.identity == obs.identity
            and st.attempt_state in model.FINAL_ATTEMPT_STATES
        ]
        if names:
            try:
                await executor.forget(names)
            except errors.ExecutorError as exc:
                log.warning("%s: could not remove old launches: %s", executor.kind, exc)
                return
            summary.forgotten += len(names)
            log.info("%s: removed %d launches past their retention", executor.kind, len(names))

    async def _remove_old_jobs(self, summary: Pass) -> None:
        """Remove the jobs that finished longer than `retention.jobs` ago, with their
        attempts, events and run logs: up to REMOVE_BATCHES batches a pass, then not again
        for RETENTION_EVERY unless that was not all."""
        before = self.clock.now() - self.settings.retention.jobs
        for _ in range(REMOVE_BATCHES):
            removed = await self.store.runlogs.forget(before=before, limit=REMOVE_BATCH)
            summary.jobs_removed += removed
            if removed < REMOVE_BATCH:
                self._retention_due = self.clock.monotonic() + RETENTION_EVERY
                break
        while await self.store.alerts.forget(before=before, limit=REMOVE_BATCH) == REMOVE_BATCH:
            pass  # sent alerts go with the jobs of their age
        await self.store.workers.forget(before=before)  # what each read is kept, the lowest
        if summary.jobs_removed:
            log.info("removed %d jobs that finished before %s", summary.jobs_removed, before)

    async def _stop_orphan(
        self, executor: Executor, obs: model.Observation, status: store.Status, summary: Pass
    ) -> None:
        why = f"orphan cancelled: attempt is {status.attempt_state}, job is {status.job_state}"
        if not await self._stop(executor, obs.name, self.t.cancel_grace):
            return
        await self.store.events.note(
            job_id=status.identity.job_id,
            attempt_id=status.identity.fence,
            state=status.attempt_state,
            reason=why,
            now=self.clock.now(),
            details={"launch_name": obs.name},
        )
        log.info("%s: %s", obs.name, why)
        summary.orphans_cancelled += 1

    # --- helpers ---------------------------------------------------------------------------

    async def _stop(self, executor: Executor, name: str, grace: timedelta) -> bool:
        """Cancel `name` on its platform; False (and a log line) when that did not get through."""
        try:
            await executor.cancel(name, grace)
        except errors.ExecutorError as exc:
            log.warning("%s: could not stop it, will try again: %s", name, exc)
            return False
        return True

    async def _note_unknown(self, items: Sequence[model.Claimed], why: str, summary: Pass) -> None:
        summary.unknown += len(items)
        log.warning("%d attempts: %s", len(items), why)
        for item in items:
            if item.attempt.id in self._noted_unknown:
                continue
            self._noted_unknown.add(item.attempt.id)
            await self.store.events.note(
                job_id=item.job.id,
                attempt_id=item.attempt.id,
                state=item.attempt.state,
                reason=why,
                now=self.clock.now(),
                details={"launch_name": item.attempt.launch_name},
            )

    @staticmethod
    def _repaired(attempt: model.Attempt, what: str) -> None:
        log.info("%s (job %d, fence %d): %s", attempt.launch_name, attempt.job_id, attempt.id, what)


def _identity(attempt: model.Attempt) -> model.Identity:
    return model.Identity(attempt.job_id, attempt.attempt_no, attempt.id)


def _stopped(attempt: model.Attempt, stopping: _Stopping | None) -> store.Finish:
    """The end of an attempt recovery stopped, once nothing of it runs: timed out, or lost
    (absent past recovery_grace, its pods running on until they were stopped)."""
    if stopping is not None and stopping.lost:
        why = "lost: not on the platform past recovery_grace; its pods were stopped"
        return store.Finish(attempt.id, A.LOST, None, why)
    return _failed(attempt, "timed out: ran past its deadline, stopped by recovery")


def _failed(attempt: model.Attempt, why: str) -> store.Finish:
    """A failure recovery decided on (a timeout, a launch conflict): never the job's fault."""
    return store.Finish(attempt.id, A.FAILED, None, why, model.FailureClass.TRANSIENT)


def _past(at: datetime | None, now: datetime) -> bool:
    return at is not None and at <= now


def _conflict(obs: model.Observation, attempt: model.Attempt) -> str:
    owner = obs.identity or "something corral does not manage"
    return f"launch conflict: {attempt.launch_name} holds {owner}, not fence {attempt.id}"
