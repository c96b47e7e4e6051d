"""A schedule's page, /ui/schedules/{tenant}/{name}: its settings (for an HTTP job, the
request it will send, its secrets redacted), its next firings to the second in its zone and
in UTC (those a DST change moved marked), its success rate and response times over the last
24 hours by hour and the last 30 days by day (two SVG charts), and its firings a page at a
time, the latest first (keyset: ?before=<a page's last nominal time>). Operators see its
actions (schedule_actions.html); viewers the same page without them. Another tenant's
schedule is not found (404)."""

from __future__ import annotations

import json
import shlex
import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Request
from starlette.responses import Response

from corral import (
    access,
    autopause,
    cadence,
    client,
    config,
    durations,
    errors,
    firing_stats,
    model,
    policy,
    redaction,
    scheduling,
)
from corral.client import schedule_reads
from corral.web import auth, charts, sends
from corral.web.auth import Viewer
from corral.web.pages import page

UPCOMING_SHOWN = 10
"""Next firings the page shows."""
FIRINGS_SHOWN = 50
"""Firings on one page of the history."""

router = APIRouter(prefix="/ui", include_in_schema=False)

Row = tuple[str, str | list[str]]
"""A setting as the page shows it: its name, and its value (a list: one a line)."""


@router.get("/schedules/{tenant}/{name}")
async def schedule_page(
    request: Request, who: Viewer, tenant: str, name: str, before: str = ""
) -> Response:
    """The schedule's page; ?before= a nominal time (a page's last): its older firings."""
    c = auth.client_of(request)
    found = await _visible(c, who, tenant, name)
    wrong, at = "", None
    try:
        at = schedule_reads.firing_cursor(before) if before else None
    except errors.InvalidInput as exc:
        wrong = str(exc)
    history, stats = await c.page_of(found, before=at, limit=FIRINGS_SHOWN)
    if wrong:
        history = schedule_reads.FiringPage(rows=[], next=None)
    return page(
        request,
        "schedule.html",
        who,
        schedule=found,
        settings=settings_of(found, c.settings),
        upcoming=[(in_zone(n, found.tz), n) for n in c.upcoming(found, UPCOMING_SHOWN)],
        stats=stats,
        charts=drawn(stats),
        history=history,
        older=urlencode({"before": model.iso(history.next)}) if history.next else "",
        here=f"/ui/schedules/{quote(found.tenant, safe='')}/{quote(found.name, safe='')}",
        wrong=wrong,
        status=422 if wrong else 200,
    )


async def _visible(
    c: client.Client, who: access.WebSession, tenant: str, name: str
) -> scheduling.Schedule:
    """The schedule, if the session's tenant may see it; else 404, as for none."""
    if not auth.sees(who, tenant):
        raise errors.PageMissing(f"no schedule {name!r}")
    try:
        return await c.schedule(name, tenant=tenant)
    except errors.NotFound:
        raise errors.PageMissing(f"no schedule {name!r}") from None


def in_zone(nominal: cadence.Nominal, tz: str) -> str:
    """A nominal time as wall time in the schedule's zone, to the second, with the zone's
    abbreviation (an interval's too: its times are UTC's, shown in its zone)."""
    try:
        local = nominal.at.astimezone(zoneinfo.ZoneInfo(tz))
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        local = nominal.local
    if nominal.local.utcoffset() == local.utcoffset():
        local = nominal.local  # a cron time keeps its own fold in a repeated hour
    return local.strftime("%Y-%m-%d %H:%M:%S %Z")


# --- its settings --------------------------------------------------------------------------------


def settings_of(s: scheduling.Schedule, settings: config.Settings) -> list[Row]:
    """What the page's settings table shows: when it fires, then the job it makes."""
    if s.paused_at is not None:
        state = f"paused since {_when(s.paused_at)}"
        if s.paused_reason:
            state += f": {s.paused_reason}"
    else:
        state = "active" if s.next_due is not None else "ended (past its until)"
    rule = f"cron {s.cron}" if s.cron else f"every {_duration(s.every_seconds or 0)}"
    catchup = (
        f"all, within {_duration(s.catchup_window_seconds)}, at most {s.catchup_max}"
        if s.catchup == scheduling.Catchup.ALL
        else "none (the latest missed time only)"
    )
    rows: list[Row] = [
        ("state", state),
        ("rule", rule),
        ("time zone", s.tz),
        ("start", _when(s.anchor)),
        ("until", _when(s.until) if s.until else "never"),
        ("catch-up", catchup),
        ("overlap", s.overlap.value),
        ("jitter", _duration(s.jitter_seconds) if s.jitter_seconds else "none"),
        ("pause after", _pause_after(s, settings)),
        ("missed so far", str(s.missed_total)),
    ]
    return rows + job_rows(s.template, settings)


