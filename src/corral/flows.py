"""Flows, flow control per destination, as values (pure): what a request may say of a flow,
and how much room one has now.

A flow is a tenant's object, named within its tenant: a rate (at most `rate` attempts
started within any window of `per`: a sliding window, the starts kept in the store) and a
parallelism (at most that many of its jobs running at once), either or both. A job or a
schedule names one; its jobs are claimed only while the flow has room (store/flow_claims.py),
and a 429 or 503 with Retry-After from any of them holds the whole flow until then.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from corral import errors

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
"""A flow's name, within its tenant."""
MAX_FLOWS = 100
"""The most flows one tenant may have."""
MAX_RATE = 100_000
"""The most starts a rate may allow in its window."""
MIN_PER, MAX_PER = timedelta(milliseconds=100), timedelta(days=1)
"""The shortest and the longest window of a rate."""
MAX_PARALLELISM = 100_000
"""The most jobs of one flow that may run at once."""
MAX_HOLD = timedelta(hours=1)
"""The longest a Retry-After holds a flow: a destination asking for more is waited for that
long, then asked again."""
HOLD_STATUSES = frozenset({429, 503})
"""The HTTP statuses whose Retry-After holds an attempt's whole flow."""
HELD = "held by its flow"
"""The cause `jobs explain` gives a job its flow holds."""
FIELDS = ("name", "rate", "parallelism")
"""A flow's fields as a request gives them (and `tenant`, for one of every tenant)."""


@dataclass(frozen=True, slots=True)
class Rate:
    """At most `count` starts within any window of `per`."""

    count: int
    per: timedelta

    def __str__(self) -> str:
        return f"{self.count}/{_written(self.per)}"


@dataclass(frozen=True, slots=True)
class Flow:
    """A tenant's flow as stored: its limits (None: none of that kind) and its hold."""

    id: int
    tenant: str
    name: str
    rate: Rate | None
    parallelism: int | None
    held_until: datetime | None
    held_reason: str | None
    created_at: datetime
    updated_at: datetime

    def held(self, now: datetime) -> bool:
        """Whether a Retry-After holds the flow at `now`."""
        return self.held_until is not None and self.held_until > now

    def as_at(self, now: datetime) -> Flow:
        """The flow as shown at `now`: a hold that has ended (its time stays stored, as no
        write clears it) is no hold."""
        if self.held(now) or self.held_until is None:
            return self
        return dataclasses.replace(self, held_until=None, held_reason=None)


@dataclass(frozen=True, slots=True)
class Use:
    """What a flow uses now: how many starts its window counts, its jobs running, and (once
    its rate is reached) `holding_start`: the start that must leave the window before the
    next may start (of those counted, the rate's count-th newest)."""

    started: int
    running: int
    holding_start: datetime | None = None


@dataclass(frozen=True, slots=True)
class Limits:
    """A flow's limits as a request sets them (update: None leaves one as it is; `clear`
    names those set to none)."""

    rate: Rate | None = None
    parallelism: int | None = None
    clear: frozenset[str] = frozenset()


def name_checked(name: Any) -> str:
    """`name`, when it may name a flow; InvalidInput naming the field if not."""
    if not isinstance(name, str) or not NAME.match(name):
        raise errors.InvalidInput(
            "name: required: letters, digits, '_', '.' and '-', at most 100, beginning with"
            " a letter or a digit"
        )
    return name


def rate_of(given: Any) -> Rate:
    """A rate written `N/PERIOD` (`10/1s`, `600/1m`); InvalidInput naming `rate` if not."""
    count, _, per = given.partition("/") if isinstance(given, str) else ("", "", "")
    if not count.strip().isdigit() or not per:
        raise errors.InvalidInput(
            f"rate: {given!r} is not N/PERIOD: at most N starts in any window of PERIOD,"
            " e.g. 10/1s or 600/1m"
        )
    from corral import durations  # pydantic's, which a command showing a flow need not load

    try:
        window = durations.parse_duration(per)
    except ValueError as exc:
        raise errors.InvalidInput(f"rate: {exc}") from None
    n = int(count)
    if not 1 <= n <= MAX_RATE:
        raise errors.InvalidInput(f"rate: N must be between 1 and {MAX_RATE}, not {n}")
    if not MIN_PER <= window <= MAX_PER:
        raise errors.InvalidInput(f"rate: PERIOD must be between 100ms and 1d, not {per!r}")
    return Rate(n, window)


