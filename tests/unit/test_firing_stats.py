"""The bucket maths of a schedule's stats (corral.firing_stats), pure: what counts as what,
which hours are closed and how far, the 24-hour and 30-day windows; and the line of
response times beneath a chart's bars (web/charts.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from corral import firing_stats, model, scheduling
from corral.firing_stats import Counted, FiringRow, JobRun, Tally
from corral.web import charts

F, J = scheduling.FiringOutcome, model.JobState
NOW = datetime(2026, 3, 10, 14, 25, 7, tzinfo=UTC)
HOUR = timedelta(hours=1)
NOON = datetime(2026, 3, 10, 12, tzinfo=UTC)


def row(at: datetime, state: J | None, outcome: F = F.FIRED, **run: object) -> FiringRow:
    job = JobRun(job_id=1, state=state, **run) if state is not None else None  # type: ignore[arg-type]
    return FiringRow(nominal_at=at, outcome=outcome, job_id=1 if state else None, run=job)


def test_each_job_counts_as_the_table_says() -> None:
    started = NOON + timedelta(seconds=3)
    rows = [
        row(NOON, J.SUCCEEDED, latency=0.5, status=200),
        row(NOON, J.FAILED, started_at=started, finished_at=started + timedelta(seconds=2)),
        row(NOON, J.QUARANTINED, exit_code=3),
        row(NOON, J.CANCELLED, latency=9.0),  # cancelled: no response time counted
        row(NOON, J.RUNNING),
        row(NOON, None, F.MISSED),
        FiringRow(NOON, F.BACKFILLED, job_id=7, run=None),  # its job is gone
    ]
    counted = firing_stats.tally(rows)
    assert (counted.fired, counted.missed, counted.backfilled, counted.firings) == (5, 1, 1, 7)
    assert (counted.succeeded, counted.failed, counted.cancelled, counted.pending) == (1, 2, 1, 2)
    assert counted.success_rate == 1 / 3
    assert (counted.latency_count, counted.latency_sum, counted.latency_max) == (2, 2.5, 2.0)
    assert counted.latency_mean == 1.25
    assert Tally().success_rate is None
    assert Tally().latency_mean is None


def test_lateness_is_the_first_start_after_the_nominal_time() -> None:
    late = row(NOON, J.SUCCEEDED, first_start=NOON + timedelta(seconds=1.5))
    assert late.lateness == 1.5
    assert row(NOON, J.QUEUED).lateness is None
    assert row(NOON, None, F.SKIPPED).lateness is None


def test_two_tallies_add_up_and_keep_the_higher_max() -> None:
    one = Tally(fired=1, succeeded=1, latency_count=1, latency_sum=1.0, latency_max=1.0)
    assert one.plus(Tally()) == one
    both = one.plus(Tally(fired=2, failed=2, latency_count=2, latency_sum=5.0, latency_max=4.0))
    assert (both.fired, both.succeeded, both.failed, both.latency_max) == (3, 1, 2, 4.0)


def counted(
    open_: dict[datetime, tuple[Tally, bool]],
    until: datetime | None = None,
    kept: dict[datetime, Tally] | None = None,
    version: int | None = 4,
) -> Counted:
    return Counted(kept=kept or {}, counted_until=until, version=version, open=open_)


def test_an_hour_closes_when_it_is_over_and_its_jobs_ended() -> None:
    eleven, one = NOON - HOUR, NOON + HOUR
    found = counted(
        {eleven: (Tally(fired=1), True), NOON: (Tally(fired=2), True), one: (Tally(), False)},
        until=eleven,
    )
    closing = firing_stats.closing(found, NOW)
    assert closing is not None
    assert set(closing.hours) == {eleven, NOON}  # 13:00 waits for a job (till 15:00)
    assert closing.counted_until == one  # the first hour still open
    assert closing.version == 4
    current = counted({firing_stats.hour_of(NOW): (Tally(fired=1), True)}, until=NOW - 11 * HOUR)
    moved = firing_stats.closing(current, NOW)
    assert moved is not None
    assert moved.hours == {}  # the current hour is never closed
    assert moved.counted_until == datetime(2026, 3, 10, 14, tzinfo=UTC)


def test_an_hour_waits_no_longer_than_the_settle_limit() -> None:
    hour = firing_stats.hour_of(NOW - firing_stats.SETTLE_LIMIT - HOUR)
    found = counted({hour: (Tally(fired=1), False)}, until=hour)
    closing = firing_stats.closing(found, NOW)
    assert closing is not None
    assert set(closing.hours) == {hour}
    assert closing.counted_until == firing_stats.hour_of(NOW)


def test_nothing_is_written_when_nothing_closed_since() -> None:
    current = firing_stats.hour_of(NOW)
    assert firing_stats.closing(counted({}, until=current), NOW) is None
    one = NOON + HOUR
    assert firing_stats.closing(counted({one: (Tally(), False)}, until=one), NOW) is None
    kept_already = counted({NOON: (Tally(fired=1), True)}, until=NOON, kept={NOON: Tally(fired=1)})
    closing = firing_stats.closing(kept_already, NOW)
    assert closing is not None
    assert closing.hours == {}  # kept already: only how far the hours are closed moves
    first = firing_stats.closing(counted({}, version=None), NOW)
    assert first is not None
    assert (first.counted_until, first.version) == (current, None)


def test_the_windows_end_with_the_current_hour_and_day() -> None:
    found = counted(
        {firing_stats.hour_of(NOW): (Tally(fired=1, succeeded=1), False)},
        kept={
            NOON: Tally(fired=2, failed=2),
            NOON - 24 * HOUR: Tally(fired=4),  # yesterday noon: in the 30 days, not the 24 hours
            datetime(2026, 2, 8, 23, tzinfo=UTC): Tally(fired=8),  # before the 30 days
        },
    )
    stats = firing_stats.stats(found, NOW)
    hours, days = stats.last_24h, stats.last_30d
    assert hours.start == datetime(2026, 3, 9, 15, tzinfo=UTC)
    assert len(hours.buckets) == 24
    assert hours.buckets[-1] == Tally(fired=1, succeeded=1)
    assert hours.buckets[-3] == Tally(fired=2, failed=2)
    assert hours.total.fired == 3
    assert days.start == datetime(2026, 2, 9, tzinfo=UTC) == firing_stats.since(NOW)
    assert len(days.buckets) == 30
    assert days.buckets[-1].fired == 3
    assert days.buckets[-2].fired == 4
    assert days.total.fired == 7


def test_a_line_of_response_times_leaves_out_buckets_without_one() -> None:
    window = charts.Window("t", NOON, HOUR, 4, "%H:00")
    drawn = charts.line(window, [0.5, None, 1.0, 0.0])
    assert drawn.top == 1.0
    assert [(p.x, p.y, p.starts) for p in drawn.points] == [
        (60.0, charts.LINE_TOP + 30.0, "12:00"),
        (360.0, charts.LINE_TOP, "14:00"),
        (510.0, charts.LINE_TOP + charts.LINE_HEIGHT, "15:00"),
    ]
    assert drawn.path.startswith("60.0,170.0 360.0,140")
    assert charts.line(window, [None] * 4).points == []
