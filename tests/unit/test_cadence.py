"""When a schedule fires (cadence): cron in a time zone across clock changes, intervals,
catch-up, pause and jitter, with the clock changes of 2026 in three zones.

    Europe/Berlin        2026-03-29 02:00 -> 03:00 (01:00Z)   2026-10-25 03:00 -> 02:00 (01:00Z)
    America/New_York     2026-03-08 02:00 -> 03:00 (07:00Z)   2026-11-01 02:00 -> 01:00 (06:00Z)
    Australia/Lord_Howe  2026-10-04 02:00 -> 02:30 (15:30Z on the 3rd)
                         2026-04-05 02:00 -> 01:30 (15:00Z on the 4th)
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import cronsim
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral import cadence, errors

BERLIN, NEW_YORK, LORD_HOWE = "Europe/Berlin", "America/New_York", "Australia/Lord_Howe"
ZONES = (BERLIN, NEW_YORK, LORD_HOWE)
US = timedelta(microseconds=1)
CHANGES = {  # the instants the clocks changed, 2026
    BERLIN: [datetime(2026, 3, 29, 1, tzinfo=UTC), datetime(2026, 10, 25, 1, tzinfo=UTC)],
    NEW_YORK: [datetime(2026, 3, 8, 7, tzinfo=UTC), datetime(2026, 11, 1, 6, tzinfo=UTC)],
    LORD_HOWE: [
        datetime(2026, 4, 4, 15, tzinfo=UTC),
        datetime(2026, 10, 3, 15, 30, tzinfo=UTC),
    ],
}
quick = settings(max_examples=25, deadline=None)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def walls(when: cadence.When, start: datetime, end: datetime) -> list[str]:
    """Firings as local wall times with their offsets, e.g. '2026-03-29 03:00+02:00'."""
    return [n.local.strftime("%Y-%m-%d %H:%M%z") for n in cadence.between(when, start, end)]


def ats(when: cadence.When, start: datetime, end: datetime) -> list[datetime]:
    return [n.at for n in cadence.between(when, start, end)]


# --- reading what users write ----------------------------------------------------------------


def test_a_cron_expression_is_kept_as_written_with_its_zone() -> None:
    assert cadence.parse_cron("  30  2 * * *  ", BERLIN) == cadence.Cron("30 2 * * *", BERLIN)
    assert cadence.parse_cron("@daily").tz == "UTC"


@pytest.mark.parametrize(
    ("expr", "reason"),
    [
        ("61 * * * *", "bad minute"),
        ("* 24 * * *", "bad hour"),
        ("* * 32 * *", "bad day-of-month"),
        ("* * * 13 *", "bad month"),
        ("* * * * 8", "bad day-of-week"),
        ("*/0 * * * *", "bad minute"),
        ("* * *", "3 fields; it needs 5"),
        ("0 * * * * *", "6 fields; it needs 5"),
        ("", "0 fields"),
        ("@fortnightly", "1 field; it needs 5"),
        ("0 0 31 2 *", "bad day-of-month"),
    ],
)
def test_a_bad_cron_expression_is_refused_naming_cron_and_why(expr: str, reason: str) -> None:
    with pytest.raises(errors.InvalidInput) as caught:
        cadence.parse_cron(expr)
    message = str(caught.value)
    assert message.startswith(f"cron: {expr!r} is not a valid cron expression (")
    assert reason in message


@pytest.mark.parametrize("tz", ["Mars/Olympus", "", "Europe", "../etc/passwd", "localtime"])
def test_an_unknown_zone_is_refused_naming_tz(tz: str) -> None:
    with pytest.raises(errors.InvalidInput, match=r"^tz: .* is not a known time zone"):
        cadence.parse_cron("0 9 * * *", tz)


def test_nicknames_spell_out_five_fields() -> None:
    daily = cadence.parse_cron("@daily", BERLIN)
    assert walls(daily, utc(2025, 12, 31, 23), utc(2026, 1, 2, 23)) == [
        "2026-01-01 00:00+0100",
        "2026-01-02 00:00+0100",
    ]
    hourly = cadence.parse_cron("@hourly")
    assert len(ats(hourly, utc(2026, 1, 1), utc(2026, 1, 2))) == 24


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30),
        ("10m", 600),
        ("1h30m", 5400),
        ("2d", 172800),
        ("1d2h3m4s", 93784),
        ("90", 90),  # a bare number is seconds, as wherever a duration is read
    ],
)
def test_an_interval_reads_days_hours_minutes_and_seconds(text: str, seconds: int) -> None:
    anchor = datetime(2026, 1, 1, 9, tzinfo=ZoneInfo(BERLIN))
    every = cadence.parse_every(text, anchor)
    assert every.seconds == seconds
    assert every.anchor == utc(2026, 1, 1, 8)
    assert every.anchor.tzinfo is UTC


@pytest.mark.parametrize("text", ["0s", "500ms", "abc", "", "1.5h", "-5s", "0", "1m30h"])
def test_an_interval_under_a_second_or_unreadable_is_refused_naming_every(text: str) -> None:
    with pytest.raises(errors.InvalidInput, match=r"^every: "):
        cadence.parse_every(text, utc(2026, 1, 1))


def test_the_refusals_say_what_was_wrong() -> None:
    with pytest.raises(errors.InvalidInput, match=r"^every: '0s' is shorter than 1 second"):
        cadence.parse_every("0s", utc(2026, 1, 1))
    with pytest.raises(errors.InvalidInput, match=r"^every: '500ms' is finer than a second"):
        cadence.parse_every("500ms", utc(2026, 1, 1))
    with pytest.raises(errors.InvalidInput, match=r"^every: 'abc' is not a duration; .* 1h30m"):
        cadence.parse_every("abc", utc(2026, 1, 1))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0s", timedelta(0)),
        ("90m", timedelta(minutes=90)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("1h 30m", timedelta(hours=1, minutes=30)),
        ("7d", timedelta(days=7)),
    ],
)
def test_a_duration_reads_whole_units(text: str, expected: timedelta) -> None:
    assert cadence.parse_duration(text, "catch_up_window") == expected


@pytest.mark.parametrize("text", ["1w", "m", "1.5d", "d1", "999999999d24h", "٣s"])
def test_a_bad_duration_is_refused_naming_its_field(text: str) -> None:
    with pytest.raises(errors.InvalidInput, match=r"^catch_up_window: "):
        cadence.parse_duration(text, "catch_up_window")


@pytest.mark.parametrize(
    ("text", "tz", "expected"),
    [
        ("2026-12-24T09:00+01:00", "UTC", utc(2026, 12, 24, 8)),
        ("2026-12-24T08:00Z", BERLIN, utc(2026, 12, 24, 8)),
        ("2026-12-24", BERLIN, utc(2026, 12, 23, 23)),
        ("2026-12-24", "UTC", utc(2026, 12, 24)),
        ("2026-07-04T09:00", NEW_YORK, utc(2026, 7, 4, 13)),
        ("2026-03-29T02:30", BERLIN, utc(2026, 3, 29, 1)),  # skipped: the jump
        ("2026-10-25T02:30", BERLIN, utc(2026, 10, 25, 0, 30)),  # repeated: the first
    ],
)
def test_an_instant_is_iso_8601_and_naive_times_are_wall_time(
    text: str, tz: str, expected: datetime
) -> None:
    got = cadence.parse_instant(text, "starts_at", tz)
    assert got == expected
    assert got.tzinfo is UTC


@pytest.mark.parametrize("text", ["tomorrow", "2026-13-01", "", "2026-12-24T25:00", "12/24/2026"])
def test_an_unreadable_instant_is_refused_naming_its_field(text: str) -> None:
    with pytest.raises(errors.InvalidInput, match=r"^starts_at: .* is not an ISO 8601 time"):
        cadence.parse_instant(text, "starts_at")


def test_times_without_a_zone_are_refused() -> None:
    with pytest.raises(errors.InvalidInput, match=r"^t: .* must carry a timezone"):
        cadence.after(cadence.Cron("* * * * *"), datetime(2026, 1, 1))
    with pytest.raises(errors.InvalidInput, match=r"^anchor: "):
        cadence.Every(60, datetime(2026, 1, 1))
    with pytest.raises(errors.InvalidInput, match=r"^every: "):
        cadence.Every(0, utc(2026, 1, 1))


# --- clock changes: fixed hours --------------------------------------------------------------


def test_berlin_a_fixed_time_in_the_skipped_hour_fires_at_the_jump() -> None:
    when = cadence.parse_cron("30 2 * * *", BERLIN)
    got = list(cadence.between(when, utc(2026, 3, 28), utc(2026, 3, 31)))
    assert [n.local.strftime("%Y-%m-%d %H:%M%z") for n in got] == [
        "2026-03-28 02:30+0100",
        "2026-03-29 03:00+0200",
        "2026-03-30 02:30+0200",
    ]
    assert got[1].at == utc(2026, 3, 29, 1)
    assert got[1].moved == (
        "02:30 does not exist on 2026-03-29 (clocks went forward): fired at 03:00"
    )
    assert got[0].moved is None
    assert got[2].moved is None


def test_berlin_a_fixed_time_in_the_repeated_hour_fires_once_at_the_first() -> None:
    when = cadence.parse_cron("30 2 * * *", BERLIN)
    got = list(cadence.between(when, utc(2026, 10, 24), utc(2026, 10, 27)))
    assert [n.at for n in got] == [
        utc(2026, 10, 24, 0, 30),
        utc(2026, 10, 25, 0, 30),  # 02:30 CEST, not 02:30 CET an hour later
        utc(2026, 10, 26, 1, 30),
    ]
    assert got[1].moved == (
        "02:30 happens twice on 2026-10-25 (clocks went back): fired at the first"
    )


def test_berlin_several_times_in_the_skipped_hour_fire_once_at_the_jump() -> None:
    for expr in ("0,30 2 * * *", "0 2,3 * * *", "*/15 2 * * *", "* 2 * * *"):
        when = cadence.parse_cron(expr, BERLIN)
        assert ats(when, utc(2026, 3, 29), utc(2026, 3, 29, 2)) == [utc(2026, 3, 29, 1)], expr


def test_berlin_a_fixed_hour_with_a_minute_step_fires_its_repeated_hour_once() -> None:
    when = cadence.parse_cron("*/15 2 * * *", BERLIN)
    got = list(cadence.between(when, utc(2026, 10, 25), utc(2026, 10, 25, 3)))
    assert [n.local.strftime("%H:%M%z") for n in got] == [
        "02:00+0200",
        "02:15+0200",
        "02:30+0200",
        "02:45+0200",
    ]
    assert all("happens twice" in (n.moved or "") for n in got)


def test_berlin_asked_inside_the_second_pass_the_next_time_is_tomorrow() -> None:
    # cronsim answers 02:45 CEST here, an hour *before* the time it was asked about.
    when = cadence.parse_cron("45 2 * * *", BERLIN)
    second_pass = datetime(2026, 10, 25, 2, 30, fold=1, tzinfo=ZoneInfo(BERLIN))
    assert cadence.after(when, second_pass).at == utc(2026, 10, 26, 1, 45)
    first_pass = datetime(2026, 10, 25, 2, 30, tzinfo=ZoneInfo(BERLIN))
    assert cadence.after(when, first_pass).at == utc(2026, 10, 25, 0, 45)


def test_new_york_skipped_and_repeated_fixed_times() -> None:
    spring = list(
        cadence.between(
            cadence.parse_cron("30 2 * * *", NEW_YORK), utc(2026, 3, 8), utc(2026, 3, 9)
        )
    )
    assert [n.at for n in spring] == [utc(2026, 3, 8, 7)]
    assert spring[0].local.strftime("%H:%M%z") == "03:00-0400"
    assert (
        spring[0].moved
        == "02:30 does not exist on 2026-03-08 (clocks went forward): fired at 03:00"
    )
    autumn = list(
        cadence.between(
            cadence.parse_cron("30 1 * * *", NEW_YORK), utc(2026, 11, 1), utc(2026, 11, 2)
        )
    )
    assert [n.at for n in autumn] == [utc(2026, 11, 1, 5, 30)]  # 01:30 EDT, not EST
    assert (
        autumn[0].moved
        == "01:30 happens twice on 2026-11-01 (clocks went back): fired at the first"
    )


def test_new_york_weekdays_at_nine_stay_at_nine_across_both_changes() -> None:
    when = cadence.parse_cron("0 9 * * 1-5", NEW_YORK)
    spring = list(cadence.between(when, utc(2026, 3, 5), utc(2026, 3, 11)))
    assert [n.local.strftime("%a %d %H:%M%z") for n in spring] == [
        "Thu 05 09:00-0500",
        "Fri 06 09:00-0500",
        "Mon 09 09:00-0400",
        "Tue 10 09:00-0400",
    ]
    assert [n.at.hour for n in spring] == [14, 14, 13, 13]
    autumn = list(cadence.between(when, utc(2026, 10, 29), utc(2026, 11, 4)))
    assert {n.local.strftime("%H:%M") for n in autumn} == {"09:00"}
    assert [n.at.hour for n in autumn] == [13, 13, 14, 14]
    assert all(n.moved is None for n in spring + autumn)


def test_lord_howe_half_hour_changes_move_fixed_times_by_half_an_hour() -> None:
    spring = list(
        cadence.between(
            cadence.parse_cron("15 2 * * *", LORD_HOWE), utc(2026, 10, 2), utc(2026, 10, 5)
        )
    )
    assert [n.local.strftime("%Y-%m-%d %H:%M%z") for n in spring] == [
        "2026-10-03 02:15+1030",
        "2026-10-04 02:30+1100",
        "2026-10-05 02:15+1100",
    ]
    assert spring[1].at == utc(2026, 10, 3, 15, 30)
    assert (
        spring[1].moved
        == "02:15 does not exist on 2026-10-04 (clocks went forward): fired at 02:30"
    )
    autumn = list(
        cadence.between(
            cadence.parse_cron("45 1 * * *", LORD_HOWE), utc(2026, 4, 4), utc(2026, 4, 5)
        )
    )
    assert [n.at for n in autumn] == [utc(2026, 4, 4, 14, 45)]  # 01:45 +11:00, the first
    assert (
        autumn[0].moved
        == "01:45 happens twice on 2026-04-05 (clocks went back): fired at the first"
    )


def test_a_time_the_clocks_do_not_touch_is_not_moved() -> None:
    when = cadence.parse_cron("15 1 * * *", LORD_HOWE)  # 01:15 is before the repeated 01:30-02:00
    assert [n.moved for n in cadence.between(when, utc(2026, 4, 3), utc(2026, 4, 6))] == [None] * 3


# --- clock changes: hours that count ---------------------------------------------------------


def test_berlin_a_step_fires_at_every_real_instant_through_both_changes() -> None:
    when = cadence.parse_cron("*/30 * * * *", BERLIN)
    for change in CHANGES[BERLIN]:
        start = change - timedelta(hours=2)
        assert ats(when, start, change + timedelta(hours=2)) == [
            start + timedelta(minutes=30 * k) for k in range(8)
        ]
    assert walls(when, utc(2026, 10, 25, 0), utc(2026, 10, 25, 2)) == [
        "2026-10-25 02:00+0200",
        "2026-10-25 02:30+0200",
        "2026-10-25 02:00+0100",
        "2026-10-25 02:30+0100",
    ]


def test_berlin_a_step_written_as_a_range_counts_real_instants_too() -> None:
    # cronsim takes "0-23/2" for a fixed time and fires 02:00 once; it is a step.
    when = cadence.parse_cron("0 0-23/2 * * *", BERLIN)
    assert walls(when, utc(2026, 10, 24, 21), utc(2026, 10, 25, 3, 30)) == [
        "2026-10-25 00:00+0200",
        "2026-10-25 02:00+0200",
        "2026-10-25 02:00+0100",
        "2026-10-25 04:00+0100",
    ]
    assert walls(when, utc(2026, 3, 28, 22), utc(2026, 3, 29, 3)) == [
        "2026-03-29 00:00+0100",
        "2026-03-29 04:00+0200",  # 02:00 never happened
    ]


def test_new_york_hourly_fires_every_real_hour() -> None:
    when = cadence.parse_cron("0 * * * *", NEW_YORK)
    autumn = list(cadence.between(when, utc(2026, 11, 1, 4), utc(2026, 11, 1, 8)))
    assert [n.local.strftime("%H:%M%z") for n in autumn] == [
        "00:00-0400",
        "01:00-0400",
        "01:00-0500",
        "02:00-0500",
    ]
    spring = walls(when, utc(2026, 3, 8, 5), utc(2026, 3, 8, 9))
    assert spring == [
        "2026-03-08 00:00-0500",
        "2026-03-08 01:00-0500",
        "2026-03-08 03:00-0400",
        "2026-03-08 04:00-0400",
    ]
    assert all(n.moved is None for n in autumn)


def test_lord_howe_every_fifteen_minutes_is_every_fifteen_real_minutes() -> None:
    when = cadence.parse_cron("*/15 * * * *", LORD_HOWE)
    for change in CHANGES[LORD_HOWE]:
        start = change - timedelta(hours=1)
        assert ats(when, start, change + timedelta(hours=1)) == [
            start + timedelta(minutes=15 * k) for k in range(8)
        ]
    assert walls(when, utc(2026, 4, 4, 14, 30), utc(2026, 4, 4, 15, 30)) == [
        "2026-04-05 01:30+1100",
        "2026-04-05 01:45+1100",
        "2026-04-05 01:30+1030",
        "2026-04-05 01:45+1030",
    ]


def test_lord_howe_half_past_every_hour_fires_twice_in_the_repeated_half_hour() -> None:
    # cronsim skips the second 01:30 (+10:30) here.
    when = cadence.parse_cron("30 * * * *", LORD_HOWE)
    assert walls(when, utc(2026, 4, 4, 13), utc(2026, 4, 4, 17)) == [
        "2026-04-05 00:30+1100",
        "2026-04-05 01:30+1100",
        "2026-04-05 01:30+1030",
        "2026-04-05 02:30+1030",
    ]
    on_the_hour = cadence.parse_cron("0 * * * *", LORD_HOWE)
    assert walls(on_the_hour, utc(2026, 10, 3, 13), utc(2026, 10, 3, 17, 1)) == [
        "2026-10-04 00:00+1030",
        "2026-10-04 01:00+1030",
        "2026-10-04 03:00+1100",  # 02:00 never happened
        "2026-10-04 04:00+1100",
    ]


def test_an_interval_ignores_clock_changes() -> None:
    every = cadence.Every(3600, utc(2026, 1, 1, 0, 30))
    got = list(cadence.between(every, utc(2026, 3, 29), utc(2026, 3, 30)))
    assert [n.at for n in got] == [utc(2026, 3, 29, 0, 30) + timedelta(hours=k) for k in range(24)]
    assert all(n.local == n.at and n.moved is None for n in got)


# --- properties -----------------------------------------------------------------------------

REAL_EXPRS = ["*/15 * * * *", "30 * * * *", "0 */2 * * *", "*/20 0-23/3 * * *", "45 * * * 0"]
FIXED_EXPRS = [
    "30 2 * * *",
    "45 1 * * *",
    "15 2 * * *",
    "0,30 1-3 * * *",
    "*/20 2 * * *",
    "0 9 * * 1-5",
]
zones = st.sampled_from(ZONES)
near_a_change = st.builds(
    lambda zone, which, minutes, micros: (
        zone,
        CHANGES[zone][which] + timedelta(minutes=minutes, microseconds=micros),
    ),
    zones,
    st.integers(0, 1),
    st.integers(-36 * 60, 36 * 60),
    st.sampled_from([0, 0, 1, 500_000]),
)
crons = st.builds(
    lambda zone_and_t, expr: (cadence.Cron(expr, zone_and_t[0]), zone_and_t[1]),
    near_a_change,
    st.sampled_from(REAL_EXPRS + FIXED_EXPRS),
)
everys = st.builds(
    lambda seconds, anchor, t: (cadence.Every(seconds, anchor), t),
    st.integers(1, 5400),
    st.datetimes(datetime(2025, 1, 1), datetime(2027, 1, 1), timezones=st.just(UTC)),
    st.datetimes(datetime(2024, 12, 1), datetime(2027, 1, 1), timezones=st.just(UTC)),
)
schedules = st.one_of(crons, everys)
coarse_schedules = st.one_of(crons, everys.filter(lambda schedule: schedule[0].seconds >= 30))


def matches(expr: str, wall: datetime) -> bool:
    """Whether a naive wall time matches a cron expression, by cronsim alone."""
    return bool(next(cronsim.CronSim(expr, wall - timedelta(seconds=1))) == wall)


def oracle(
    expr: str, zone: ZoneInfo, start: datetime, end: datetime, fixed: bool
) -> list[datetime]:
    """The firings in [start, end), minute by minute: a real instant whose wall time matches
    (for a fixed hour only its first occurrence), and for a fixed hour also the jump of a
    skipped stretch in which a wall time matched."""
    out, at = [], start
    while at < end:
        local = at.astimezone(zone)
        wall = local.replace(tzinfo=None)
        fires = matches(expr, wall) and not (fixed and local.fold == 1)
        before = (at - US).astimezone(zone).replace(tzinfo=None) + US
        if fixed and not fires and before < wall:  # the clocks jumped over [before, wall)
            skipped = before.replace(second=0, microsecond=0)
            skipped += timedelta(minutes=1) if skipped < before else timedelta(0)
            fires = any(
                matches(expr, skipped + timedelta(minutes=k))
                for k in range((wall - skipped) // timedelta(minutes=1))
            )
        if fires:
            out.append(at)
        at += timedelta(minutes=1)
    return out


@quick
@given(near_a_change, st.sampled_from(REAL_EXPRS + FIXED_EXPRS))
def test_firings_are_exactly_those_a_minute_by_minute_walk_finds(zone_and_t, expr: str) -> None:
    tz, t = zone_and_t
    start = t.replace(second=0, microsecond=0)
    end = start + timedelta(hours=6)
    fixed = expr in FIXED_EXPRS
    assert ats(cadence.Cron(expr, tz), start, end) == oracle(expr, ZoneInfo(tz), start, end, fixed)


@quick
@given(schedules)
def test_between_is_strictly_increasing_and_each_local_is_its_instant(schedule) -> None:
    when, t = schedule
    got = list(itertools.islice(cadence.between(when, t, t + timedelta(days=3)), 300))
    assert all(a.at < b.at for a, b in itertools.pairwise(got))
    assert all(t <= n.at < t + timedelta(days=3) and n.at.tzinfo is UTC for n in got)
    zone = ZoneInfo(when.tz) if isinstance(when, cadence.Cron) else UTC
    # (`local == at` is False in a repeated hour: Python's rule for fold=1 across zones)
    assert all(n.local.tzinfo is zone and n.local.astimezone(UTC) == n.at for n in got)


@quick
@given(schedules)
def test_after_is_the_first_of_between_and_following_is_the_next_after(schedule) -> None:
    when, t = schedule
    first = cadence.after(when, t)
    assert first == next(cadence.between(when, t + US, t + timedelta(days=4000)))
    assert first.at > t
    second = cadence.after(when, first.at)
    assert cadence.following(when, first.at) == second.at
    assert list(cadence.between(when, first.at, second.at + US)) == [first, second]


@settings(max_examples=12, deadline=None)
@given(zones, st.integers(0, 59), st.integers(0, 23))
def test_a_fixed_daily_time_fires_once_every_local_day_of_a_year(
    tz: str, minute: int, hour: int
) -> None:
    once_a_day(cadence.Cron(f"{minute} {hour} * * *", tz))


@pytest.mark.parametrize(
    ("tz", "expr", "moved"),
    [
        (BERLIN, "30 2 * * *", 2),  # skipped in March, repeated in October
        (BERLIN, "0 2 * * *", 2),
        (NEW_YORK, "30 2 * * *", 1),  # skipped in March; 01:00-02:00 repeats in November
        (NEW_YORK, "30 1 * * *", 1),
        (LORD_HOWE, "15 2 * * *", 1),  # skipped in October (02:00-02:30)
        (LORD_HOWE, "45 1 * * *", 1),  # repeated in April (01:30-02:00)
        (LORD_HOWE, "30 1 * * *", 1),
    ],
)
def test_a_fixed_daily_time_in_a_changed_hour_fires_once_every_local_day(
    tz: str, expr: str, moved: int
) -> None:
    assert once_a_day(cadence.Cron(expr, tz)) == moved


def once_a_day(when: cadence.Cron) -> int:
    zone = ZoneInfo(when.tz)
    start = datetime(2026, 1, 1, tzinfo=zone)
    end = datetime(2027, 1, 1, tzinfo=zone)
    got = list(cadence.between(when, start, end))
    days = Counter(n.local.date() for n in got)
    assert set(days.values()) == {1}
    assert len(days) == (date(2027, 1, 1) - date(2026, 1, 1)).days
    return sum(n.moved is not None for n in got)


# --- catch-up --------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    coarse_schedules,
    st.integers(0, 3 * 24 * 60),
    st.integers(0, 3 * 24 * 60),
    st.sampled_from(["none", "all"]),
    st.integers(0, 24 * 60),
    st.integers(1, 6),
    st.booleans(),
)
def test_catch_up_fires_the_latest_due_times_and_counts_the_rest(
    schedule, since: int, age: int, mode: str, window: int, max_firings: int, never: bool
) -> None:
    when, now = schedule
    last = None if never else now - timedelta(minutes=since)
    created = now - timedelta(minutes=since + age if never else since + 10)
    start = created if last is None else last + US
    due = ats(when, start, now + US)
    got = cadence.catch_up(
        when,
        last,
        now,
        mode=mode,
        window=timedelta(minutes=window),
        max_firings=max_firings,
        created=created,
    )
    assert len(got.fire) <= max_firings
    assert set(got.fire) <= set(due)
    if mode == "none":
        assert got.fire == due[-1:]
    else:
        assert (
            got.fire == [at for at in due if at >= now - timedelta(minutes=window)][-max_firings:]
        )
    not_fired = due[: len(due) - len(got.fire)]
    assert got.missed == not_fired[-max_firings:]
    assert got.missed_count == len(not_fired)
    assert got.first_missed == (not_fired[0] if not_fired else None)
    assert got.next_due == cadence.after(when, now).at


def test_catch_up_never_fires_times_before_the_schedule_was_created() -> None:
    when = cadence.Every(60, utc(2026, 1, 1))
    got = cadence.catch_up(
        when,
        None,
        utc(2026, 1, 1, 1),
        mode="all",
        window=timedelta(days=1),
        max_firings=100,
        created=utc(2026, 1, 1, 0, 59, 30),
    )
    assert got.fire == [utc(2026, 1, 1, 1)]
    assert got.missed_count == 0


def test_catch_up_outside_the_window_is_missed_even_the_latest() -> None:
    when = cadence.parse_cron("0 9 * * *", BERLIN)
    got = cadence.catch_up(
        when,
        utc(2026, 1, 1, 8),
        utc(2026, 1, 3, 12),
        mode="all",
        window=timedelta(hours=1),
        max_firings=5,
        created=utc(2025, 1, 1),
    )
    assert got.fire == []
    assert got.missed == [utc(2026, 1, 2, 8), utc(2026, 1, 3, 8)]
    assert got.next_due == utc(2026, 1, 4, 8)


def test_catch_up_after_years_away_keeps_memory_and_time_bounded() -> None:
    every_second = cadence.Every(1, utc(2016, 1, 1))
    started = time.perf_counter()
    got = cadence.catch_up(
        every_second,
        utc(2016, 1, 1),
        utc(2026, 1, 1),
        mode="all",
        window=timedelta(days=7),
        max_firings=3,
        created=utc(2016, 1, 1),
    )
    assert time.perf_counter() - started < 0.5
    assert got.fire == [utc(2026, 1, 1) - timedelta(seconds=k) for k in (2, 1, 0)]
    assert got.missed_count == 10 * 365 * 86400 + 3 * 86400 - 3  # 2016, 2020 and 2024 leap
    assert got.missed == [utc(2026, 1, 1) - timedelta(seconds=k) for k in (5, 4, 3)]
    assert got.first_missed == utc(2016, 1, 1, 0, 0, 1)
    every_minute = cadence.parse_cron("* * * * *", BERLIN)
    got = cadence.catch_up(
        every_minute,
        utc(2025, 12, 1),
        utc(2026, 1, 1),
        mode="none",
        window=timedelta(0),
        max_firings=2,
        created=utc(2025, 1, 1),
    )
    assert got.fire == [utc(2026, 1, 1)]
    assert got.missed_count == 31 * 24 * 60 - 1
    assert len(got.missed) == 2


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"mode": "some"}, "catch_up"),
        ({"window": timedelta(seconds=-1)}, "window"),
        ({"max_firings": 0}, "max_firings"),
    ],
)
def test_catch_up_refuses_bad_settings_naming_them(kwargs, field: str) -> None:
    args = {
        "mode": "all",
        "window": timedelta(hours=1),
        "max_firings": 1,
        "created": utc(2026, 1, 1),
    } | kwargs
    with pytest.raises(errors.InvalidInput, match=rf"^{field}: "):
        cadence.catch_up(cadence.Cron("* * * * *"), None, utc(2026, 1, 2), **args)


# --- pause and jitter ------------------------------------------------------------------------


def test_resuming_skips_what_fell_in_the_pause_and_lists_only_the_latest() -> None:
    every_minute = cadence.Every(60, utc(2026, 1, 1))
    got = cadence.resume(every_minute, utc(2026, 1, 1), utc(2026, 1, 2, 0, 0, 30), limit=3)
    assert got.skipped_count == 24 * 60
    assert got.skipped == [utc(2026, 1, 1, 23, 58), utc(2026, 1, 1, 23, 59), utc(2026, 1, 2)]
    assert got.next_due == utc(2026, 1, 2, 0, 1)
    daily = cadence.parse_cron("30 2 * * *", BERLIN)
    got = cadence.resume(daily, utc(2026, 3, 28, 12), utc(2026, 3, 30, 12))
    assert got.skipped == [utc(2026, 3, 29, 1), utc(2026, 3, 30, 0, 30)]
    assert got.next_due == utc(2026, 3, 31, 0, 30)


@quick
@given(
    st.text(max_size=40),
    st.datetimes(datetime(1970, 1, 1), datetime(2200, 1, 1), timezones=st.just(UTC)),
    st.integers(1, 10**12),
)
def test_jitter_is_the_same_everywhere_and_within_the_spread(
    key: str, nominal: datetime, micros: int
) -> None:
    spread = timedelta(microseconds=micros)
    offset = cadence.jitter(key, nominal, spread)
    assert timedelta(0) <= offset < spread
    assert cadence.jitter(key, nominal.astimezone(ZoneInfo(LORD_HOWE)), spread) == offset


def test_jitter_spreads_schedules_that_share_a_time() -> None:
    nominal, spread = utc(2026, 1, 1, 9), timedelta(minutes=5)
    offsets = {cadence.jitter(f"schedule-{n}", nominal, spread) for n in range(50)}
    assert len(offsets) == 50
    assert cadence.jitter("a", nominal, timedelta(0)) == timedelta(0)
    with pytest.raises(errors.InvalidInput, match=r"^jitter: "):
        cadence.jitter("a", nominal, timedelta(seconds=-1))


# --- laziness --------------------------------------------------------------------------------


def test_between_is_lazy() -> None:
    started = time.perf_counter()
    week = cadence.between(cadence.Every(1, utc(2026, 1, 1)), utc(2026, 1, 1), utc(2026, 1, 8))
    assert [n.at for n in itertools.islice(week, 3)] == [utc(2026, 1, 1, 0, 0, k) for k in range(3)]
    decade = cadence.between(
        cadence.parse_cron("* * * * *", BERLIN), utc(2026, 1, 1), utc(2036, 1, 1)
    )
    assert len(list(itertools.islice(decade, 5))) == 5
    assert time.perf_counter() - started < 0.5
