"""Durations as settings and policies write them: seconds, or `500ms`, `90s`, `4m`, `1h30m`.

Every time limit corral reads (settings, a job's policy, an alert rule) goes through
`Duration`, so they all accept the same spellings and refuse the same mistakes.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer

_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
MIN_DURATION, MAX_DURATION = 0.001, 365 * 86400.0
_NUMBER = re.compile(r"\d+(\.\d+)?")


def parse_duration(value: Any) -> timedelta:
    """Seconds (a number or a numeric string) or a string such as `90s`, `4m`, `1h30m`."""
    seconds = _seconds(value)
    if seconds is None:
        raise ValueError(f"{value!r} is not a duration: use seconds or e.g. 500ms, 90s, 4m, 1h")
    if not MIN_DURATION <= seconds <= MAX_DURATION:
        raise ValueError(f"{value!r}: a duration must be between 1ms and 365 days")
    return timedelta(seconds=seconds)


def format_duration(value: timedelta) -> str:
    """A duration as a person writes it (and parse_duration reads it): 500ms, 2.5s, 5m, 1h30m."""
    seconds = value.total_seconds()
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    if seconds < 60 or seconds != int(seconds):
        return f"{seconds:g}s"
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = ((days, "d"), (hours, "h"), (minutes, "m"), (secs, "s"))
    return "".join(f"{n}{unit}" for n, unit in parts if n)


def _seconds(value: Any) -> float | None:
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if not isinstance(value, str) or not (text := value.strip().lower()):
        return None
    if _NUMBER.fullmatch(text):
        return float(text)
    if _DURATION.sub("", text) == "":
        return sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION.findall(text))
    return None


Duration = Annotated[
    timedelta,
    BeforeValidator(parse_duration),
    PlainSerializer(lambda d: d.total_seconds(), return_type=float),
]
