"""Where a monitor stands (corral.monitoring): its pings, the passing of time, the gap rule
and what a request may make of one; pure, on fixed times."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from corral import errors, loops, monitor_judge, monitoring
from corral.monitoring import DOWN, FAILED, LATE, PAUSED, UP
from corral.store import monitors as monitor_store

T0 = datetime(2026, 12, 8, 12, 0, tzinfo=UTC)
S = timedelta(seconds=1)


def a_monitor(**changes: object) -> monitoring.Monitor:
    made = monitoring.Monitor(
        id=1,
        tenant="a",
        name="backup",
        ping_key="k",
        period=2 * S,
        cron=None,
        tz="UTC",
        grace=S,
        state=UP,
        state_at=T0,
        basis_at=T0,
        expected_at=T0 + 2 * S,
        check_at=T0 + 2 * S,
        last_ping_at=None,
        run_started_at=None,
        created_at=T0,
    )
    return dataclasses.replace(made, **changes)  # type: ignore[arg-type]


def test_a_new_monitor_is_up_and_expects_its_first_ping_a_period_after_it_was_made() -> None:
    made = monitoring.made(a_monitor())
    assert (made.state, made.expected_at, made.check_at) == (UP, T0 + 2 * S, T0 + 2 * S)


def test_time_makes_it_late_past_its_period_and_down_past_its_grace() -> None:
    m = a_monitor()
    late = monitoring.judge(m, now=T0 + 2.5 * S, gap=None)
    assert (late.state, late.check_at) == (LATE, T0 + 3 * S)
    assert late.change is not None
    assert late.change.cause is None
    m = dataclasses.replace(m, state=LATE, check_at=late.check_at)
    down = monitoring.judge(m, now=T0 + 3.2 * S, gap=None)
    assert (down.state, down.check_at) == (DOWN, None)
    assert down.change is not None
    assert down.change.cause == "monitor_down"


def test_a_ping_moves_its_expected_time_and_brings_it_back_up() -> None:
    m = a_monitor(last_ping_at=T0 + 1.5 * S)
    still = monitoring.judge(m, now=T0 + 2.5 * S, gap=None)
    assert (still.state, still.expected_at, still.change) == (UP, T0 + 3.5 * S, None)
    down = a_monitor(state=DOWN, check_at=None)
    back = monitoring.pinged(down, kind=monitoring.SUCCESS, exit_code=None, now=T0 + 9 * S)
    assert back is not None
    assert back.state == UP
    assert back.expected_at == T0 + 11 * S
    assert back.change is not None
    assert back.change.cause == "monitor_up"
    from_late = monitoring.pinged(
        a_monitor(state=LATE), kind=monitoring.SUCCESS, exit_code=None, now=T0
    )
    assert from_late is not None
    assert from_late.change is not None
    assert from_late.change.cause is None  # late was never alerted: no monitor_up


def test_a_failure_ping_fails_it_and_a_start_or_a_paused_monitor_changes_nothing() -> None:
    failed = monitoring.pinged(a_monitor(), kind=monitoring.FAIL, exit_code=3, now=T0)
    assert failed is not None
    assert (failed.state, failed.check_at) == (FAILED, None)
    assert failed.change is not None
    assert failed.change.cause == "monitor_failed"
    assert "exit code 3" in failed.change.reason
    again = monitoring.pinged(a_monitor(state=FAILED), kind=monitoring.FAIL, exit_code=1, now=T0)
    assert again is not None
    assert again.change is None
    assert monitoring.pinged(a_monitor(), kind=monitoring.START, exit_code=None, now=T0) is None
    quiet = a_monitor(state=PAUSED)
    assert monitoring.pinged(quiet, kind=monitoring.FAIL, exit_code=None, now=T0) is None


def test_a_deadline_that_passed_while_nothing_judged_gives_a_fresh_period_and_grace() -> None:
    m = a_monitor()
    restart = T0 + 60 * S
    fresh = monitoring.judge(m, now=restart, gap=monitoring.Gap(T0 + S))
    assert (fresh.state, fresh.basis_at, fresh.expected_at) == (UP, restart, restart + 2 * S)
    assert fresh.change is not None
    assert fresh.change.cause is None
    assert fresh.change.details == {
        "gap_from": (T0 + S).isoformat(),
        "gap_to": restart.isoformat(),
    }
    # Nobody ever judged (a first start): the same.
    assert monitoring.judge(m, now=restart, gap=monitoring.Gap(None)).state == UP
    # A deadline that passed before the gap began was judged then: down now.
    late = a_monitor(state=LATE, check_at=T0 + 3 * S)
    assert monitoring.judge(late, now=restart, gap=monitoring.Gap(T0 + 4 * S)).state == DOWN
    # No gap: an ordinary pass, however long since the deadline.
    assert monitoring.judge(m, now=restart, gap=None).state == DOWN


HEARTBEAT = 20 * S  # loops.STALE_BEATS of them: 60 s


def _gap(
    last: datetime | None,
    *,
    own: datetime | None = None,
    writer: loops.Liveness | None = loops.Liveness.LIVE,
    now: datetime,
) -> monitoring.Gap | None:
    noted = None if last is None else monitor_store.Judged(last, "old")
    return monitor_judge.gap(noted, own=own, writer=writer, now=now, heartbeat=HEARTBEAT)


def test_a_gap_is_a_time_nothing_judged_not_a_slow_pass() -> None:
    # Never judged: a gap since ever.
    assert _gap(None, now=T0) == monitoring.Gap(None)
    # This process judged 30 s ago (a slow pass, a catch-up): no gap, deadlines missed.
    assert _gap(T0, own=T0, now=T0 + 30 * S) is None
    # ...but past STALE_BEATS heartbeats of silence (its passes failed): a gap.
    assert _gap(T0, own=T0, now=T0 + 61 * S) == monitoring.Gap(T0)
    # Another scheduler that runs judged a moment ago: no gap.
    assert _gap(T0, writer=loops.Liveness.LIVE, now=T0 + 2 * S) is None
    # The one that judged last was SIGKILLed (its pid gone), stopped, or is silent: a gap
    # since its last pass, however short (a serve restarted at once).
    for dead in (loops.Liveness.GONE, loops.Liveness.STOPPED, loops.Liveness.STALE):
        assert _gap(T0, writer=dead, now=T0 + 5 * S) == monitoring.Gap(T0)
    # Not known who judged (a process without a loops row): alive until the silence is long.
    assert _gap(T0, writer=None, now=T0 + 30 * S) is None
    assert _gap(T0, writer=None, now=T0 + 61 * S) == monitoring.Gap(T0)
    # This process judged since: whoever judged before it no longer matters.
    assert _gap(T0, own=T0 + S, writer=loops.Liveness.GONE, now=T0 + 9 * S) is None


def test_a_cron_monitor_expects_the_cron_s_next_time_in_its_zone() -> None:
    m = a_monitor(period=None, cron="0 2 * * *", tz="Europe/Paris", grace=timedelta(minutes=5))
    assert monitoring.expected_after(m, T0) == datetime(2026, 12, 9, 1, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"period": "1h", "cron": "0 * * * *", "grace": "5m"}, "period"),
        ({"period": None, "cron": None, "grace": "5m"}, "period"),
        ({"period": "1h", "grace": None}, "grace"),
        ({"period": "1h", "tz": "Europe/Paris", "grace": "5m"}, "tz"),
        ({"period": "soon", "grace": "5m"}, "period"),
        ({"period": "400d", "grace": "5m"}, "period"),
        ({"cron": "61 * * * *", "grace": "5m"}, "cron"),
        ({"cron": "0 * * * *", "tz": "Mars/Olympus", "grace": "5m"}, "tz"),
        ({"period": "1h", "grace": "0s"}, "grace"),
    ],
)
def test_a_bad_cadence_is_refused_naming_the_field(given: dict[str, object], field: str) -> None:
    asked = {"period": None, "cron": None, "tz": None, "grace": None, **given}
    with pytest.raises(errors.InvalidInput) as refused:
        monitoring.cadence_checked(**asked)
    assert str(refused.value).startswith(f"{field}:")


def test_ping_kinds_from_the_url_and_ten_a_second() -> None:
    assert monitoring.ping_kind(None) == (monitoring.SUCCESS, None)
    assert monitoring.ping_kind("0") == (monitoring.SUCCESS, 0)
    assert monitoring.ping_kind("2") == (monitoring.FAIL, 2)
    assert monitoring.ping_kind("start") == (monitoring.START, None)
    for bad in ("256", "-1", "stop", "1e3"):
        with pytest.raises(errors.InvalidInput):
            monitoring.ping_kind(bad)
    window, count = None, 0
    for _ in range(monitoring.PINGS_A_SECOND):
        got = monitoring.rate(window, count, T0 + 0.5 * S)
        assert got is not None
        window, count = got
    assert monitoring.rate(window, count, T0 + 0.9 * S) is None
    assert monitoring.rate(window, count, T0 + 1.0 * S) == (T0 + S, 1)
