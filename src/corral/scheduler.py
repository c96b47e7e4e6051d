"""The scheduler: fires schedules at their nominal times, and queues jobs whose time came.

Any number of schedulers may run (`corral scheduler`, and `corral serve`, which runs one):
the store fences each firing (a row unique on schedule and nominal time, written with its
job and with the schedule's next nominal time by compare-and-set), so each nominal time
fires once with no leader. What a firing does is decided here, by pure functions over the
schedule and the time (`plan`), with the maths of time in `cadence`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from corral import cadence, errors, metrics, model, tenancy
from corral.clock import Clock, sleep_or_stop
from corral.executors.base import Executor
from corral.store import Store
from corral.store.schedules import Fired, Plan

log = logging.getLogger("corral.scheduler")

F = model.FiringOutcome
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
_MICROSECOND = timedelta(microseconds=1)
STUCK_BACKOFF = timedelta(minutes=1)
"""How long a schedule whose firings cannot be worked out waits before it is tried again."""
MISSED_RECORDED = 1000
"""At most this many missed (or skipped) nominal times are recorded one by one a pass; the
rest are counted on the schedule (missed_total)."""


def rule(schedule: model.Schedule | model.NewSchedule, anchor: datetime) -> cadence.When:
    """When a schedule fires, as `cadence` reads it."""
    if schedule.cron is not None:
        return cadence.Cron(schedule.cron, schedule.tz)
    assert schedule.every_seconds is not None
    return cadence.Every(schedule.every_seconds, anchor)


def first_due(
    when: cadence.When,
    *,
    now: datetime,
    anchor: datetime,
    until: datetime | None,
    recorded: datetime | None = None,
) -> datetime | None:
    """The first nominal time of a schedule made, changed or resumed at `now`: the first
    at or after both `now` and `anchor` (no firing before its start), and after `recorded`
    (the latest nominal time it recorded, never fired twice); None at or after `until`."""
    since = max(now, anchor) - timedelta(microseconds=1)
    if recorded is not None:
        since = max(since, recorded)
    return _before_until(cadence.after(when, since).at, until)


def _before_until(at: datetime, until: datetime | None) -> datetime | None:
    return None if until is not None and at >= until else at


def plan(schedule: model.Schedule, previous: model.JobState | None, now: datetime) -> Plan:
    """What firing `schedule` at `now` records: the due nominal times it fires (with their
    jobs), the ones it records as missed (catch-up) or as overlapping, and its next
    nominal time. `previous` is the state of its previous firing's job, if any. Pure."""
    when = rule(schedule, schedule.anchor)
    # Due: every nominal time from next_due (the first not recorded yet) to now.
    assert schedule.next_due is not None
    following_due = cadence.after(when, schedule.next_due).at
    window = timedelta(seconds=schedule.catchup_window_seconds)
    too_old = schedule.catchup == model.Catchup.ALL and now - schedule.next_due > window
    if following_due > now and not too_old:  # the usual case: one due, no catching up
        caught = cadence.CatchUp([schedule.next_due], [], following_due, 0, None)
        ends = {schedule.next_due: following_due}
    else:
        caught = _catch_up(schedule, when, now)
        ends = {}
    until = schedule.until
    fire_at = [t for t in caught.fire if until is None or t < until]
    missed = [t for t in caught.missed if until is None or t < until]
    fires = [
        model.Fire(t, F.MISSED, note=f"no scheduler fired it in time (catch-up {schedule.catchup})")
        for t in missed[-MISSED_RECORDED:]
    ]
    missed_count = max(0, caught.missed_count - len(fires))  # the ones not recorded one by one
    busy = previous is not None and previous not in model.FINAL_JOB_STATES
    cancel_previous = False
    if fire_at and busy and schedule.overlap == model.Overlap.FORBID:
        fires += [
            model.Fire(t, F.OVERLAP, note="the previous firing's job had not ended")
            for t in fire_at
        ]
        fire_at = []
    elif fire_at and schedule.overlap == model.Overlap.REPLACE:
        # Catching up, the latest replaces the rest: one job runs.
        fires += [
            model.Fire(t, F.OVERLAP, note="replaced by a later firing caught up in the same pass")
            for t in fire_at[:-1]
        ]
        fire_at = fire_at[-1:]
        cancel_previous = busy
    elif fire_at and schedule.overlap == model.Overlap.FORBID:
        # Catching up, one at a time: the first now, the rest would overlap it.
        fires += [
            model.Fire(t, F.OVERLAP, note="an earlier firing caught up in the same pass")
            for t in fire_at[1:]
        ]
        fire_at = fire_at[:1]
    fires += [firing(schedule, when, t, F.FIRED, end=ends.get(t)) for t in fire_at]
    fires.sort(key=lambda f: f.nominal_at)
    next_due = None if caught.next_due is None else _before_until(caught.next_due, until)
    return Plan(
        fires=fires, next_due=next_due, missed_count=missed_count, cancel_previous=cancel_previous
    )


def _catch_up(schedule: model.Schedule, when: cadence.When, now: datetime) -> cadence.CatchUp:
    assert schedule.next_due is not None
    before_next = schedule.next_due - timedelta(microseconds=1)
    return cadence.catch_up(
        when,
        before_next,
        now,
        mode=schedule.catchup.value,
        window=timedelta(seconds=schedule.catchup_window_seconds),
        max_firings=schedule.catchup_max,
        created=before_next,
    )


