"""When a schedule fires: the nominal times of a cron expression or an interval, and what a
scheduler does at `now` about the ones it has not fired yet.

Pure: no I/O and no clock. Every time is passed in and must be timezone-aware; every
nominal time comes back as a UTC instant with its wall time in the schedule's zone.

A cron expression has five fields (minute hour day-of-month month day-of-week) or is a
nickname (@hourly, @daily, @weekly, @monthly, @yearly), read as wall time in an IANA zone.
What a clock change does to it depends on its hour field:

    hour field                  skipped hour (clocks go forward)  repeated hour (clocks go back)
    fixed: numbers, lists,      fires once, at the jump           fires once, at the first of
    ranges ("30 2 * * *")       (02:30 -> 03:00), and says so     the two, and says so
    a wildcard or a step        does not fire: no real instant    fires at every real instant
    ("*/15 * * * *", "0 */2")   matches                           that matches, both passes

So a fixed time fires once a day whatever the clocks do, and an expression that counts
hours fires at real instants, never twice for one instant. cronsim (which mimics Debian
cron's DST handling) is used only to match wall times: it decides by the minute field too,
takes a step such as "0-23/2" for a fixed time, skips the second pass of a repeated half
hour (Australia/Lord_Howe) and, asked from inside a repeated hour, can answer a time before
the one it was given. Walking wall times (fixed hours) and real instants (the others) here
avoids all four.

An interval (Every) is a fixed number of seconds from an anchor and ignores clock changes.

- catch_up: what a scheduler fires at `now`, and what it records as missed, in memory
  bounded by `max_firings` however long it was away.
- resume: the firings that fell in a pause, recorded as skipped and never fired.
- jitter: a firing's offset within a spread, the same on every scheduler process.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal, TypeAlias
from zoneinfo import ZoneInfo

import cronsim

from corral import errors

CatchUpMode = Literal["none", "all"]

NICKNAMES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
CRON_FIELDS = ("minute", "hour", "day-of-month", "month", "day-of-week")

_US = timedelta(microseconds=1)
_SECOND = timedelta(seconds=1)
# Clock changes are months apart; one in every six hours is enough to find each of them.
_PROBE = timedelta(hours=6)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# --- what a schedule is ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Cron:
    """A cron expression (five fields, or a nickname such as @daily) read as wall time in
    the IANA time zone `tz`. Refused at construction (InvalidInput) when either is bad."""

    expr: str
    tz: str = "UTC"

    def __post_init__(self) -> None:
        _spec(self.expr)
        _zone(self.tz)


@dataclass(frozen=True, slots=True)
class Every:
    """A fixed interval: nominal times are anchor + k * seconds for k >= 0, whatever the
    clocks do. The anchor is kept in UTC."""

    seconds: int
    anchor: datetime

    def __post_init__(self) -> None:
        if self.seconds < 1:
            raise errors.InvalidInput(
                f"every: {self.seconds}s is shorter than 1 second, the shortest interval"
            )
        object.__setattr__(self, "anchor", _utc(self.anchor, "anchor"))

    @property
    def step(self) -> timedelta:
        return timedelta(seconds=self.seconds)


When: TypeAlias = Cron | Every


@dataclass(frozen=True, slots=True)
class Nominal:
    """One nominal time of a schedule: the instant (UTC), the same instant as wall time in
    the schedule's zone, and, when a clock change moved it off its wall time, why.

    Compare `at`, not `local`: in a repeated hour `local` carries fold=1, and Python's
    datetime never finds such a time equal to one in another zone."""

    at: datetime
    local: datetime
    moved: str | None = None


# --- reading what users write ---------------------------------------------------------------


def parse_cron(expr: str, tz: str = "UTC") -> Cron:
    """A cron expression in a zone; InvalidInput naming `cron` (with the reason) or `tz`."""
    return Cron(" ".join(expr.split()), tz)


_DURATION = re.compile(r"(?:([0-9]{1,9})d)?(?:([0-9]{1,9})h)?(?:([0-9]{1,9})m)?(?:([0-9]{1,9})s)?")
_SUBSECOND = re.compile(r"[0-9.]+(?:ms|us|µs|ns)")


def parse_duration(text: str, field: str) -> timedelta:
    """A duration in whole days, hours, minutes and seconds, in that order: "0s", "90m",
    "1h30m", "7d", or a bare number of seconds ("90"). InvalidInput naming `field` for
    anything else."""
    compact = "".join(text.split()).lower()
    if compact.isascii() and compact.isdigit():  # a bare number is seconds, everywhere
        compact += "s"
    match = _DURATION.fullmatch(compact)
    if match is None or not compact:
        reason = "is finer than a second" if _SUBSECOND.fullmatch(compact) else "is not a duration"
        raise errors.InvalidInput(
            f"{field}: {text!r} {reason}; write whole days, hours, minutes and seconds,"
            " e.g. 30s, 10m, 1h30m, 2d"
        )
    days, hours, minutes, seconds = (int(part or 0) for part in match.groups())
    try:
        return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    except OverflowError:
        raise errors.InvalidInput(f"{field}: {text!r} is too long") from None


def parse_every(text: str, anchor: datetime) -> Every:
    """An interval such as "30s", "10m", "1h30m" or "2d", anchored at `anchor`; under a
    second is refused naming `every`."""
    step = parse_duration(text, "every")
    if step < _SECOND:
        raise errors.InvalidInput(
            f"every: {text!r} is shorter than 1 second, the shortest interval"
        )
    return Every(step // _SECOND, anchor)


def parse_instant(text: str, field: str, tz: str = "UTC") -> datetime:
    """An ISO 8601 time, returned in UTC. With an offset ("2026-12-24T09:00+01:00",
    "2026-12-24T08:00Z") it is that instant; a date alone ("2026-12-24", midnight) or a time
    without an offset is wall time in `tz`, placed as a fixed cron time would be (a time the
    clocks skip is the jump, a time they repeat is the first)."""
    zone = _zone(tz)
    try:
        parsed = datetime.fromisoformat(text.strip())
    except ValueError:
        raise errors.InvalidInput(
            f"{field}: {text!r} is not an ISO 8601 time,"
            " e.g. 2026-12-24T09:00+01:00, 2026-12-24T08:00Z or 2026-12-24"
        ) from None
    if parsed.tzinfo is None:
        return _place(zone, parsed)[0]
    return parsed.astimezone(UTC)


# --- nominal times --------------------------------------------------------------------------


def after(when: When, t: datetime) -> Nominal:
    """The first nominal time strictly after `t`."""
    nominal = next(_nominals(when, _utc(t, "t")), None)
    if nominal is None:
        expr = when.expr if isinstance(when, Cron) else str(when)
        raise errors.InvalidInput(f"cron: {expr!r} has no time in the 50 years after {t}")
    return nominal


def between(when: When, start: datetime, end: datetime) -> Iterator[Nominal]:
    """The nominal times with start <= at < end, in order, one at a time."""
    start, end = _utc(start, "start"), _utc(end, "end")
    return itertools.takewhile(lambda nominal: nominal.at < end, _nominals(when, start - _US))


def following(when: When, nominal: datetime) -> datetime:
    """The nominal time after this one: where its interval ends (CORRAL_INTERVAL_END)."""
    return after(when, nominal).at


def _nominals(when: When, t: datetime) -> Iterator[Nominal]:
    """Every nominal time after `t` (UTC), in order."""
    if isinstance(when, Every):
        yield from _every(when, t)
        return
    zone = _zone(when.tz)
    spec, fixed = _spec(when.expr)
    if fixed:
        for at, moved in _wall_times(spec, zone, t):
            yield Nominal(at, at.astimezone(zone), moved)
    else:
        for at in _real_instants(spec, zone, t):
            yield Nominal(at, at.astimezone(zone))


def _every(every: Every, t: datetime) -> Iterator[Nominal]:
    at = every.anchor + _index(every, t + _US) * every.step
    while True:
        yield Nominal(at, at)
        at += every.step


def _index(every: Every, t: datetime) -> int:
    """The index k of the first nominal time at or after `t`."""
    return 0 if t <= every.anchor else -((every.anchor - t) // every.step)


def _wall_times(spec: str, zone: ZoneInfo, t: datetime) -> Iterator[tuple[datetime, str | None]]:
    """A fixed-hour expression: its matching wall times after `t`'s, each placed once (see
    `_place`), so several wall times in one skipped hour fire once, at the jump; and those
    of a repeated hour already behind `t` (which is in its second pass) not at all."""
    last = t
    for wall in cronsim.CronSim(spec, t.astimezone(zone).replace(tzinfo=None)):
        at, moved = _place(zone, wall)
        if at > last:
            yield at, moved
            last = at


def _real_instants(spec: str, zone: ZoneInfo, t: datetime) -> Iterator[datetime]:
    """An expression that counts hours: the real instants after `t` whose wall time matches.
    Each stretch of one UTC offset is walked as its own wall times, so a repeated hour is
    walked twice and a skipped one not at all."""
    floor, start, offset = t, t, _offset(zone, t)
    while True:
        for wall in cronsim.CronSim(spec, (floor + offset).replace(tzinfo=None)):
            at = (wall - offset).replace(tzinfo=UTC)
            change = _change(zone, start, at, offset)
            if change is not None:  # the offset changed first: walk on from there
                floor, start, offset = change - _US, change, _offset(zone, change)
                break
            yield at
            floor = start = at
        else:
            return  # cronsim found no match in 50 years


def _place(zone: ZoneInfo, wall: datetime) -> tuple[datetime, str | None]:
    """The instant a wall time stands for, and why a clock change moved it: a wall time the
    clocks skip is placed at the jump, one they repeat at its first occurrence."""
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    second = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    if first == second:
        return first, None
    early, late = min(first, second), max(first, second)
    clock, day = _clock(wall), wall.date().isoformat()
    if early.astimezone(zone).replace(tzinfo=None) == wall:
        return early, f"{clock} happens twice on {day} (clocks went back): fired at the first"
    jump = _change(zone, early, late, _offset(zone, early)) or late
    moved = f"{clock} does not exist on {day} (clocks went forward)"
    return jump, f"{moved}: fired at {_clock(jump.astimezone(zone))}"


def _clock(t: datetime) -> str:
    return t.strftime("%H:%M:%S" if t.second else "%H:%M")


def _offset(zone: ZoneInfo, at: datetime) -> timedelta:
    return at.astimezone(zone).utcoffset() or timedelta(0)


def _change(zone: ZoneInfo, lo: datetime, hi: datetime, offset: timedelta) -> datetime | None:
    """The first instant in (lo, hi] whose UTC offset is not `offset` (the one at `lo`)."""
    while lo < hi:
        probe = min(lo + _PROBE, hi)
        if _offset(zone, probe) != offset:
            while probe - lo > _US:  # bisect down to the microsecond
                mid = lo + (probe - lo) // 2
                lo, probe = (mid, probe) if _offset(zone, mid) == offset else (lo, mid)
            return probe
        lo = probe
    return None


@functools.lru_cache(maxsize=1024)
def _spec(expr: str) -> tuple[str, bool]:
    """A cron expression's five fields as cronsim reads them, and whether its hour field is
    fixed (no wildcard, no step); InvalidInput naming `cron` when it is not one."""
    text = NICKNAMES.get(expr.strip().lower(), expr)
    fields = text.split()
    if len(fields) != len(CRON_FIELDS):
        raise errors.InvalidInput(
            f"cron: {expr!r} is not a valid cron expression ({len(fields)} field"
            f"{'' if len(fields) == 1 else 's'}; it needs"
            f" {len(CRON_FIELDS)}: {' '.join(CRON_FIELDS)}, e.g. '30 2 * * *',"
            f" or one of {', '.join(NICKNAMES)})"
        )
    try:
        cronsim.CronSim(text, _EPOCH.replace(tzinfo=None))
    except (cronsim.CronSimError, ValueError) as exc:
        raise errors.InvalidInput(
            f"cron: {expr!r} is not a valid cron expression ({str(exc).lower() or 'unreadable'})"
        ) from None
    return text, not any(sign in fields[1] for sign in "*/")


@functools.lru_cache(maxsize=256)
def _zone(tz: str) -> ZoneInfo:
    """The IANA zone `tz`; InvalidInput naming `tz` when there is none by that name."""
    try:
        if tz == "localtime":  # this machine's zone, whatever it is: not a schedule's
            raise ValueError(tz)
        return ZoneInfo(tz)
    except (ValueError, KeyError, OSError):
        raise errors.InvalidInput(
            f"tz: {tz!r} is not a known time zone; use an IANA name such as 'Europe/Berlin'"
            " or 'UTC'"
        ) from None


def _utc(t: datetime, field: str) -> datetime:
    if t.tzinfo is None or t.utcoffset() is None:
        raise errors.InvalidInput(f"{field}: {t.isoformat()} must carry a timezone")
    return t.astimezone(UTC)


# --- what a scheduler does about them -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CatchUp:
    """What a scheduler does at `now` for one schedule.

    `fire`: the nominal times to fire now, oldest first. `missed`: the latest of the due
    times it does not fire (at most `max_firings` of them, oldest first), out of
    `missed_count` in all, the first of which is `first_missed`. `next_due`: the first
    nominal time after now."""

    fire: list[datetime]
    missed: list[datetime]
    next_due: datetime
    missed_count: int
    first_missed: datetime | None


def catch_up(
    when: When,
    last: datetime | None,
    now: datetime,
    *,
    mode: CatchUpMode,
    window: timedelta,
    max_firings: int,
    created: datetime,
) -> CatchUp:
    """What a scheduler does at `now` for a schedule whose last recorded firing is `last`
    (None: it never fired, so times count from `created`, never before it).

    The due times are last < at <= now. Mode "none" fires only the latest and records the
    others as missed; mode "all" fires those within `window` back from now, at most
    `max_firings` (the latest ones), and records the rest as missed. However many are due,
    this walks them once and keeps at most 2 * max_firings of them."""
    now, created = _utc(now, "now"), _utc(created, "created")
    _check_catch_up(mode, window, max_firings)
    start = created if last is None else max(_utc(last, "last") + _US, created)
    keep = 1 if mode == "none" else max_firings
    due = _tail(when, start, now + _US, keep + max_firings)
    cutoff = start if mode == "none" else now - window
    fire = [at for at in due.last[-keep:] if at >= cutoff]
    missed = due.last[: len(due.last) - len(fire)][-max_firings:]
    missed_count = due.count - len(fire)
    next_due = after(when, max(now, created - _US)).at
    return CatchUp(fire, missed, next_due, missed_count, due.first if missed_count else None)


def _check_catch_up(mode: str, window: timedelta, max_firings: int) -> None:
    if mode not in ("none", "all"):
        raise errors.InvalidInput(f"catch_up: {mode!r} is not a catch-up mode; use none or all")
    if window < timedelta(0):
        raise errors.InvalidInput(f"window: {window} must not be negative")
    if max_firings < 1:
        raise errors.InvalidInput(f"max_firings: {max_firings} must be at least 1")


@dataclass(frozen=True, slots=True)
class Resume:
    """What resuming a paused schedule does: the nominal times that fell in the pause are
    skipped, recorded and never fired. `skipped`: the latest of them (at most `limit`,
    oldest first) out of `skipped_count`; recording them makes the latest the schedule's
    last firing, so catch_up after the resume does not fire them. `next_due`: the first
    nominal time after the resume."""

    skipped: list[datetime]
    skipped_count: int
    next_due: datetime


def resume(when: When, paused_at: datetime, resumed_at: datetime, *, limit: int = 100) -> Resume:
    """The firings skipped by a pause from `paused_at` to `resumed_at` (paused_at < at <=
    resumed_at), and when the schedule is next due."""
    paused_at, resumed_at = _utc(paused_at, "paused_at"), _utc(resumed_at, "resumed_at")
    if limit < 1:
        raise errors.InvalidInput(f"limit: {limit} must be at least 1")
    skipped = _tail(when, paused_at + _US, resumed_at + _US, limit)
    return Resume(skipped.last, skipped.count, after(when, resumed_at).at)


@dataclass(frozen=True, slots=True)
class _Tail:
    count: int
    first: datetime | None
    last: list[datetime]


def _tail(when: When, start: datetime, end: datetime, n: int) -> _Tail:
    """How many nominal times lie in [start, end), the first, and the last `n` of them in
    order, in memory bounded by `n`: an interval by arithmetic, a cron expression by one walk."""
    if isinstance(when, Every):
        lo, hi = _index(when, start), _index(when, end)
        first = when.anchor + lo * when.step if lo < hi else None
        times = [when.anchor + k * when.step for k in range(max(lo, hi - n), hi)]
        return _Tail(max(hi - lo, 0), first, times)
    count, first, last = 0, None, collections.deque[datetime](maxlen=n)
    for nominal in between(when, start, end):
        count, first = count + 1, first or nominal.at
        last.append(nominal.at)
    return _Tail(count, first, list(last))


def jitter(key: str, nominal: datetime, spread: timedelta) -> timedelta:
    """A firing's offset in [0, spread), from a hash of `key` and the nominal instant: the
    same on every scheduler process, different across schedules that share a time."""
    if spread < timedelta(0):
        raise errors.InvalidInput(f"jitter: {spread} must not be negative")
    span = spread // _US
    if span == 0:
        return timedelta(0)
    micros = (_utc(nominal, "nominal") - _EPOCH) // _US
    digest = hashlib.sha256(f"{key}\x1f{micros}".encode()).digest()
    return timedelta(microseconds=int.from_bytes(digest[:16], "big") % span)
