"""A schedule's firing history and stats as plain data: each firing with what its job came
to (a row of its history), what an hour or a day of firings came to (a Tally), which hours
are closed and may be kept counted, and the buckets of the last 24 hours and 30 days.

What counts as what, said once (the store's sums and `tally` follow it):

| a firing's job      | counts as                                                     |
| ------------------- | ------------------------------------------------------------- |
| succeeded           | succeeded                                                     |
| failed, quarantined | failed (a quarantined job failed, and waits for a person)     |
| cancelled           | cancelled: neither (a person, or overlap `replace`, stopped it) |
| any other           | pending: it has not ended yet                                 |
| gone                | pending: removed after its retention before its hour counted  |

The success rate is succeeded / (succeeded + failed), none when both are 0. A job's response
time is its final attempt's: the run log's latency (an HTTP request's) when it has one, else
the attempt's duration; an hour's mean and max are over its jobs that succeeded or failed.
Hours and days are UTC's, and a firing counts in the hour of its nominal time.

An hour is closed once it is over and every job of it has ended (succeeded, failed,
quarantined or cancelled), or SETTLE_LIMIT after its end whatever its jobs do: its tally
is then kept (the store's firing_hours) and never counted again, unless a firing is
recorded late into it (catch-up, resume, backfill), which opens it again. A job that ends
after its hour closed (past SETTLE_LIMIT, or a quarantined job retried by hand) stays as
it was counted.

Pure: no clock (`now` is given), no I/O.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from corral import model, scheduling

J, F = model.JobState, scheduling.FiringOutcome

HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
HOURS_SHOWN = 24
"""The hourly buckets of the short window: the last 24 hours, the current one last."""
DAYS_SHOWN = 30
"""The daily buckets of the long window: the last 30 days (UTC), today last."""
SETTLE_LIMIT = timedelta(hours=1)
"""How long after its end an hour waits for its jobs to end before it is closed anyway
(its jobs not ended then count as pending for good). It bounds what a view of a schedule's
stats counts from its firings, the hours from the first that is open: two at most, however
many of its jobs wait. An hour's jobs end well within it as a rule (an HTTP request's
timeout and a job's deadline are minutes, its retries too)."""

SUCCEEDED = frozenset({J.SUCCEEDED})
FAILED = frozenset({J.FAILED, J.QUARANTINED})
CANCELLED = frozenset({J.CANCELLED})
ENDS = {"succeeded": SUCCEEDED, "failed": FAILED, "cancelled": CANCELLED}
"""The counts of a Tally by the job states each counts."""
ENDED = SUCCEEDED | FAILED | CANCELLED
"""The job states an hour waits for (a quarantined job waits for a person, not for time)."""
OUTCOMES = tuple(F)
"""Every outcome of a firing, each a count of a Tally (and a column of firing_hours)."""


def hour_of(at: datetime) -> datetime:
    """The start of the UTC hour that holds `at`."""
    return at.replace(minute=0, second=0, microsecond=0)


def day_of(at: datetime) -> datetime:
    """The start of the UTC day that holds `at`."""
    return at.replace(hour=0, minute=0, second=0, microsecond=0)


def since(now: datetime) -> datetime:
    """The start of the stats' longest window: midnight, DAYS_SHOWN - 1 days ago."""
    return day_of(now) - DAY * (DAYS_SHOWN - 1)


# --- one firing ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobRun:
    """What a job came to: its state, and its final attempt's HTTP status or exit code and
    response time."""

    job_id: int
    state: model.JobState
    first_start: datetime | None = None  # when its first attempt started (see below)
    status: int | None = None  # the final attempt's HTTP status (its run log's)
    exit_code: int | None = None  # the final attempt's exit code
    latency: float | None = None  # the final attempt's run log's latency (seconds)
    started_at: datetime | None = None  # the final attempt's start and end; an attempt
    finished_at: datetime | None = None  # that ended unseen running started when launched

    @property
    def response_time(self) -> float | None:
        """The run log's latency, else the final attempt's duration (None: neither)."""
        if self.latency is not None:
            return self.latency
        if self.started_at is None or self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()


@dataclass(frozen=True, slots=True)
class FiringRow:
    """One firing and what its job came to, as its schedule's history shows it: `run` is
    None when it made no job (missed, skipped, overlap, refused) or its job is gone."""

    nominal_at: datetime
    outcome: scheduling.FiringOutcome
    job_id: int | None = None
    run: JobRun | None = None
    note: str | None = None

    @property
    def lateness(self) -> float | None:
        """Seconds from the nominal time to its job's first start (None before it starts)."""
        if self.run is None or self.run.first_start is None:
            return None
        return (self.run.first_start - self.nominal_at).total_seconds()

    @property
    def settled(self) -> bool:
        """Whether its hour need not wait for it: no job, a job gone, or one that ended."""
        return self.run is None or self.run.state in ENDED


# --- what firings came to ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Tally:
    """What some firings came to: each outcome's count, their jobs by how they ended (see
    the module's table) and the response times of those that succeeded or failed."""

    fired: int = 0
    missed: int = 0
    skipped: int = 0
    overlap: int = 0
    refused: int = 0
    backfilled: int = 0
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    latency_count: int = 0
    latency_sum: float = 0.0
    latency_max: float | None = None

    def plus(self, other: Tally) -> Tally:
        """Both tallies as one."""
        return total([self, other])

    @property
    def firings(self) -> int:
        return sum(self.outcomes().values())

    @property
    def jobs(self) -> int:
        """The firings that made a job (fired or backfilled)."""
        return self.fired + self.backfilled

    @property
    def pending(self) -> int:
        """Jobs that had not ended when counted, or were gone."""
        return max(0, self.jobs - self.succeeded - self.failed - self.cancelled)

    @property
    def success_rate(self) -> float | None:
        ended = self.succeeded + self.failed
        return self.succeeded / ended if ended else None

    @property
    def latency_mean(self) -> float | None:
        return self.latency_sum / self.latency_count if self.latency_count else None

    def outcomes(self) -> dict[str, int]:
        """Each outcome's count, by its name."""
        return {o.value: getattr(self, o.value) for o in OUTCOMES}


