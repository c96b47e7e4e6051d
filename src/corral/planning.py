"""The firing plan: what firing a schedule now records, as pure values beside `cadence`.

A due schedule's plan says which nominal times fire (with the jobs they create), which are
recorded as missed (catch-up) or as overlapping its previous firing's job, and where its
next nominal time is. Everything here is a pure function of the schedule, the state of its
previous firing's job and the time it is given: no clock, no settings, no I/O. The
scheduler (corral.scheduler) writes the plan through the store's fenced firing, and the
client services ask the same functions what a new, changed or resumed schedule does.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from corral import cadence, model, scheduling

F = scheduling.FiringOutcome
_MICROSECOND = timedelta(microseconds=1)
MISSED_RECORDED = 1000
"""At most this many missed (or skipped) nominal times are recorded one by one a pass; the
rest are counted on the schedule (missed_total)."""


@dataclass(frozen=True, slots=True)
class Plan:
    """What the scheduler decided for one due schedule: the nominal times to record (and
    the jobs to create), where its next nominal time is, and whether to cancel the job of
    its previous firing first (overlap `replace`)."""

    fires: Sequence[scheduling.Fire]
    next_due: datetime | None
    missed_count: int = 0  # missed times not in `fires` (too many to record one by one)
    cancel_previous: bool = False


@dataclass(slots=True)
class Fired:
    """What one pass of the scheduler did."""

    schedules: int = 0  # schedules it moved on
    firings: list[scheduling.Firing] = field(default_factory=list)
    cancelled: list[model.Attempt] = field(default_factory=list)  # to stop on their platform
    promoted: int = 0  # jobs moved from scheduled to queued


def rule(schedule: scheduling.Schedule | scheduling.NewSchedule, anchor: datetime) -> cadence.When:
    """When a schedule fires, as `cadence` reads it."""
    return _rule(schedule.cron, schedule.tz, schedule.every_seconds, anchor)


def _rule(cron: str | None, tz: str, every_seconds: int | None, anchor: datetime) -> cadence.When:
    if cron is not None:
        return cadence.Cron(cron, tz)
    assert every_seconds is not None
    return cadence.Every(every_seconds, anchor)


UPCOMING_KEPT = 8192
"""Schedules whose next nominal times are kept (see `upcoming`): a dashboard's lists."""
_FAR = timedelta(days=30 * 366)


def upcoming(schedule: scheduling.Schedule, count: int) -> tuple[cadence.Nominal, ...]:
    """A schedule's next `count` nominal times from its next due one, before its `until`
    (none while it is paused or over), marking those a DST change moved."""
    if schedule.next_due is None or schedule.paused_at is not None:
        return ()
    return _upcoming(
        schedule.cron,
        schedule.tz,
        schedule.every_seconds,
        schedule.anchor,
        schedule.next_due,
        schedule.until,
        count,
    )


@functools.lru_cache(maxsize=UPCOMING_KEPT)
def _upcoming(
    cron: str | None,
    tz: str,
    every_seconds: int | None,
    anchor: datetime,
    next_due: datetime,
    until: datetime | None,
    count: int,
) -> tuple[cadence.Nominal, ...]:
    """Kept by all it depends on: a page lists the same ones again until the schedule
    fires, and a cron's next times cost more to find than the page's SQL does to read."""
    end = next_due + _FAR if until is None else min(until, next_due + _FAR)
    when = _rule(cron, tz, every_seconds, anchor)
    return tuple(itertools.islice(cadence.between(when, next_due, end), count))


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


def plan(schedule: scheduling.Schedule, previous: model.JobState | None, now: datetime) -> Plan:
    """What firing `schedule` at `now` records: the due nominal times it fires (with their
    jobs), the ones it records as missed (catch-up) or as overlapping, and its next
    nominal time. `previous` is the state of its previous firing's job, if any. Pure."""
    when = rule(schedule, schedule.anchor)
    caught, ends = _due(schedule, when, now)
    until = schedule.until
    fire_at = [t for t in caught.fire if until is None or t < until]
    missed = [t for t in caught.missed if until is None or t < until]
    fires = [
        scheduling.Fire(
            t, F.MISSED, note=f"no scheduler fired it in time (catch-up {schedule.catchup})"
        )
        for t in missed[-MISSED_RECORDED:]
    ]
    missed_count = max(0, caught.missed_count - len(fires))  # the ones not recorded one by one
    busy = previous is not None and previous not in model.FINAL_JOB_STATES
    overlapping, fire_at, cancel_previous = _overlap(schedule, fire_at, busy=busy)
    fires += overlapping
    fires += [firing(schedule, when, t, F.FIRED, end=ends.get(t)) for t in fire_at]
    fires.sort(key=lambda f: f.nominal_at)
    next_due = None if caught.next_due is None else _before_until(caught.next_due, until)
    return Plan(
        fires=fires, next_due=next_due, missed_count=missed_count, cancel_previous=cancel_previous
    )


