"""A schedule's firing history and stats as the store reads them: a page of its firings
with what each job came to, the last run of given jobs, and the hours of its firings
counted, kept once closed (firing_hours, firing_rollups), opened again by a late firing.

Every read is bounded by what it shows: a page of history reads its firings by (schedule,
nominal time) and the job, final attempt and run log of those only; the stats read at most
DAYS_SHOWN x 24 kept hours (by their key) and count from the firings only the hours not
closed yet (from firing_rollups.counted_until on), however many firings the schedule has.
What counts as what, and when an hour is closed, is corral.firing_stats' (pure); this module
sums in SQL as it says, and writes what it decided.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    Connection,
    Float,
    FromClause,
    Select,
    and_,
    case,
    cast,
    delete,
    func,
    literal,
    or_,
    select,
    update,
)

from corral import firing_stats, model, scheduling
from corral.firing_stats import FiringRow, JobRun, Tally
from corral.store import dialects
from corral.store.tables import (
    UTCDateTime,
    attempts,
    firing_hours,
    firing_rollups,
    firings,
    jobs,
    run_logs,
)

F, J = scheduling.FiringOutcome, model.JobState

_last = attempts.alias("last_attempt")
"""A job's final attempt (attempt_no = the job's attempt_count): one probe of its key."""
_any = attempts.alias("any_attempt")


def _with_runs(base: FromClause) -> FromClause:
    """`base` (which holds jobs) joined to each job's final attempt and that attempt's run
    log: a lookup by key each, NULL where there is none."""
    final = and_(_last.c.job_id == jobs.c.id, _last.c.attempt_no == jobs.c.attempt_count)
    return base.outerjoin(_last, final).outerjoin(run_logs, run_logs.c.attempt_id == _last.c.id)


_FIRED = _with_runs(firings.outerjoin(jobs, jobs.c.id == firings.c.job_id))
"""Firings with their jobs, final attempts and run logs."""


def _started(attempt: Any) -> Any:
    """When an attempt started: its started_at, or, for one that ended before it was
    recorded running (a quick one's launch and end are settled together), when it was made
    (claimed and launched). NULL for one not started yet."""
    launched = case((attempt.c.finished_at.is_not(None), attempt.c.created_at))
    return func.coalesce(attempt.c.started_at, launched)


def _run_columns() -> list[Any]:
    """What a JobRun is read from (after the job's id), in its fields' order."""
    first = select(func.min(_started(_any))).where(_any.c.job_id == jobs.c.id)
    return [
        jobs.c.state,
        first.scalar_subquery().label("first_start"),
        run_logs.c.status,
        _last.c.exit_code,
        run_logs.c.latency,
        _started(_last).label("started_at"),
        _last.c.finished_at,
    ]


def _run_of(job_id: int | None, values: Sequence[Any]) -> JobRun | None:
    """A JobRun of _run_columns' values (None: no job, or it is gone)."""
    state, first, status, code, latency, started, finished = values
    if job_id is None or state is None:
        return None
    return JobRun(job_id, J(state), first, status, code, latency, started, finished)


# --- history -------------------------------------------------------------------------------


def firing_page(
    conn: Connection, *, schedule_id: int, before: datetime | None, limit: int
) -> list[FiringRow]:
    """Up to `limit` firings of a schedule before `before` (None: the newest), the latest
    nominal time first, each with what its job came to: one walk of the firings' key from
    `before` down, and a lookup of each row's job, final attempt and run log."""
    f = firings.c
    stmt = (
        select(f.nominal_at, f.outcome, f.job_id, f.note, *_run_columns())
        .select_from(_FIRED)
        .where(f.schedule_id == schedule_id)
        .order_by(f.nominal_at.desc())
        .limit(limit)
    )
    if before is not None:
        stmt = stmt.where(firings.c.nominal_at < before)
    return [
        FiringRow(
            nominal_at=at,
            outcome=F(outcome),
            job_id=job_id,
            run=_run_of(job_id, rest),
            note=note,
        )
        for at, outcome, job_id, note, *rest in conn.execute(stmt)
    ]


def job_runs(conn: Connection, *, job_ids: Sequence[int]) -> dict[int, JobRun]:
    """What each job of `job_ids` came to (a job that is gone is left out)."""
    if not job_ids:
        return {}
    stmt = (
        select(jobs.c.id, *_run_columns())
        .select_from(_with_runs(jobs))
        .where(dialects.one_of(conn, jobs.c.id, list(job_ids)))
    )
    found = {}
    for job_id, *rest in conn.execute(stmt):
        if (run := _run_of(job_id, rest)) is not None:
            found[job_id] = run
    return found


# --- the hours counted ------------------------------------------------------------------------


def _seconds(conn: Connection, start: Any, end: Any) -> Any:
    """Seconds from `start` to `end` (two time columns): to the microsecond on PostgreSQL, to
    the millisecond on SQLite (julianday's own precision, rounded off the error of its
    difference)."""
    if conn.dialect.name == "postgresql":
        return func.date_part("epoch", end - start)
    return func.round((func.julianday(end) - func.julianday(start)) * 86400.0, 3)


CHUNK_FIRINGS = 1000
"""The most firings one statement of hours_counted joins to their jobs: a range past it is
counted in spans of whole hours of about that many (an hour alone may hold more)."""
ONE_STATEMENT = timedelta(hours=2)
"""A range this short is counted in one statement, its firings not counted first."""


def hours_counted(
    conn: Connection, *, schedule_id: int, start: datetime, end: datetime
) -> dict[datetime, tuple[Tally, bool]]:
    """The firings of a schedule with nominal times in [start, end) counted by hour (from
    `start`, a whole hour), each hour with whether every job of it had ended: the sums of
    firing_stats.tally, in SQL. Hours with no firing are left out.

    A long range (a busy schedule's first view: 30 days of a schedule every minute are
    43,200 firings) is counted in spans of about CHUNK_FIRINGS firings: each joins its
    firings to their jobs, final attempts and run logs by key, where one statement over
    them all is planned as scans of those whole tables (PostgreSQL: over 10 s at 1M jobs,
    past the statement timeout; in spans, 10 ms a span)."""
    spans = (
        [(start, end)] if end - start <= ONE_STATEMENT else _spans(conn, schedule_id, start, end)
    )
    found: dict[datetime, tuple[Tally, bool]] = {}
    for low, high in spans:
        found |= _hours_between(conn, schedule_id, start, low, high)
    return found


def _spans(
    conn: Connection, schedule_id: int, start: datetime, end: datetime
) -> list[tuple[datetime, datetime]]:
    """[start, end) cut at whole hours into spans of about CHUNK_FIRINGS firings each (one
    index-only read of the firings' key, counted by hour); no span where none fired."""
    bucket = dialects.bucket_of(conn, firings.c.nominal_at, start, firing_stats.HOUR)
    by_hour = conn.execute(
        select(bucket, func.count())
        .where(
            firings.c.schedule_id == schedule_id,
            firings.c.nominal_at >= start,
            firings.c.nominal_at < end,
        )
        .group_by(bucket)
        .order_by(bucket)
    ).all()
    spans: list[tuple[datetime, datetime]] = []
    low, held = None, 0
    for index, count in by_hour:
        hour = start + firing_stats.HOUR * int(index)
        if low is not None and held + count > CHUNK_FIRINGS:
            spans.append((low, hour))
            low, held = None, 0
        low, held = low or hour, held + int(count)
    if low is not None:
        spans.append((low, end))
    return spans


def _hours_between(
    conn: Connection, schedule_id: int, start: datetime, low: datetime, high: datetime
) -> dict[datetime, tuple[Tally, bool]]:
    """hours_counted of the firings in [low, high), hours counted from `start`."""
    ended = jobs.c.state.in_([s.value for s in firing_stats.SUCCEEDED | firing_stats.FAILED])
    lasted = _seconds(conn, _started(_last), _last.c.finished_at)
    took = func.coalesce(run_logs.c.latency, lasted)
    settled = or_(
        firings.c.job_id.is_(None),
        jobs.c.id.is_(None),
        jobs.c.state.in_([s.value for s in firing_stats.ENDED]),
    )
    bucket = dialects.bucket_of(conn, firings.c.nominal_at, start, firing_stats.HOUR)
    each = (
        select(
            bucket.label("bucket"),
            firings.c.outcome,
            jobs.c.state,
            case((ended, cast(took, Float))).label("took"),
            case((settled, 1), else_=0).label("settled"),
        )
        .select_from(_FIRED)
        .where(
            firings.c.schedule_id == schedule_id,
            firings.c.nominal_at >= low,
            firings.c.nominal_at < high,
        )
        .subquery()
    )
    return {
        start + firing_stats.HOUR * int(bucket): (_tally(sums), bool(all_settled))
        for bucket, *sums, all_settled in conn.execute(_sums(each))
    }


def _sums(each: Any) -> Select[Any]:
    """Each hour's sums of `each` (a firing a row), in Tally's fields' order, then whether
    all of its firings were settled."""

    def count(condition: Any) -> Any:
        return func.coalesce(func.sum(case((condition, 1), else_=0)), 0)

    def of(states: Collection[model.JobState]) -> Any:
        return count(each.c.state.in_([s.value for s in states]))

    return select(
        each.c.bucket,
        *(count(each.c.outcome == o.value) for o in firing_stats.OUTCOMES),
        of(firing_stats.SUCCEEDED),
        of(firing_stats.FAILED),
        of(firing_stats.CANCELLED),
        func.count(each.c.took),
        func.coalesce(func.sum(each.c.took), 0.0),
        func.max(each.c.took),
        func.min(each.c.settled),
    ).group_by(each.c.bucket)


def _tally(sums: Sequence[Any]) -> Tally:
    """A Tally of its fields' values in order (as _sums and firing_hours give them)."""
    *counts, latency_count, latency_sum, latency_max = sums
    outcomes = [o.value for o in firing_stats.OUTCOMES]
    ends = ("succeeded", "failed", "cancelled")
    return Tally(
        **{name: int(n) for name, n in zip((*outcomes, *ends), counts, strict=True)},
        latency_count=int(latency_count),
        latency_sum=float(latency_sum),
        latency_max=None if latency_max is None else float(latency_max),
    )


_KEPT = [
    *(firing_hours.c[o.value] for o in firing_stats.OUTCOMES),
    firing_hours.c.succeeded,
    firing_hours.c.failed,
    firing_hours.c.cancelled,
    firing_hours.c.latency_count,
    firing_hours.c.latency_sum,
    firing_hours.c.latency_max,
]
"""firing_hours' sums, in Tally's fields' order."""


def stats_read(conn: Connection, *, schedule_id: int, now: datetime) -> firing_stats.Counted:
    """A schedule's hours from firing_stats.since(now): those kept, how far they are closed
    (read first: a late firing recorded meanwhile changes its version, and a closing made
    from this read is then not written), and the rest counted from the firings up to the
    end of the current hour."""
    mark = conn.execute(
        select(firing_rollups.c.counted_until, firing_rollups.c.version).where(
            firing_rollups.c.schedule_id == schedule_id
        )
    ).first()
    first = firing_stats.since(now)
    kept = {
        hour: _tally(sums)
        for hour, *sums in conn.execute(
            select(firing_hours.c.hour, *_KEPT).where(
                firing_hours.c.schedule_id == schedule_id, firing_hours.c.hour >= first
            )
        )
    }
    found = firing_stats.Counted(
        kept=kept,
        counted_until=None if mark is None else mark.counted_until,
        version=None if mark is None else int(mark.version),
        open={},
    )
    start, end = found.start(now), firing_stats.hour_of(now) + firing_stats.HOUR
    counted = hours_counted(conn, schedule_id=schedule_id, start=start, end=end)
    opened = {h: c for h, c in counted.items() if h not in kept}
    return firing_stats.Counted(found.kept, found.counted_until, found.version, opened)


def page_read(
    conn: Connection, *, schedule_id: int, before: datetime | None, limit: int, now: datetime
) -> tuple[list[FiringRow], firing_stats.Counted]:
    """A schedule's page: a page of its firings (firing_page) and its hours (stats_read),
    on one connection."""
    rows = firing_page(conn, schedule_id=schedule_id, before=before, limit=limit)
    return rows, stats_read(conn, schedule_id=schedule_id, now=now)


def hours_close(
    conn: Connection, *, schedule_id: int, closing: firing_stats.Closing, keep_from: datetime
) -> bool:
    """Keep `closing`'s hours and how far the hours are closed, if the schedule's version
    is still the one its read found (compare-and-set: else nothing is written, and False);
    kept hours before `keep_from` are removed."""
    if closing.version is None:
        claim = dialects.insert_ignore_conflict(conn, firing_rollups, ["schedule_id"]).values(
            schedule_id=schedule_id, counted_until=closing.counted_until, version=1
        )
    else:
        claim = (
            update(firing_rollups)
            .where(
                firing_rollups.c.schedule_id == schedule_id,
                firing_rollups.c.version == closing.version,
            )
            .values(counted_until=closing.counted_until, version=firing_rollups.c.version + 1)
        )
    # RETURNING says whether the row was written (an INSERT that did nothing has no rowcount
    # on every driver).
    if conn.execute(claim.returning(firing_rollups.c.version)).first() is None:
        return False
    if closing.hours:
        rows = [_hour_row(schedule_id, h, t) for h, t in closing.hours.items()]
        keyed = dialects.upsert(conn, firing_hours)
        sums = {name: keyed.excluded[name] for name in rows[0] if name not in KEY}
        conn.execute(keyed.on_conflict_do_update(index_elements=KEY, set_=sums), rows)
    conn.execute(
        delete(firing_hours).where(
            firing_hours.c.schedule_id == schedule_id, firing_hours.c.hour < keep_from
        )
    )
    return True


KEY = ["schedule_id", "hour"]
"""firing_hours' key."""


def _hour_row(schedule_id: int, hour: datetime, counted: Tally) -> dict[str, Any]:
    return {
        "schedule_id": schedule_id,
        "hour": hour,
        **{name: getattr(counted, name) for name in (c.name for c in _KEPT)},
    }


def hours_reopen(conn: Connection, *, late: Mapping[int, Collection[datetime]]) -> None:
    """Open again the hours a firing was recorded late into (by schedule id): their kept
    rows removed, closed hours to before the first of them, the version moved on (so a
    closing read before this writes nothing). A schedule with nothing kept gets a version
    all the same, for the same reason."""
    for schedule_id, hours in late.items():
        if not hours:
            continue
        conn.execute(
            delete(firing_hours).where(
                firing_hours.c.schedule_id == schedule_id, firing_hours.c.hour.in_(list(hours))
            )
        )
        first = literal(min(hours), UTCDateTime())
        moved = dialects.upsert(conn, firing_rollups).values(
            schedule_id=schedule_id, counted_until=None, version=1
        )
        until = firing_rollups.c.counted_until
        conn.execute(
            moved.on_conflict_do_update(
                index_elements=["schedule_id"],
                set_={
                    "counted_until": case((until > first, first), else_=until),
                    "version": firing_rollups.c.version + 1,
                },
            )
        )


def late_hours(recorded: Sequence[tuple[int, datetime]], now: datetime) -> dict[int, set[datetime]]:
    """The hours before the current one that firings (schedule id, nominal time) were
    recorded into, by schedule id: those a schedule may have closed already."""
    current = firing_stats.hour_of(now)
    late: dict[int, set[datetime]] = {}
    for schedule_id, at in recorded:
        if at < current:
            late.setdefault(schedule_id, set()).add(firing_stats.hour_of(at))
    return late


def rollups_delete(conn: Connection, *, schedule_id: int) -> None:
    """Remove what is kept of a schedule's hours (with the schedule)."""
    for table in (firing_hours, firing_rollups):
        conn.execute(delete(table).where(table.c.schedule_id == schedule_id))
