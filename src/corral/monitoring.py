"""Monitors, the dead man's switch for crons that run elsewhere: what a monitor may be, and
what its pings and the passing of time make of it. Pure: no I/O and no clock; the store
applies these decisions (store/monitors.py, store/monitor_pings.py) and the scheduler's
pass judges the monitors that are due (corral.monitor_judge).

A monitor expects a ping every `period`, or at each time of a cron expression in a zone,
counted from its basis: its last ping, or when it was made, resumed or given a fresh start.
Past the expected time it is late; past that plus its `grace`, down. A failure ping (`/fail`,
a non-zero exit code) makes it failed, and the next success ping makes it up again.

    state   its check (when the judge looks at it next)   what moves it
    up      the expected time                              time: late (or down); a failure ping
    late    the expected time plus the grace               time: down; a ping: up
    down    none                                           a success ping: up; a failure: failed
    failed  none                                           a success ping: up
    paused  none                                           resume: up, counted from then

The gap rule: no monitor goes down (or late) for a deadline that passed while nothing judged
monitors. When a pass of the judge begins after a gap (a `Gap`: corral was stopped, or the
scheduler that judged last died; corral.monitor_judge says when there was one), a monitor
due whose deadline came in the gap gets a fresh period plus grace from now, and the gap
goes in its history.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from corral import cadence, errors

UP, LATE, DOWN, FAILED, PAUSED = "up", "late", "down", "failed", "paused"
STATES = (UP, LATE, DOWN, FAILED, PAUSED)
"""Every state a monitor can be in (the /metrics gauge has one series each)."""

SUCCESS, START, FAIL = "success", "start", "fail"
"""What a ping says: the run succeeded (a plain ping, or exit code 0), began, or failed."""

CAUSES = {DOWN: "monitor_down", FAILED: "monitor_failed", UP: "monitor_up"}
"""The alert cause of a change to each state (monitor_up only from down or failed)."""

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,91}$")
"""A monitor's name within its tenant: short enough that its --channel rule's name
(`monitor-NAME`) is a rule's name too."""
SHORTEST = timedelta(seconds=1)
LONGEST = timedelta(days=365)
"""The shortest and longest period and grace."""
PINGS_A_SECOND = 10
"""The most pings one monitor records a second; past it, 429 and nothing recorded."""
PINGS_KEPT = 1000
"""The pings kept per monitor (the oldest go, a hundred at a time)."""
CHANGES_KEPT = 1000
"""The state changes kept per monitor."""
BODY_BYTES = 10 * 1024
"""How much of a ping's body is kept."""


@dataclass(frozen=True, slots=True)
class Monitor:
    """A monitor as stored."""

    id: int
    tenant: str
    name: str
    ping_key: str  # the random uuid of its ping URL: who holds it may ping
    period: timedelta | None  # every this long, or
    cron: str | None  # at each time of this cron expression, in `tz`
    tz: str
    grace: timedelta
    state: str
    state_at: datetime  # since when it is in its state
    basis_at: datetime  # what its next expected ping counts from (with its last ping)
    expected_at: datetime | None  # when the next ping is expected (late past it)
    check_at: datetime | None  # when the judge looks at it next (None: not until a ping)
    last_ping_at: datetime | None
    run_started_at: datetime | None  # a /start not yet followed by a ping
    created_at: datetime
    ping_count: int = 0
    rule: str | None = None  # the alert rule its --channel made, if any

    @property
    def down_at(self) -> datetime | None:
        """When it goes down if no ping comes."""
        return None if self.expected_at is None else self.expected_at + self.grace


@dataclass(frozen=True, slots=True)
class Change:
    """A change of a monitor's state, for its history (and, a cause, the alerts)."""

    frm: str
    to: str
    reason: str
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def cause(self) -> str | None:
        """The alert cause it is: monitor_down, monitor_failed, or monitor_up from down or
        failed (None: history only)."""
        if self.to == UP and self.frm not in (DOWN, FAILED):
            return None
        return CAUSES.get(self.to) if self.frm != self.to else None


