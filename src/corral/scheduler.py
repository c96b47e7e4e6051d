"""The scheduler: fires schedules at their nominal times, and queues jobs whose time came.

Any number of schedulers may run (`corral scheduler`, and `corral serve`, which runs one):
the store fences each firing (a row unique on schedule and nominal time, written with its
job and with the schedule's next nominal time by compare-and-set), so each nominal time
fires once with no leader. What a firing does is decided by pure functions over the
schedule and the time (`planning.plan`), with the maths of time in `cadence`; this module
runs them against the store, with the grants of tenants, and makes a backfill's firings.
A tenant's schedule's firings are the tenant's jobs: the store refuses those past its
max_queued or its submit_rate (each firing takes a token, as a submit's job does).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from corral import errors, metrics, model, monitor_judge, planning, scheduling, tenancy
from corral.clock import Clock, sleep_or_stop
from corral.executors.base import Executor
from corral.store import Store

log = logging.getLogger("corral.scheduler")

F = scheduling.FiringOutcome
BATCH = 500
"""Schedules fired in one transaction: big enough that 10,000 due at once take a few
transactions, small enough that one holds its locks briefly."""
SLOW_BATCH = 2.0
"""Seconds: a batch slower than this halves the next one."""
POLL = 1.0
"""The longest the scheduler sleeps (seconds): how soon it sees a schedule made or changed
elsewhere whose first time is nearer than anything it knew of."""
AHEAD = timedelta(seconds=5)
"""How long before its nominal time a schedule whose overlap is `allow` fires: its job
waits in the queue for the nominal time, so a burst due at one instant (10,000 schedules
every minute) is all claimable at that instant, not as fast as one scheduler can write it."""
STUCK_BACKOFF = timedelta(minutes=1)
"""How long a schedule whose firings cannot be worked out waits before it is tried again."""


def _plan_at(
    schedule: scheduling.Schedule,
    previous: model.JobState | None,
    *,
    now: datetime,
    refuse: Refuse,
) -> planning.Plan:
    """`planning.plan`, but a schedule whose firings cannot be worked out (a zone that tzdata no
    longer knows, a template that no longer builds) is left as it is and said in the log:
    it never stops the others, and is looked at again STUCK_BACKOFF later. A tenant's
    schedule fires only while `refuse` finds nothing against it (its tenant is granted its
    jobs' executor, and the names its spec uses are still its own)."""
    try:
        made = planning.plan(schedule, previous, now)
        if schedule.tenant_made and (why := refuse(schedule)):
            return planning.refused(made, why)
        return made
    except Exception:
        log.exception(
            "schedule %r (id %d): its firings cannot be worked out; it is left as it is",
            schedule.name,
            schedule.id,
        )
        return planning.Plan(fires=[], next_due=now + STUCK_BACKOFF)


Refuse = Callable[[scheduling.Schedule], str | None]
"""Why a firing of a tenant's schedule is refused now; None when it may run."""


def _not_granted(
    tenants: Mapping[str, tenancy.TenantSettings], schedule: scheduling.Schedule
) -> str | None:
    return tenancy.refusal(tenants, schedule.tenant, tenancy.executor_of(schedule.template))


# --- the loop --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PassResult:
    """What one pass did, for logs and tests."""

    schedules: int
    fired: int
    recorded: int
    promoted: int
    judged: int = 0  # monitors whose check time came


class Scheduler:
    """The loop: each pass fires the due schedules (BATCH per transaction, until none is
    due) and queues the jobs whose time came; then it sleeps until the next thing is due,
    at most POLL."""

    def __init__(
        self,
        *,
        store: Store,
        clock: Clock,
        executors: Mapping[str, Executor] | None = None,
        cancel_grace: timedelta = timedelta(seconds=10),
        batch: int = BATCH,
        poll: float = POLL,
        ahead: timedelta = AHEAD,
        tenants: Mapping[str, tenancy.TenantSettings] | None = None,
        refuse: Refuse | None = None,
        loop_id: str | None = None,
        heartbeat: timedelta = timedelta(seconds=20),
    ) -> None:
        """`tenants`: the settings' tenants, whose grants and quotas a tenant's schedule's
        firings are checked against (none given: every tenant has the defaults); `refuse`,
        the whole check of such a firing, if more than the grant (see
        executors.references.firing_refusal); `loop_id` and `heartbeat`: this process's row
        in the loops table and its beat, which the judge of monitors notes with each pass
        and judges the row of the process that judged before it by (corral.monitor_judge)."""
        self.store = store
        self.clock = clock
        self.executors = executors or {}
        self.cancel_grace = cancel_grace
        self.batch = batch
        self.poll = poll
        self.ahead = ahead
        self.tenants = tenants or {}
        self.refuse = refuse or functools.partial(_not_granted, self.tenants)
        self._limit = batch
        self.last_pass: PassResult | None = None
        self.judge = monitor_judge.Judge(
            store=store, clock=clock, loop_id=loop_id, heartbeat=heartbeat
        )

    async def run(self, stop: asyncio.Event, on_pass: Callable[[], None] | None = None) -> None:
        while not stop.is_set():
            try:
                await self.pass_once()
                if on_pass is not None:
                    on_pass()
            except errors.StoreError as exc:
                log.warning("a scheduler pass failed: %s; trying again", exc)
                if await sleep_or_stop(self.clock, stop, self.poll):
                    return
                continue
            except Exception:  # a bug must not stop every schedule for good
                log.exception("a scheduler pass failed; trying again")
                if await sleep_or_stop(self.clock, stop, self.poll):
                    return
                continue
            wake = None
            try:
                wake = await self.store.schedules.next_wake(ahead=self.ahead)
            except errors.StoreError as exc:
                log.warning("the scheduler could not read what is due next: %s", exc)
            wait = self.poll
            if wake is not None:
                wait = min(self.poll, max(0.0, (wake - self.clock.now()).total_seconds()))
            if await sleep_or_stop(self.clock, stop, wait):
                return

    async def pass_once(self) -> PassResult:
        """Fire everything due now and queue the scheduled jobs whose time came; then judge
        the monitors whose check time came, even when firing failed (its error is raised
        after): monitors are judged whatever the schedules do."""
        try:
            schedules, fired, recorded = await self._fire_all()
            promoted = await self._promote()
        except Exception:
            await self._judge_anyway()
            raise
        judged = await self.judge.pass_once()
        self.last_pass = PassResult(schedules, fired, recorded, promoted, judged)
        return self.last_pass

    async def _judge_anyway(self) -> None:
        """Judge the monitors in a pass whose firing failed; a failure of the judge too is
        said in the log, and the firing's error is the one the pass raises."""
        try:
            await self.judge.pass_once()
        except Exception:
            log.exception("monitors could not be judged in this pass either; trying again")

    async def _fire_all(self) -> tuple[int, int, int]:
        """Fire everything due now, a batch at a time: the schedules, firings recorded and
        jobs fired."""
        schedules = fired = recorded = 0
        while True:
            now = self.clock.now()
            began = self.clock.monotonic()
            limit = self._limit
            done = await self.store.schedules.fire_due(
                now=now,
                limit=limit,
                plan=functools.partial(_plan_at, now=now, refuse=self.refuse),
                ahead=self.ahead,
                tenants=self.tenants,
            )
            # A batch that took long (catching up after an outage walks many missed times)
            # halves the next one, so no transaction outlives the database's limits; a
            # quick one lets it grow back.
            spent = self.clock.monotonic() - began
            if spent > SLOW_BATCH:
                self._limit = max(1, limit // 2)
            elif spent < SLOW_BATCH / 4:
                self._limit = min(self.batch, limit * 2)
            schedules += done.schedules
            recorded += len(done.firings)
            fired += sum(1 for f in done.firings if f.job_id is not None)
            self._log(done)
            for f in done.firings:  # ahead of its time (overlap allow) counts as on time
                if f.outcome == F.FIRED:
                    metrics.LATENESS.observe(max(f.lateness_seconds, 0.0))
            await self._stop_replaced(done.cancelled)
            if done.schedules < limit:
                return schedules, fired, recorded

    async def _promote(self) -> int:
        """Queue the scheduled jobs whose time came, a batch at a time: how many."""
        promoted = 0
        while True:
            moved = await self.store.jobs.promote_due(now=self.clock.now(), limit=self.batch)
            promoted += moved
            if moved < self.batch:
                return promoted

    def _log(self, done: planning.Fired) -> None:
        for f in done.firings:
            if f.outcome == F.FIRED:
                log.info(
                    "schedule %d fired %s as job %s (%.3f s late)%s",
                    f.schedule_id,
                    model.iso(f.nominal_at),
                    f.job_id,
                    f.lateness_seconds,
                    f"; {f.note}" if f.note else "",
                )
            else:
                log.info(
                    "schedule %d: %s %s: %s",
                    f.schedule_id,
                    model.iso(f.nominal_at),
                    f.outcome,
                    f.note,
                )

    async def _stop_replaced(self, cancelled: Sequence[model.Attempt]) -> None:
        """Stop on their platforms the attempts of jobs a newer firing replaced (overlap
        replace); one it cannot reach stays cancelled in the store, and the reconciler
        stops it as an orphan."""
        for attempt in cancelled:
            executor = self.executors.get(attempt.executor)
            if executor is None:
                continue
            try:
                await executor.cancel(attempt.launch_name, self.cancel_grace)
            except errors.ExecutorError as exc:
                log.warning(
                    "job %d: %s, replaced by a newer firing, could not be stopped now (%s);"
                    " the reconciler stops it",
                    attempt.job_id,
                    attempt.launch_name,
                    exc,
                )