def refused(plan: Plan, why: str) -> Plan:
    """`plan` with each firing it would fire recorded as refused instead (`why` its note),
    creating no job: a tenant's schedule whose tenant is no longer granted its executor.
    Pure."""
    fires = [
        model.Fire(f.nominal_at, F.REFUSED, note=why) if f.outcome == F.FIRED else f
        for f in plan.fires
    ]
    return dataclasses.replace(plan, fires=fires, cancel_previous=False)


def _plan_at(
    schedule: model.Schedule,
    previous: model.JobState | None,
    *,
    now: datetime,
    refuse: Refuse,
) -> Plan:
    """`plan`, but a schedule whose firings cannot be worked out (a zone that tzdata no
    longer knows, a template that no longer builds) is left as it is and said in the log:
    it never stops the others, and is looked at again STUCK_BACKOFF later. A tenant's
    schedule fires only while `refuse` finds nothing against it (its tenant is granted its
    jobs' executor, and the names its spec uses are still its own)."""
    try:
        made = plan(schedule, previous, now)
        if schedule.tenant_made and (why := refuse(schedule)):
            return refused(made, why)
        return made
    except Exception:
        log.exception(
            "schedule %r (id %d): its firings cannot be worked out; it is left as it is",
            schedule.name,
            schedule.id,
        )
        return Plan(fires=[], next_due=now + STUCK_BACKOFF)


Refuse = Callable[[model.Schedule], str | None]
"""Why a firing of a tenant's schedule is refused now; None when it may run."""


def _not_granted(
    tenants: Mapping[str, tenancy.TenantSettings], schedule: model.Schedule
) -> str | None:
    return tenancy.refusal(tenants, schedule.tenant, tenancy.executor_of(schedule.template))


def firing(
    schedule: model.Schedule,
    when: cadence.When,
    nominal: datetime,
    outcome: model.FiringOutcome,
    *,
    end: datetime | None = None,
    overrides: Mapping[str, object] | None = None,
) -> model.Fire:
    """The firing of `schedule` at `nominal`, with the job it creates: the template's, due
    at the nominal time (plus the schedule's jitter), keyed by schedule and time, its
    payload saying which interval it is for. `overrides` change the job (a backfill's pool
    or code version). `end`: the next nominal time, when the caller knows it."""
    end = end or cadence.following(when, nominal)
    spread = timedelta(seconds=schedule.jitter_seconds)
    delay = cadence.jitter(f"{schedule.id}", nominal, spread) if spread else timedelta(0)
    payload = model.firing_payload(
        schedule.template.get("payload"), schedule=schedule.name, nominal=nominal, interval_end=end
    )
    job = model.job_from_template(
        schedule.template,
        run_at=nominal + delay,
        idempotency_key=model.firing_key(schedule.id, nominal),
        payload=payload,
        tenant_made=schedule.tenant_made,
        **(overrides or {}),
    )
    return model.Fire(nominal, outcome, job=job, note=_moved(when, nominal))


def _moved(when: cadence.When, nominal: datetime) -> str | None:
    if isinstance(when, cadence.Every):  # whole seconds: the clocks never move one
        return None
    return cadence.after(when, nominal - timedelta(microseconds=1)).moved


def backfill_fires(
    schedule: model.Schedule, start: datetime, end: datetime, **overrides: object
) -> Iterator[model.Fire]:
    """The firings `corral backfill` makes for the nominal times in [start, end), lazily."""
    when = rule(schedule, schedule.anchor)
    for nominal in cadence.between(when, start, end):
        yield firing(schedule, when, nominal.at, F.BACKFILLED, overrides=overrides)


def resume_skips(
    schedule: model.Schedule, now: datetime
) -> tuple[list[datetime], int, datetime | None]:
    """What resuming a paused schedule at `now` records: the nominal times that passed
    while it was paused (at most MISSED_RECORDED of them, and how many more there were),
    and its next nominal time. They are skipped, never fired."""
    when = rule(schedule, schedule.anchor)
    last = now if schedule.until is None else min(now, schedule.until - _MICROSECOND)
    start = schedule.next_due or now
    passed = cadence.resume(when, start - _MICROSECOND, last, limit=MISSED_RECORDED)
    skipped = passed.skipped if start <= last else []
    more = passed.skipped_count - len(passed.skipped) if start <= last else 0
    return skipped, more, first_due(when, now=now, anchor=schedule.anchor, until=schedule.until)


# --- the loop --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PassResult:
    """What one pass did, for logs and tests."""

    schedules: int
    fired: int
    recorded: int
    promoted: int


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
    ) -> None:
        """`tenants`: the settings' tenants, whose grants a tenant's schedule's firings
        are checked against (none given: every tenant has the default grant); `refuse`,
        the whole check of such a firing, if more than the grant (see
        executors.references.firing_refusal)."""
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
        """Fire everything due now; queue the scheduled jobs whose time came."""
        schedules = fired = recorded = promoted = 0
        while True:
            now = self.clock.now()
            began = self.clock.monotonic()
            limit = self._limit
            done = await self.store.schedules.fire_due(
                now=now,
                limit=limit,
                plan=functools.partial(_plan_at, now=now, refuse=self.refuse),
                ahead=self.ahead,
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
                break
        while True:
            moved = await self.store.jobs.promote_due(now=self.clock.now(), limit=self.batch)
            promoted += moved
            if moved < self.batch:
                break
        self.last_pass = PassResult(schedules, fired, recorded, promoted)
        return self.last_pass

    def _log(self, done: Fired) -> None:
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
