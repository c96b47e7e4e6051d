"""The dashboard's overview (/ui/): jobs by state, the charts of job ends (charts.py), the
newest quarantined jobs, the pools in use, each queue's retry budget, the tenant's quotas
with its use of them and the failing schedules, read in one call of the store (and one for
the quotas) and kept for a few seconds; for a session of all tenants, every tenant's
quotas, and corral's own loops (`corral status`) and the work that waits for one nobody
runs.

A busy overview (many people, or one page updating live) would read the same numbers over
and over: what it shows of a tenant is kept for KEEP_SECONDS, drawn once, and every view
in that time shows it with when it was read ("as of 12:30:05 UTC, 3 s ago"); the views
that find it old at once share one read. Nothing kept
hides a change made through this process: any request that may change something (not a
GET), of the dashboard or the API, drops what is kept, so the page after a retry or a
cancel reads anew; so does `?fresh=1`. What changes elsewhere (the dispatcher, another
process) shows within KEEP_SECONDS. A chart's past buckets are kept longer: until the
window moves past them, as they gain no more job ends."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from fastapi import APIRouter, Request
from markupsafe import Markup
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral import client, errors, loops, model, retry, usage
from corral.web import auth, charts, live, pages
from corral.web.auth import Viewer

KEEP_SECONDS = 5.0
"""How long the overview of a tenant, once read, is shown again without reading it."""
LIVE_BUCKETS = 2
"""The newest buckets of a chart, read with the rest of the overview; the older ones are
over (a job end is written as it happens, so a bucket two widths old gains no more) and
are read once a process, until the window moves past them."""
TENANTS_SHOWN = 50
"""The most tenants whose quotas the overview of a session of all tenants shows."""
QUOTA_COLUMNS = {
    "max_running": "running",
    "max_queued": "waiting",
    "max_schedules": "schedules",
    "submit_rate": "submits a minute",
    "run_log_bytes": "run logs kept",
}
"""The quotas the overview shows, by their column's heading (use, limit and a bar)."""
SAFE = frozenset({"GET", "HEAD", "OPTIONS"})
ATTEMPT_CALLS = "/api/v1/attempt/"
"""A running attempt's own calls (heartbeat, checkpoint): they change nothing shown."""

router = APIRouter(prefix="/ui", include_in_schema=False)
Buckets = list[tuple[int, int]]
Span = tuple[datetime, timedelta, int]
"""(since, width, buckets): `buckets` spans `width` long from `since`, what a chart counts
job ends over."""


@dataclass(frozen=True, slots=True)
class Kept:
    """The overview of one tenant, drawn: shown again until `until` (monotonic)."""

    parts: Markup
    read_at: datetime
    until: float


@dataclass
class Keeper:
    """What the overview keeps, in the app's state: each tenant's last drawing, and each
    tenant's chart's past buckets with where its window began."""

    generation: int = 0
    drawn: dict[str | None, Kept] = field(default_factory=dict)
    past: dict[tuple[str | None, str], tuple[datetime, Buckets]] = field(default_factory=dict)
    reading: dict[tuple[str | None, int], asyncio.Task[Kept]] = field(default_factory=dict)

    def changed(self) -> None:
        """Something may have changed: no drawing kept so far is shown again."""
        self.generation += 1
        self.drawn.clear()

    def fresh(self, tenant: str | None, now: float) -> Kept | None:
        kept = self.drawn.get(tenant)
        return kept if kept is not None and kept.until > now else None

    async def shared(
        self, tenant: str | None, draw: Callable[[], Coroutine[Any, Any, Kept]]
    ) -> Kept:
        """`draw()`'s drawing, or that of the same tenant's read begun already since the
        last change: the views that find the drawing old at once wait for one read, not a
        read each (one that is let go does not stop it for the others)."""
        key = (tenant, self.generation)
        task = self.reading.get(key)
        if task is None:
            task = self.reading[key] = asyncio.create_task(draw())
            task.add_done_callback(lambda _: self.reading.pop(key, None))
        return await asyncio.shield(task)