def parallelism_of(given: Any) -> int:
    """A parallelism: a whole number from 1; InvalidInput naming `parallelism` if not."""
    if isinstance(given, str) and given.strip().isdigit():
        given = int(given)
    if isinstance(given, bool) or not isinstance(given, int) or not 1 <= given <= MAX_PARALLELISM:
        raise errors.InvalidInput(
            f"parallelism: a whole number between 1 and {MAX_PARALLELISM}, not {given!r}"
        )
    return given


def limits_of(body: Mapping[str, Any]) -> Limits:
    """The limits a request's body sets: `rate` and `parallelism`, each null (or the text
    `none`) for none; InvalidInput naming a field that is wrong or unknown."""
    if unknown := sorted(set(body) - {*FIELDS, "tenant"}):
        raise errors.InvalidInput(f"{unknown[0]}: unknown field (allowed: {', '.join(FIELDS)})")
    clear = frozenset(k for k in ("rate", "parallelism") if k in body and _none(body[k]))
    rate = body.get("rate")
    parallelism = body.get("parallelism")
    return Limits(
        rate=None if "rate" in clear or rate is None else rate_of(rate),
        parallelism=None
        if "parallelism" in clear or parallelism is None
        else parallelism_of(parallelism),
        clear=clear,
    )


def _none(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() == "none")


def room(flow: Flow, use: Use, now: datetime) -> int | None:
    """How many more of `flow`'s jobs may start at `now` (None: no limit): none while it is
    held, else the least its rate and its parallelism leave."""
    if flow.held(now):
        return 0
    left: list[int] = []
    if flow.rate is not None:
        left.append(flow.rate.count - use.started)
    if flow.parallelism is not None:
        left.append(flow.parallelism - use.running)
    return max(min(left), 0) if left else None


def next_start(flow: Flow, use: Use, now: datetime) -> datetime | None:
    """When the rate lets the next of `flow`'s jobs start (None: its rate has room now, or
    it has none): when the start that fills its rate (`use.holding_start`) leaves its
    window."""
    if flow.rate is None or use.started < flow.rate.count or use.holding_start is None:
        return None
    return use.holding_start + flow.rate.per


def why_waiting(flow: Flow, use: Use, now: datetime) -> str | None:
    """Why `flow` holds a queued job of its own at `now`, and when it may start; None when
    the flow has room. The cause (the words before the first colon) is HELD."""
    if flow.held(now):
        assert flow.held_until is not None
        return (
            f"{HELD}: flow {flow.name!r} is held until {_at(flow.held_until)}"
            f" ({flow.held_reason}); it may start then"
        )
    rate = flow.rate
    if rate is not None and (at := next_start(flow, use, now)) is not None:
        return (
            f"{HELD}: flow {flow.name!r} reached its rate {rate} (its last {rate.count} starts"
            f" were within {_written(rate.per)}); it may start at {_at(at)}"
        )
    if flow.parallelism is not None and use.running >= flow.parallelism:
        return (
            f"{HELD}: flow {flow.name!r} runs {use.running} of its jobs, its parallelism is"
            f" {flow.parallelism}; it may start when one of them ends"
        )
    return None


def hold_until(now: datetime, retry_after: float) -> datetime:
    """Until when a Retry-After of `retry_after` seconds holds a flow (at most MAX_HOLD)."""
    return now + min(timedelta(seconds=max(retry_after, 0.0)), MAX_HOLD)


def hold_reason(status: int, job_id: int) -> str:
    """What a flow's hold says it was: the status and the job whose attempt got it."""
    return f"a {status} with Retry-After from job {job_id}"


def _written(per: timedelta) -> str:
    """A window as a person writes it (durations.format_duration)."""
    from corral import durations  # pydantic's, which a command showing a flow need not load

    return durations.format_duration(per)


def _at(when: datetime) -> str:
    return when.isoformat(timespec="milliseconds")
