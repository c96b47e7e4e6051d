"""The overview's charts: jobs that succeeded, and that failed or were quarantined, per
minute over the last hour and per hour over the last day, as bar charts drawn on the
server (inline SVG: no script, nothing fetched from elsewhere).

`windows` says which spans to count, aligned to whole minutes and hours so that a bar's
count does not change as the clock moves within it; `chart` turns the counts into bars."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

WIDTH, HEIGHT = 600, 120
"""The drawing's size in SVG units (it scales to the page's width)."""


@dataclass(frozen=True, slots=True)
class Window:
    """A chart's span: `buckets` bars `width` long from `since`, the last one holding now."""

    title: str
    since: datetime
    width: timedelta
    buckets: int
    label: str  # strftime of a bar's start, shown in its tooltip


@dataclass(frozen=True, slots=True)
class Bar:
    """One bar: where it is drawn, its two parts' heights, and what it counts."""

    x: float
    width: float
    succeeded_height: float
    failed_height: float
    succeeded: int
    failed: int
    starts: str


@dataclass(frozen=True, slots=True)
class Chart:
    window: Window
    bars: list[Bar]
    succeeded: int
    failed: int
    top: int  # the count a full-height bar stands for


def windows(now: datetime) -> list[Window]:
    """The last hour by minute and the last day by hour, each ending with the minute
    (hour) that holds `now`."""
    minute = now.replace(second=0, microsecond=0)
    hour = minute.replace(minute=0)
    return [
        Window("Last hour, per minute", minute - timedelta(minutes=59), timedelta(minutes=1),
               60, "%H:%M"),
        Window("Last day, per hour", hour - timedelta(hours=23), timedelta(hours=1), 24,
               "%a %H:00"),
    ]  # fmt: skip


def chart(window: Window, counts: list[tuple[int, int]]) -> Chart:
    """The bars of `window` from its (succeeded, failed) counts per bucket: each bar's
    height is its total against the highest one's; failures stacked on top in their own
    colour."""
    top = max((ok + bad for ok, bad in counts), default=0)
    step = WIDTH / window.buckets
    scale = HEIGHT / top if top else 0.0
    bars = [
        Bar(
            x=round(i * step, 2),
            width=round(step * 0.8, 2),
            succeeded_height=round(ok * scale, 2),
            failed_height=round(bad * scale, 2),
            succeeded=ok,
            failed=bad,
            starts=(window.since + window.width * i).strftime(window.label),
        )
        for i, (ok, bad) in enumerate(counts)
    ]
    return Chart(window, bars, sum(b.succeeded for b in bars), sum(b.failed for b in bars), top)