class Changes:
    """ASGI middleware: a request that may have changed something (any method but GET,
    HEAD and OPTIONS, not refused: its answer under 400; not an attempt's own calls) tells
    the keeper once its answer starts, that is after its change was made, so the next
    overview reads anew. A refused one (a guess without a token) changed nothing."""

    def __init__(self, app: ASGIApp, *, keeper: Keeper) -> None:
        self.app = app
        self.keeper = keeper

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] in SAFE
            or scope["path"].startswith(ATTEMPT_CALLS)
        ):
            await self.app(scope, receive, send)
            return

        async def told(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] < 400:
                self.keeper.changed()
            await send(message)

        await self.app(scope, receive, told)


def keeper_of(request: Request) -> Keeper:
    kept: Keeper = request.app.state.overview
    return kept


@router.get("/")
async def overview(request: Request, who: Viewer, fresh: bool = False) -> Response:
    """The overview of the session's tenant: the one kept if it is fresh (and not
    `fresh` asked for), else read and drawn anew."""
    c, keeper = auth.client_of(request), keeper_of(request)
    if fresh:
        kept = await drawn(c, keeper, who.tenant)
    else:
        kept = keeper.fresh(who.tenant, c.clock.monotonic()) or await keeper.shared(
            who.tenant, lambda: drawn(c, keeper, who.tenant)
        )
    return pages.page(request, "overview.html", who, parts=kept.parts, **_freshness(c, kept))


@router.get("/overview/stream")
async def overview_stream(request: Request, who: Viewer) -> Response:
    """The overview's parts pushed as they change (live.py): looked at every
    KEEP_SECONDS (the drawing kept, or drawn anew once it is older), with when they
    were read each time they were read again."""
    c, keeper = auth.client_of(request), keeper_of(request)
    latest: Kept | None = None
    shown = Markup()

    async def look() -> datetime:
        nonlocal latest
        latest = keeper.fresh(who.tenant, c.clock.monotonic()) or await keeper.shared(
            who.tenant, lambda: drawn(c, keeper, who.tenant)
        )
        return latest.read_at

    async def draw() -> live.Drawn:  # after a look: `latest` is what it saw
        nonlocal shown
        assert latest is not None
        parts = {} if latest.parts == shown else {"live": str(latest.parts)}
        shown = latest.parts
        fresh = pages.render(request, "overview_fresh.html", who, **_freshness(c, latest))
        return live.Drawn({**parts, "fresh": fresh})

    return live.stream(request, look, draw, every=KEEP_SECONDS)


def _freshness(c: client.Client, kept: Kept) -> dict[str, Any]:
    age = max(0.0, (c.clock.now() - kept.read_at).total_seconds())
    return {"read_at": kept.read_at, "age": age, "keep": KEEP_SECONDS}


async def drawn(c: client.Client, keeper: Keeper, tenant: str | None) -> Kept:
    """`tenant`'s overview read and drawn now, and kept unless something changed meanwhile."""
    generation, now, monotonic = keeper.generation, c.clock.now(), c.clock.monotonic()
    windows = charts.windows(now)
    spans, past = _spans(keeper, tenant, windows)
    slots = dict(c.settings.pools)
    found = await c.overview(
        tenant=tenant,
        spans=[s for s, _ in spans],
        quarantined=pages.QUARANTINED_SHOWN,
        pools=sorted(slots),
        budgets=tenant is None,  # queues are every tenant's: only for a session of all
    )
    ends = dict(zip([key for _, key in spans], found.ends, strict=True))
    # corral's own processes are the operator's: shown to a session of all tenants only.
    status = await c.loops.status() if tenant is None else None
    html = pages.templates.get_template("overview_parts.html").render(
        loops=_shown_loops(status),
        warnings=list(status.warnings.values()) if status is not None else [],
        counts=[(state, *found.counts[state]) for state in model.JobState],
        charts=_charts(keeper, tenant, windows, past, ends),
        quarantined=found.quarantined,
        failing=found.failing,
        pools=[(name, found.running.get(name, 0), size) for name, size in sorted(slots.items())],
        budgets=_budgets(c, found.budgets),
        quotas=await _quotas(c, tenant),
        quota_columns=list(QUOTA_COLUMNS.values()),
    )
    kept = Kept(Markup(html), now, monotonic + KEEP_SECONDS)
    if keeper.generation == generation:  # else a change came meanwhile: shown once, not kept
        keeper.drawn[tenant] = kept
    return kept