@dataclass(frozen=True, slots=True)
class Gap:
    """A time nothing judged monitors, ending at the pass that finds it: since `since`, the
    last pass before it (None: nothing ever judged them)."""

    since: datetime | None


@dataclass(frozen=True, slots=True)
class Verdict:
    """Where a monitor stands after a ping, a pass of the judge, a pause or a resume."""

    state: str
    basis_at: datetime
    expected_at: datetime | None
    check_at: datetime | None
    change: Change | None = None


# --- what a monitor may be ------------------------------------------------------------------


def name_checked(name: Any) -> str:
    """`name`, when it may name a monitor; InvalidInput naming the field if not."""
    if not isinstance(name, str) or not NAME.match(name):
        raise errors.InvalidInput(
            "name: required: letters, digits, '_', '.' and '-', at most 92, beginning with a"
            " letter or a digit"
        )
    return name


def _span(text: Any, field: str) -> timedelta:
    if not isinstance(text, str | int) or isinstance(text, bool):
        raise errors.InvalidInput(f"{field}: a duration such as 30s, 5m, 1h or 1d")
    span = cadence.parse_duration(str(text), field)
    if not SHORTEST <= span <= LONGEST:
        raise errors.InvalidInput(f"{field}: {text!r} must be between 1s and 365d")
    return span


def cadence_checked(
    *, period: Any, cron: Any, tz: Any, grace: Any
) -> tuple[timedelta | None, str | None, str, timedelta]:
    """A monitor's period or cron (and zone) and grace as stored, from what a request
    says; InvalidInput naming the field and the rule."""
    if (period is None) == (cron is None):
        raise errors.InvalidInput("period: give a period (e.g. 1h) or a cron, not both")
    zone = "UTC" if tz is None else tz
    if not isinstance(zone, str):
        raise errors.InvalidInput("tz: an IANA time zone, e.g. Europe/Paris")
    if period is not None and tz is not None:
        raise errors.InvalidInput("tz: a time zone goes with a cron, not a period")
    if grace is None:
        raise errors.InvalidInput("grace: required, a duration such as 5m")
    if cron is not None:
        if not isinstance(cron, str):
            raise errors.InvalidInput("cron: a cron expression, e.g. '0 2 * * *'")
        when = cadence.parse_cron(cron, zone)
        return None, when.expr, when.tz, _span(grace, "grace")
    return _span(period, "period"), None, zone, _span(grace, "grace")


# --- time -----------------------------------------------------------------------------------


def expected_after(monitor: Monitor, basis: datetime) -> datetime:
    """When a ping is expected after `basis`: a period later, or the cron's next time."""
    if monitor.period is not None:
        return basis + monitor.period
    return cadence.after(cadence.Cron(monitor.cron or "", monitor.tz), basis).at


def fresh(monitor: Monitor, basis: datetime, change: Change | None = None) -> Verdict:
    """Up, its next ping expected from `basis`."""
    expected = expected_after(monitor, basis)
    return Verdict(UP, basis, expected, expected, change)


def made(monitor: Monitor) -> Verdict:
    """A new monitor: up, its first ping expected from when it was made."""
    return fresh(monitor, monitor.created_at)


def judge(monitor: Monitor, *, now: datetime, gap: Gap | None) -> Verdict:
    """Where a monitor whose check time has come stands at `now`, in a pass that follows
    `gap` (None: the passes before it judged monitors as ever). Its basis is its last ping
    when that is newer (the pings of an up monitor move only that)."""
    basis = max(monitor.basis_at, monitor.last_ping_at or monitor.basis_at)
    expected = expected_after(monitor, basis)
    down_at = expected + monitor.grace
    state = UP if now < expected else LATE if now < down_at else DOWN
    if state == UP:
        back = None if monitor.state == UP else Change(monitor.state, UP, "pinged in time")
        return Verdict(UP, basis, expected, expected, back)
    if state == monitor.state:
        return Verdict(state, basis, expected, down_at if state == LATE else None)
    due = expected if state == LATE else down_at
    if gap is not None and in_gap(due, gap):
        since = None if gap.since is None else gap.since.isoformat()
        why = (
            f"nothing judged monitors from {since or 'its start'} to {now.isoformat()} (corral"
            " was stopped, or the scheduler that judged them died): a fresh period and grace"
            " from now"
        )
        noted = Change(monitor.state, UP, why, {"gap_from": since, "gap_to": now.isoformat()})
        return fresh(monitor, now, noted)
    change = _late(monitor.state, state, due)
    return Verdict(state, basis, expected, down_at if state == LATE else None, change)