def _pause_after(s: scheduling.Schedule, settings: config.Settings) -> str:
    """When corral pauses the schedule (corral.autopause), and whose setting that is."""
    count = autopause.effective(s, settings.tenants)
    said = f"{count} failed firings in a row" if count else "never"
    return said if s.pause_after is not None else f"{said} (the tenant's default)"


def job_rows(template: Mapping[str, Any], settings: config.Settings) -> list[Row]:
    """A job template as the page shows it: what runs (an HTTP request: its method, URL and
    headers, secrets redacted, and the statuses that mean success), its limits, and where
    it runs."""
    executor = str(template.get("executor") or "process")
    spec = redaction.redacted(dict(template.get("spec") or {}))
    limits = policy.JobPolicy.read(template.get("policy")).limits
    rows: list[Row] = [("runs on", executor), *_what_runs(executor, spec)]
    if executor == "http":
        timeout = limits.http_request_timeout
        rows.append(("request timeout", _limit(timeout, settings.timeouts.http_request_timeout)))
    rows.append(("deadline", _limit(limits.attempt_deadline, settings.timeouts.attempt_deadline)))
    labels = template.get("labels") or {}
    tries = template.get("max_attempts")
    rows += [
        ("queue", str(template.get("queue") or "default")),
        ("pool", str(template.get("pool") or "none")),
        ("priority", str(template.get("priority") or 0)),
        ("max attempts", str(tries) if tries else f"{settings.default_max_attempts} (default)"),
        ("labels", [f"{k}={v}" for k, v in labels.items()] or "none"),
    ]
    for field, label in (("callback", "callback"), ("failure_callback", "failure callback")):
        if template.get(field):
            rows.append((label, redaction.redacted(str(template[field]))))
    return rows


def _what_runs(executor: str, spec: Mapping[str, Any]) -> list[Row]:
    """The rows of what a job runs: its request, task or command."""
    if executor == "http":
        headers = [f"{k}: {v}" for k, v in (spec.get("headers") or {}).items()]
        body = "none"
        if "json" in spec:
            body = f"JSON, {len(json.dumps(spec['json'], separators=(',', ':')))} bytes"
        elif "body" in spec:
            body = f"{len(str(spec['body']).encode())} bytes"
        return [
            ("method", str(spec.get("method") or "GET")),
            ("URL", str(spec.get("url") or "")),
            ("headers", headers or "none"),
            ("body", body),
            ("expected statuses", ", ".join(spec.get("expect") or ["2xx"])),
            ("assertions", sends.assertions(spec) or "none"),
        ]
    if "task" in spec:
        return [("task", f"{spec['task']} (payload version {spec.get('version', '?')})")]
    rows: list[Row] = []
    if "image" in spec:
        rows.append(("image", str(spec["image"])))
    command = spec.get("command")
    if isinstance(command, list):
        rows.append(("command", shlex.join(str(part) for part in command)))
    return rows


def _limit(given: timedelta | None, default: timedelta) -> str:
    if given is None:
        return f"{durations.format_duration(default)} (default)"
    return durations.format_duration(given)


def _duration(seconds: float) -> str:
    return durations.format_duration(timedelta(seconds=seconds))


def _when(at: datetime) -> str:
    return at.strftime("%Y-%m-%d %H:%M:%S UTC")


# --- its charts ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Drawn:
    """One window's chart: its bars (jobs that succeeded and failed), the line of its
    mean response times, and the tallies they were drawn from, one a bar."""

    key: str  # "24h" or "30d": the chart's id is chart-{key}
    bars: charts.Chart
    line: charts.Line
    span: firing_stats.Span

    def buckets(self) -> list[tuple[charts.Bar, firing_stats.Tally]]:
        return list(zip(self.bars.bars, self.span.buckets, strict=True))


def drawn(stats: firing_stats.Stats) -> list[Drawn]:
    """The page's two charts: the last 24 hours by hour, the last 30 days by day."""
    out = []
    for key, title, span, label in (
        ("24h", "Last 24 hours, per hour (UTC)", stats.last_24h, "%a %H:00"),
        ("30d", "Last 30 days, per day (UTC)", stats.last_30d, "%a %d %b"),
    ):
        window = charts.Window(title, span.start, span.width, len(span.buckets), label)
        bars = charts.chart(window, [(b.succeeded, b.failed) for b in span.buckets])
        line = charts.line(window, [b.latency_mean for b in span.buckets])
        out.append(Drawn(key=key, bars=bars, line=line, span=span))
    return out