def _charts(
    keeper: Keeper,
    tenant: str | None,
    windows: list[charts.Window],
    past: dict[str, Buckets],
    ends: dict[tuple[str, str], Buckets],
) -> list[charts.Chart]:
    """Each window's chart: its past buckets (kept, or read now and kept from now on for
    where the window begins), then its live ones."""
    drawn = []
    for w in windows:
        old = ends.get((w.title, "past"))
        if old is None:
            old = past[w.title]
        else:
            keeper.past[(tenant, w.title)] = (w.since, old)
        drawn.append(charts.chart(w, [*old, *ends[(w.title, "live")]]))
    return drawn


def _spans(
    keeper: Keeper, tenant: str | None, windows: list[charts.Window]
) -> tuple[list[tuple[Span, tuple[str, str]]], dict[str, Buckets]]:
    """What to count of each chart's window, each with (its title, "past" or "live"): its
    live buckets always, its past ones when they are not kept for where it begins now; and
    the past buckets kept, by title."""
    spans, past = [], {}
    for w in windows:
        over = w.buckets - LIVE_BUCKETS
        since, old = keeper.past.get((tenant, w.title), (None, None))
        if since == w.since and old is not None:
            past[w.title] = old
        else:
            spans.append(((w.since, w.width, over), (w.title, "past")))
        live = (w.since + w.width * over, w.width, LIVE_BUCKETS)
        spans.append((live, (w.title, "live")))
    return spans, past


def _shown_loops(status: loops.Status | None) -> list[tuple[loops.Loop, str, float]]:
    """The live and stale loops: (loop, its state, seconds since its last beat)."""
    if status is None:
        return []
    shown = (loops.Liveness.LIVE, loops.Liveness.STALE)
    return [
        (loop, state.value, max(0.0, (status.now - loop.beat_at).total_seconds()))
        for loop, state in status.loops
        if state in shown
    ]


@dataclass(frozen=True, slots=True)
class QuotaRow:
    """A tenant's row of the quotas table: its weight, its payload limit, and of each quota
    of QUOTA_COLUMNS its use and limit as a person reads them and the part used (a bar)."""

    tenant: str
    weight: float
    payload: str
    cells: list[tuple[str, str, float | None]]


async def _quotas(c: client.Client, tenant: str | None) -> tuple[list[QuotaRow], int]:
    """The quotas table of `tenant` (None: of every tenant, the first TENANTS_SHOWN by
    name), and how many tenants it leaves out."""
    try:
        views = [await c.tenant_view(tenant)] if tenant is not None else await c.tenant_views()
    except errors.NotFound:  # a session of a tenant corral no longer knows of
        views = []
    rows = [
        QuotaRow(
            tenant=view.tenant,
            weight=view.weight,
            payload=usage.said(view.quota("max_payload_bytes"))[1],
            cells=[
                (*usage.said(view.quota(name)), view.quota(name).share) for name in QUOTA_COLUMNS
            ],
        )
        for view in views[:TENANTS_SHOWN]
    ]
    return rows, max(len(views) - TENANTS_SHOWN, 0)


def _budgets(c: client.Client, buckets: dict[str, retry.Bucket]) -> list[tuple[str, float, float]]:
    """Each queue's retry budget now: (queue, tokens, burst)."""
    budget, now = retry.Budget.from_settings(c.settings), c.clock.now()
    return [(q, budget.refill(b, now, 0), budget.burst) for q, b in sorted(buckets.items())]