def _due(
    schedule: scheduling.Schedule, when: cadence.When, now: datetime
) -> tuple[cadence.CatchUp, dict[datetime, datetime]]:
    """Every nominal time from next_due (the first not recorded yet) to `now`, as catch-up
    sorts them; and, in the usual case of one due with no catching up, where its interval
    ends (the next nominal time, known already)."""
    assert schedule.next_due is not None
    following_due = cadence.after(when, schedule.next_due).at
    window = timedelta(seconds=schedule.catchup_window_seconds)
    too_old = schedule.catchup == scheduling.Catchup.ALL and now - schedule.next_due > window
    if following_due > now and not too_old:
        caught = cadence.CatchUp([schedule.next_due], [], following_due, 0, None)
        return caught, {schedule.next_due: following_due}
    return _catch_up(schedule, when, now), {}


def _overlap(
    schedule: scheduling.Schedule, fire_at: list[datetime], *, busy: bool
) -> tuple[list[scheduling.Fire], list[datetime], bool]:
    """The schedule's overlap rule applied to the times due to fire: those recorded as
    overlapping instead, those that fire, and whether the previous firing's job (`busy`:
    not ended) is cancelled first."""
    if not fire_at:
        return [], fire_at, False
    if busy and schedule.overlap == scheduling.Overlap.FORBID:
        note = "the previous firing's job had not ended"
        return [scheduling.Fire(t, F.OVERLAP, note=note) for t in fire_at], [], False
    if schedule.overlap == scheduling.Overlap.REPLACE:
        # Catching up, the latest replaces the rest: one job runs.
        note = "replaced by a later firing caught up in the same pass"
        return [scheduling.Fire(t, F.OVERLAP, note=note) for t in fire_at[:-1]], fire_at[-1:], busy
    if schedule.overlap == scheduling.Overlap.FORBID:
        # Catching up, one at a time: the first now, the rest would overlap it.
        note = "an earlier firing caught up in the same pass"
        return [scheduling.Fire(t, F.OVERLAP, note=note) for t in fire_at[1:]], fire_at[:1], False
    return [], fire_at, False


def _catch_up(schedule: scheduling.Schedule, when: cadence.When, now: datetime) -> cadence.CatchUp:
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
        scheduling.Fire(f.nominal_at, F.REFUSED, note=why) if f.outcome == F.FIRED else f
        for f in plan.fires
    ]
    return dataclasses.replace(plan, fires=fires, cancel_previous=False)


def firing(
    schedule: scheduling.Schedule,
    when: cadence.When,
    nominal: datetime,
    outcome: scheduling.FiringOutcome,
    *,
    end: datetime | None = None,
    overrides: Mapping[str, object] | None = None,
) -> scheduling.Fire:
    """The firing of `schedule` at `nominal`, with the job it creates: the template's, due
    at the nominal time (plus the schedule's jitter), keyed by schedule and time, its
    payload saying which interval it is for. `overrides` change the job (a backfill's pool
    or code version). `end`: the next nominal time, when the caller knows it."""
    end = end or cadence.following(when, nominal)
    spread = timedelta(seconds=schedule.jitter_seconds)
    delay = cadence.jitter(f"{schedule.id}", nominal, spread) if spread else timedelta(0)
    payload = scheduling.firing_payload(
        schedule.template.get("payload"), schedule=schedule.name, nominal=nominal, interval_end=end
    )
    job = scheduling.job_from_template(
        schedule.template,
        run_at=nominal + delay,
        idempotency_key=scheduling.firing_key(schedule.id, nominal),
        payload=payload,
        tenant_made=schedule.tenant_made,
        **(overrides or {}),
    )
    return scheduling.Fire(nominal, outcome, job=job, note=_moved(when, nominal))


def _moved(when: cadence.When, nominal: datetime) -> str | None:
    if isinstance(when, cadence.Every):  # whole seconds: the clocks never move one
        return None
    return cadence.after(when, nominal - timedelta(microseconds=1)).moved


def resume_skips(
    schedule: scheduling.Schedule, now: datetime
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


def backfill_fires(
    schedule: scheduling.Schedule, start: datetime, end: datetime, **overrides: object
) -> Iterator[scheduling.Fire]:
    """The firings `corral backfill` makes for the nominal times in [start, end), lazily."""
    when = rule(schedule, schedule.anchor)
    for nominal in cadence.between(when, start, end):
        yield firing(
            schedule, when, nominal.at, scheduling.FiringOutcome.BACKFILLED, overrides=overrides
        )
