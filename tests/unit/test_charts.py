"""The overview's charts: windows aligned to whole minutes and hours, and bars scaled to
the highest one with failures stacked on top."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from corral.web import charts


def test_windows_end_with_the_minute_and_the_hour_that_hold_now() -> None:
    hour, day = charts.windows(datetime(2026, 3, 1, 12, 30, 10, 5, tzinfo=UTC))
    assert (hour.since, hour.width, hour.buckets) == (
        datetime(2026, 3, 1, 11, 31, tzinfo=UTC),
        timedelta(minutes=1),
        60,
    )
    assert hour.since + hour.width * hour.buckets > datetime(2026, 3, 1, 12, 30, 10, tzinfo=UTC)
    assert (day.since, day.width, day.buckets) == (
        datetime(2026, 2, 28, 13, tzinfo=UTC),
        timedelta(hours=1),
        24,
    )


def test_bars_are_scaled_to_the_highest_and_say_what_they_count() -> None:
    window = charts.windows(datetime(2026, 3, 1, 12, 30, tzinfo=UTC))[0]
    counts = [(0, 0)] * 58 + [(3, 1), (1, 1)]
    drawn = charts.chart(window, counts)
    assert (drawn.succeeded, drawn.failed, drawn.top) == (4, 2, 4)
    full, half = drawn.bars[58], drawn.bars[59]
    assert full.succeeded_height + full.failed_height == charts.HEIGHT
    assert (half.succeeded_height, half.failed_height) == (30.0, 30.0)
    assert half.starts == "12:30"
    assert drawn.bars[0].succeeded_height == 0


def test_an_empty_window_draws_no_bar() -> None:
    window = charts.windows(datetime(2026, 3, 1, tzinfo=UTC))[1]
    drawn = charts.chart(window, [(0, 0)] * 24)
    assert drawn.top == 0
    assert all(b.succeeded_height == b.failed_height == 0 for b in drawn.bars)