_SUMMED = tuple(f.name for f in dataclasses.fields(Tally) if f.name != "latency_max")
_summed = operator.attrgetter(*_SUMMED)


def total(tallies: Sequence[Tally]) -> Tally:
    """The tallies as one: their counts and sums added, the highest of their maxima."""
    if len(tallies) == 1:
        return tallies[0]
    tops = [t.latency_max for t in tallies if t.latency_max is not None]
    sums = [sum(column) for column in zip(*map(_summed, tallies), strict=True)] or [0] * len(
        _SUMMED
    )
    return Tally(**dict(zip(_SUMMED, sums, strict=True)), latency_max=max(tops) if tops else None)


def tally(rows: Iterable[FiringRow]) -> Tally:
    """What `rows` came to (the store's sums say the same in SQL)."""
    counts = dict.fromkeys((o.value for o in OUTCOMES), 0)
    ends = {"succeeded": 0, "failed": 0, "cancelled": 0}
    times: list[float] = []
    for row in rows:
        counts[row.outcome.value] += 1
        if row.run is None:
            continue
        for name, states in (
            ("succeeded", SUCCEEDED),
            ("failed", FAILED),
            ("cancelled", CANCELLED),
        ):
            if row.run.state in states:
                ends[name] += 1
        if row.run.state in SUCCEEDED | FAILED and (took := row.run.response_time) is not None:
            times.append(took)
    return Tally(
        **counts,
        **ends,
        latency_count=len(times),
        latency_sum=sum(times),
        latency_max=max(times) if times else None,
    )


EMPTY = Tally()
"""What no firing comes to."""


# --- which hours are closed ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Counted:
    """What one read of the store found of a schedule's hours from `since(now)`: the closed
    hours kept, how far they are closed (None: none yet) and at which version, and the open
    hours counted from the firings, each with whether all its jobs had ended."""

    kept: Mapping[datetime, Tally]
    counted_until: datetime | None
    version: int | None  # None: nothing kept of the schedule yet
    open: Mapping[datetime, tuple[Tally, bool]]

    def start(self, now: datetime) -> datetime:
        """The first hour counted from the firings: where closed hours end, at the
        earliest the window's start."""
        first = since(now)
        return first if self.counted_until is None else max(self.counted_until, first)


@dataclass(frozen=True, slots=True)
class Closing:
    """The hours to keep as closed, how far the hours are closed after them, and the
    version the read found (the store writes nothing if it changed meanwhile)."""

    hours: Mapping[datetime, Tally]
    counted_until: datetime
    version: int | None


def closed(hour: datetime, settled: bool, now: datetime) -> bool:
    """Whether an hour is closed at `now`: over, and its jobs all ended or SETTLE_LIMIT
    past its end."""
    end = hour + HOUR
    return end <= now and (settled or end + SETTLE_LIMIT <= now)


def closing(found: Counted, now: datetime) -> Closing | None:
    """What to keep of `found`'s open hours: those now closed, and the first hour not
    closed (the current one, or an earlier one waiting for its jobs) as how far the hours
    are closed. None when that changes nothing."""
    start = found.start(now)
    waiting = [h for h, (_, settled) in found.open.items() if not closed(h, settled, now)]
    until = min([hour_of(now), *[h for h in waiting if h >= start]])
    fresh = {
        h: t
        for h, (t, settled) in found.open.items()
        if h not in found.kept and closed(h, settled, now)
    }
    if not fresh and found.counted_until is not None and until <= found.counted_until:
        return None
    return Closing(hours=fresh, counted_until=max(until, start), version=found.version)


# --- the windows ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Span:
    """Buckets `width` long from `start`, the last one holding now, and their sum."""

    start: datetime
    width: timedelta
    buckets: list[Tally]
    total: Tally


@dataclass(frozen=True, slots=True)
class Stats:
    """A schedule's last 24 hours by hour and last 30 days by day, as of `at`."""

    at: datetime
    last_24h: Span
    last_30d: Span


def stats(found: Counted, now: datetime) -> Stats:
    """The windows of `found`: its kept hours, and its open ones counted from the firings."""
    hours = {h: t for h, (t, _) in found.open.items()}
    hours.update(found.kept)
    return Stats(
        at=now,
        last_24h=_span(hours, hour_of(now) - HOUR * (HOURS_SHOWN - 1), HOUR, HOURS_SHOWN),
        last_30d=_span(hours, since(now), DAY, DAYS_SHOWN),
    )


def _span(hours: Mapping[datetime, Tally], start: datetime, width: timedelta, count: int) -> Span:
    """`count` buckets `width` long from `start`, each the sum of the hours in it."""
    into: list[list[Tally]] = [[] for _ in range(count)]
    for hour, counted in hours.items():
        i = int((hour - start) / width) if hour >= start else -1
        if 0 <= i < count:
            into[i].append(counted)
    buckets = [total(some) if some else EMPTY for some in into]
    return Span(start=start, width=width, buckets=buckets, total=total(buckets))