def in_gap(due: datetime, gap: Gap) -> bool:
    """Whether a deadline `due` passed in `gap`: after the last pass before it."""
    return gap.since is None or due > gap.since


def _late(frm: str, state: str, due: datetime) -> Change:
    what = "no ping by its expected time" if state == LATE else "no ping by its grace's end"
    return Change(frm, state, f"{what} ({due.isoformat()})")


def pinged(monitor: Monitor, *, kind: str, exit_code: int | None, now: datetime) -> Verdict | None:
    """Where a ping leaves a monitor (None: where it was; a start changes nothing, nor does
    any ping of a paused monitor). A success makes it up, counted from now; a failure,
    failed."""
    if kind == START or monitor.state == PAUSED:
        return None
    if kind == FAIL:
        said = "a failure ping" if exit_code is None else f"a ping with exit code {exit_code}"
        change = None if monitor.state == FAILED else Change(monitor.state, FAILED, said)
        return Verdict(FAILED, now, None, None, change)
    change = None if monitor.state == UP else Change(monitor.state, UP, "a ping")
    return fresh(monitor, now, change)


def paused(monitor: Monitor) -> Verdict:
    """Paused: not judged, whatever its pings."""
    return Verdict(PAUSED, monitor.basis_at, None, None, Change(monitor.state, PAUSED, "paused"))


def reshaped(monitor: Monitor, now: datetime) -> Verdict:
    """A monitor given another period, cron or grace (`corral apply`): an up or late one's
    next ping expected by them from its basis (its last ping when newer), and judged again
    at `now`, so that the judge settles its state by them; a down, failed or paused one
    waits for a ping or a resume, as before."""
    if monitor.state not in (UP, LATE):
        return Verdict(monitor.state, monitor.basis_at, monitor.expected_at, monitor.check_at)
    basis = max(monitor.basis_at, monitor.last_ping_at or monitor.basis_at)
    return Verdict(monitor.state, monitor.basis_at, expected_after(monitor, basis), now)


def resumed(monitor: Monitor, now: datetime) -> Verdict:
    """Resumed: up, its next ping expected from now."""
    return fresh(monitor, now, Change(PAUSED, UP, "resumed"))


def ping_kind(action: str | None) -> tuple[str, int | None]:
    """What a ping URL's last part says: none, a success; `start`; `fail`; an exit code
    (0 a success, any other a failure). InvalidInput for anything else."""
    if action is None:
        return SUCCESS, None
    if action in (START, FAIL):
        return action, None
    if action.isascii() and action.isdigit() and len(action) <= 3 and int(action) <= 255:
        code = int(action)
        return (SUCCESS if code == 0 else FAIL), code
    raise errors.InvalidInput(f"path: {action!r} is not start, fail nor an exit code 0-255")


def rate(window_at: datetime | None, count: int, now: datetime) -> tuple[datetime, int] | None:
    """A monitor's ping window (the second it began, and its pings in it) after one more
    ping at `now`; None when that would be more than PINGS_A_SECOND in one second."""
    second = now.replace(microsecond=0)
    if window_at is None or window_at != second:
        return second, 1
    if count >= PINGS_A_SECOND:
        return None
    return second, count + 1


def ping_url(base: str, key: str) -> str:
    """A monitor's ping URL under the public address."""
    return f"{base.rstrip('/')}/ping/{key}"


def rule_name(monitor: str) -> str:
    """The name of the alert rule a monitor's --channel makes."""
    return f"monitor-{monitor}"


def rule_of(monitor: str, channels: list[str]) -> dict[str, Any]:
    """The fields of the alert rule a monitor's --channel makes: its three causes, this
    monitor only, to `channels`."""
    return {"on": list(CAUSES.values()), "match": {"monitor": monitor}, "channels": channels}
