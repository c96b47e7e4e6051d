"""The dashboard's charts, drawn on the server (inline SVG: no script, nothing fetched from
elsewhere): on the overview, jobs that succeeded, and that failed or were quarantined, per
minute over the last hour and per hour over the last day; on a schedule's page, its
firings' jobs that succeeded and failed, per hour over the last 24 hours and per day over
the last 30, with their mean response time as a line beneath.

`windows` says which spans the overview counts, aligned to whole minutes and hours so that
a bar's count does not change as the clock moves within it; `chart` turns counts into
bars, `line` values into a line's points."""

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


LINE_TOP, LINE_HEIGHT = 140, 60
"""Where a line beneath the bars is drawn (its top, in SVG units) and how high it is."""


@dataclass(frozen=True, slots=True)
class Point:
    """One bucket's value on a line: where it is drawn, and what it says."""

    x: float
    y: float
    value: float
    starts: str


@dataclass(frozen=True, slots=True)
class Line:
    """A line of a value per bucket beneath the bars (a bucket with none has no point),
    `top` the value its full height stands for."""

    points: list[Point]
    top: float

    @property
    def path(self) -> str:
        """The points as an SVG polyline's `points`."""
        return " ".join(f"{p.x},{p.y}" for p in self.points)


def line(window: Window, values: list[float | None]) -> Line:
    """The points of `values` (one a bucket of `window`, None where there is none), each
    at its bar's middle, its height against the highest value's."""
    top = max((v for v in values if v is not None), default=0.0)
    step = WIDTH / window.buckets
    points = [
        Point(
            x=round(i * step + step * 0.4, 2),
            y=round(LINE_TOP + LINE_HEIGHT - (value / top * LINE_HEIGHT if top else 0.0), 2),
            value=value,
            starts=(window.since + window.width * i).strftime(window.label),
        )
        for i, value in enumerate(values)
        if value is not None
    ]
    return Line(points=points, top=top)
