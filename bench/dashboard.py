"""The dashboard's pages over a hosted cron's store, each against its own statements run
bare through psycopg, and the overview against the API's own job list, all in one run.

    .venv/bin/python bench/dashboard.py [--jobs 1000000] [--events 5000000]
        [--schedules 10000] [--firings 100000] [--clients 8] [--requests 200] [--alone 20]
        [--pg-url URL] [--sql]

A fresh PostgreSQL database, migrated by corral, is loaded by bench/dashboard_load.py (not
timed; `load_s` says how long): `--schedules` schedules over ten tenants, one of them
(tenant-3's `heartbeat`) with `--firings` firings and their jobs, the others' firings and
jobs, one-off HTTP and command jobs, `--jobs` jobs in all, with their attempts, run logs
and `--events` events. `corral api --http` serves the real app, dashboard and API, in a
process of its own (nothing dispatches).

The pages are a table (`table`): each a path, a query and whose session asks for it (a
viewer of every tenant, or of tenant-3), and what it is measured against:

  * the cron's pages (issue 39's target: p95 under 300 ms and at most 2x its own
    statements run bare): the jobs list unfiltered and by each filter (state, queue,
    label, URL text, a schedule, the big schedule), the schedules list (every tenant's,
    one tenant's, a page further on by name), the big schedule's page and an older page
    of its firings;
  * the overview (`/ui/`) as people get it and read anew (`?fresh=1`), for every tenant
    and for one, against the API's list `/api/v1/jobs?limit=50` (p95 at most 300 ms and
    3x the list's: the targets they had; kept, an overview reads nothing most times, so
    its own statements are no measure of it);
  * `/healthz`, which reads nothing: what any request costs through the server and back.

First each page is asked for in this process (bench/page_sql.py): its answer and the
statements the store ran for it. A page that answers 404, or a filtered one that runs its
unfiltered page's very statements (the filter not read), is not timed and is listed in
`missing` with why: pages land one by one, and a page not there is said, never skipped
in silence. Then `--clients` clients, each signed in to the dashboard with a viewer's API
token of every tenant and of tenant-3 (the sign-in form, as a browser does) and with a
psycopg connection of its own, each run `--requests` page requests and, beside each
request of a cron page, one bare run of that page's statements (every row fetched), all
shuffled: page and bare side by side under the same load, in the same run; the cron's pages
first, then the overviews with the API's list (PHASES). Each client goes on as soon as it
has its answer. Then one client alone asks for each page, and runs
its statements, `--alone` times.

JSON on stdout: each page's p50/p95 in ms (under load and alone), its statements and their
bare p50/p95, the ratio, whether it meets its target; `missing`; `warnings` (a page that
lists nothing where it should list something: the load may not fill what it reads; a page
of which no statement was caught; `/healthz` slow alone: answers held up on their way);
what the server process spent; the load's and the run's seconds. `meets_targets` holds only if
every page was measured and each meets its target (the overview as people get it);
`measured_meet_targets` over those measured; `cold_meets_targets` over the overviews read
anew.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import random
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import api, dashboard_load, page_sql
from corral import config, runtime
from corral.api import create_app
from corral.web import auth, jobs

MAX_P95_MS = 300.0
"""The targets: a page's p95 under this (the overview's: at most this)."""
MAX_RATIO_BARE = 2.0
"""The target: a cron page's p95 at most this many times its statements' run bare."""
MAX_RATIO_LIST = 3.0
"""The target: the overview's p95 at most this many times the API list's."""

EVERY = "every"
TENANT = dashboard_load.BIG_TENANT
"""The tenant of the second session: one of ten, with a tenth of the jobs."""
API_LIST = "api_jobs"
FLOOR = "healthz"
"""A request that reads nothing: what any request costs through the server and back."""
FLOOR_MS = 10.0
"""A floor past this, alone, is said in `warnings`: answers are held up on the way."""
PAGE, BARE = "page", "bare"

JOB_ROW = r'href="/ui/jobs/\d+"'
SCHEDULE_ROW = r'<tr id="schedule-'
FIRING_ROW = r'<tr[^>]*class="[^"]*\bfiring\b'


@dataclass(frozen=True)
class Page:
    """One page of the table: what is asked, by whom, and what it is measured against
    ("bare": its own statements; "api_list": the API's list; None: the list itself)."""

    path: str
    query: dict[str, str | int] = field(default_factory=dict)
    session: str = EVERY
    against: str | None = BARE
    filtered: bool = False  # by its query: it must run other statements than without it
    lists: str | None = None  # what each row it lists has, once
    cold: bool = False  # an overview read anew at each request

    @property
    def get(self) -> str:
        return self.path + (f"?{httpx.QueryParams(self.query)}" if self.query else "")


def table(facts: dict[str, Any]) -> dict[str, Page]:
    """The pages timed, by name, over the loaded store's `facts` (dashboard_load.facts)."""
    big = facts["big"]
    big_page = f"/ui/schedules/{big['tenant']}/{big['name']}"
    return {
        "overview": Page("/ui/", against="api_list"),
        "overview_one_tenant": Page("/ui/", session=TENANT, against="api_list"),
        "overview_cold": Page("/ui/", {"fresh": "1"}, against="api_list", cold=True),
        "overview_one_tenant_cold": Page(
            "/ui/", {"fresh": "1"}, TENANT, against="api_list", cold=True
        ),
        API_LIST: Page("/api/v1/jobs", {"limit": jobs.JOBS_PAGE}, against=None),
        FLOOR: Page("/healthz", against=None),
        "jobs": Page("/ui/jobs", lists=JOB_ROW),
        "jobs_state": Page("/ui/jobs", {"state": "queued"}, filtered=True, lists=JOB_ROW),
        "jobs_queue": Page("/ui/jobs", {"queue": "queue-3"}, filtered=True, lists=JOB_ROW),
        "jobs_label": Page("/ui/jobs", {"label": "team=team-7"}, filtered=True, lists=JOB_ROW),
        "jobs_url": Page("/ui/jobs", {"url": "shop-417.example"}, filtered=True, lists=JOB_ROW),
        "jobs_schedule": Page(
            "/ui/jobs", {"schedule": facts["schedule_of_tenant"]}, TENANT, filtered=True,
            lists=JOB_ROW,
        ),
        "jobs_schedule_big": Page(
            "/ui/jobs", {"schedule": big["name"]}, TENANT, filtered=True, lists=JOB_ROW
        ),
        "schedules": Page("/ui/schedules", lists=SCHEDULE_ROW),
        "schedules_one_tenant": Page("/ui/schedules", session=TENANT, lists=SCHEDULE_ROW),
        "schedules_after": Page(
            "/ui/schedules", {"after": facts["middle_schedule"]}, filtered=True,
            lists=SCHEDULE_ROW,
        ),
        "schedule": Page(big_page, session=TENANT, lists=FIRING_ROW),
        "schedule_older": Page(
            big_page, {"before": big["middle"]}, TENANT, filtered=True, lists=FIRING_ROW
        ),
    }  # fmt: skip


# --- signing in and asking -----------------------------------------------------------------


async def sign_in(client: httpx.AsyncClient, secret: str) -> None:
    """Sign `client` in to the dashboard with API token `secret`: the sign-in form's
    pairing field (and its cookie), then the form posted; the session cookie kept."""
    form = await client.get("/ui/sign-in")
    found = re.search(r'name="pairing" value="([^"]+)"', form.text)
    if form.status_code != 200 or found is None:
        raise RuntimeError(f"GET /ui/sign-in: {form.status_code}, no pairing field")
    went = await client.post(
        "/ui/sign-in", data={"pairing": found[1], "next": "/ui/", "token": secret}
    )
    if went.status_code != 303 or auth.COOKIE not in client.cookies:
        raise RuntimeError(f"POST /ui/sign-in: {went.status_code} {went.text[:300]}")


class Sessions:
    """One signed-in httpx client per session (per token of `secrets`), on `transport` or
    to `base`; the API list asked with the bearer token of every tenant."""

    def __init__(self, secrets: dict[str, str], **client: Any) -> None:
        self.secrets = secrets
        self.clients = {who: httpx.AsyncClient(timeout=120, **client) for who in secrets}

    async def sign_in(self) -> None:
        for who, c in self.clients.items():
            await sign_in(c, self.secrets[who])

    async def ask(self, page: Page) -> httpx.Response:
        api_side = page.path.startswith("/api/")
        headers = {"Authorization": f"Bearer {self.secrets[EVERY]}"} if api_side else None
        return await self.clients[page.session].get(page.path, params=page.query, headers=headers)

    async def aclose(self) -> None:
        for c in self.clients.values():
            await c.aclose()


# --- each page's statements, and what is missing ----------------------------------------------


class Caught(dict[str, page_sql.Caught]):
    """Each page's answer and statements, by name, and each filtered page's unfiltered
    one's (the same path asked by the same session), by (path, session)."""

    def __init__(self) -> None:
        super().__init__()
        self.unfiltered: dict[tuple[str, str], page_sql.Caught] = {}


async def catch_all(url: str, pages: dict[str, Page]) -> tuple[dict[str, str], Caught]:
    """Viewers' tokens (of every tenant, of TENANT), and each page asked for in this process
    through the real app, with its unfiltered one: its answer and statements
    (page_sql.catch)."""
    settings = config.Settings(database_url=url)
    async with runtime.connect(settings, platforms=False) as c:
        secrets = {}
        for who in (EVERY, TENANT):
            tenant = None if who == EVERY else who
            _, secrets[who] = await c.token_create(
                name=f"bench-{who}", tenant=tenant, role="viewer"
            )
        recorder = page_sql.Recorder(c.store)
        transport = httpx.ASGITransport(app=create_app(c))
        sessions = Sessions(secrets, transport=transport, base_url="http://corral.bench")
        caught = Caught()
        try:
            await sessions.sign_in()
            for name, page in pages.items():
                caught[name] = await page_sql.catch(recorder, functools.partial(sessions.ask, page))
                twin = (page.path, page.session)
                if page.filtered and twin not in caught.unfiltered:
                    ask = functools.partial(sessions.ask, Page(page.path, session=page.session))
                    caught.unfiltered[twin] = await page_sql.catch(recorder, ask)
        finally:
            await sessions.aclose()
    return secrets, caught


def missing(pages: dict[str, Page], caught: Caught) -> dict[str, dict[str, Any]]:
    """The pages not timed, each with its status and why: not found (404), a filter not
    read (200, but the very statements the page runs without its query), or any other
    answer but 200 (its first words said)."""
    out: dict[str, dict[str, Any]] = {}
    for name, page in pages.items():
        got = caught[name]
        plain = caught.unfiltered.get((page.path, page.session))
        if got.status == 404:
            why = f"GET {page.get} answers 404"
        elif got.status != 200:
            why = f"GET {page.get} answers {got.status}: {got.text[:300]}"
        elif page.filtered and plain is not None and got.texts == plain.texts:
            why = (
                f"GET {page.get} runs the very statements of GET {page.path} (as"
                f" {page.session}): what it filters by is not read"
            )
        else:
            continue
        out[name] = {"page": name, "get": page.get, "status": got.status, "why": why}
    return out


def warnings(pages: dict[str, Page], caught: Caught) -> list[str]:
    """Pages that list nothing where the load gave them rows to list, and pages measured
    against their statements of which none was caught."""
    empty = [
        f"{name}: GET {page.get} lists nothing (no match for {page.lists!r}): the load may not"
        " fill what the page reads, or its rows are not marked as agreed"
        for name, page in pages.items()
        if page.lists and not re.search(page.lists, caught[name].text)
    ]
    unseen = [
        f"{name}: no statement of GET {page.get} was caught (read by a path page_sql's"
        " Recorder does not watch?): its bare side is an empty run"
        for name, page in pages.items()
        if page.against == BARE and not caught[name].statements
    ]
    return empty + unseen


def slow_floor(shown: dict[str, Any]) -> list[str]:
    """A warning when a request that reads nothing is slow alone: then every page's time
    holds a wait that is none of its own."""
    took = shown[FLOOR]["alone_ms"]["p50"]
    if took <= FLOOR_MS:
        return []
    return [
        f"GET /healthz, which reads nothing, takes {took} ms alone on a kept-alive connection:"
        " answers are held up on their way out (e.g. a server socket without TCP_NODELAY,"
        " its answer's last segment waiting for a delayed ACK), and every page's time"
        " holds that wait"
    ]


# --- timing -------------------------------------------------------------------------------------

PHASES = ("cron", "overview")
"""The load is run twice, each page under one: the cron's pages (with `/healthz`) beside
their bare statements, then the overviews beside the API's list. An overview read anew
costs what a hundred cron pages do (it counts the store), so in one mix it would set
every cron page's wait: each page is measured under the load of its own kind."""


def _phase(name: str, page: Page) -> str:
    return "cron" if page.against == BARE or name == FLOOR else "overview"


Item = tuple[str, str]
"""(page name, PAGE or BARE): one request of a page, or one bare run of its statements."""


def mix(rng: random.Random, pages: dict[str, Page], count: int) -> list[Item]:
    """`count` page requests, each page as often as the others, and beside each request of
    a page measured against its statements one bare run of them, in a shuffled order."""
    names = [name for _ in range(count // len(pages) + 1) for name in pages][:count]
    items = [(n, PAGE) for n in names] + [(n, BARE) for n in names if pages[n].against == BARE]
    rng.shuffle(items)
    return items


async def time_items(
    base: str,
    dsn: str,
    secrets: dict[str, str],
    pages: dict[str, Page],
    caught: Caught,
    work: list[list[Item]],
) -> dict[Item, list[float]]:
    """Each client of `work` signed in (a session of each of `secrets`) with a psycopg
    connection of its own, then its items in order: each item's ms."""
    sessions = [Sessions(secrets, base_url=base) for _ in work]
    conns = await page_sql.open_bare(api.libpq_url(dsn), len(work))
    times: dict[Item, list[float]] = {}
    try:
        for s in sessions:
            await s.sign_in()

        async def one(i: int, item: Item) -> None:
            name, side = item
            t0 = time.perf_counter()
            if side == BARE:
                await page_sql.run_bare(conns[i], caught[name].statements)
            else:
                got = await sessions[i].ask(pages[name])
            times.setdefault(item, []).append((time.perf_counter() - t0) * 1000)
            if side == PAGE and got.status_code != 200:
                raise RuntimeError(f"GET {got.url}: {got.status_code} {got.text[:300]}")

        await api.run_clients(len(work), work, one)
    finally:
        for s in sessions:
            await s.aclose()
        for conn in conns:
            await conn.close()
    return times


# --- the report --------------------------------------------------------------------------------


def ms(values: list[float]) -> dict[str, float]:
    return {"p50": round(api.quantile(values, 0.5), 2), "p95": round(api.quantile(values, 0.95), 2)}


def _against_bare(page_p95: float, bare: list[float], bare_alone: list[float]) -> dict[str, Any]:
    ratio = page_p95 / max(api.quantile(bare, 0.95), 1e-3)
    return {
        "bare_ms": ms(bare),
        "bare_alone_ms": ms(bare_alone),
        "ratio_p95_vs_bare": round(ratio, 2),
        "p95_under_300_ms": page_p95 < MAX_P95_MS,
        "p95_within_2x_bare": ratio <= MAX_RATIO_BARE,
        "meets_target": page_p95 < MAX_P95_MS and ratio <= MAX_RATIO_BARE,
    }


def _against_list(page_p95: float, list_p95: float) -> dict[str, Any]:
    ratio = page_p95 / list_p95
    return {
        "ratio_p95_vs_api_list": round(ratio, 2),
        "p95_within_300_ms": page_p95 <= MAX_P95_MS,
        "p95_within_3x_api_list": ratio <= MAX_RATIO_LIST,
        "meets_target": page_p95 <= MAX_P95_MS and ratio <= MAX_RATIO_LIST,
    }


def summary(
    pages: dict[str, Page],
    caught: Caught,
    loaded: dict[Item, list[float]],
    alone: dict[Item, list[float]],
) -> dict[str, Any]:
    """Each timed page's times and statements; against its target."""
    list_p95 = api.quantile(loaded[(API_LIST, PAGE)], 0.95)
    out: dict[str, Any] = {}
    for name, page in pages.items():
        times, got = loaded[(name, PAGE)], caught[name]
        p95 = api.quantile(times, 0.95)
        shown: dict[str, Any] = {
            "get": page.get,
            "session_of": "every tenant" if page.session == EVERY else page.session,
            "requests": len(times),
            "ms": ms(times),
            "alone_ms": ms(alone[(name, PAGE)]),
            "statements": len(got.statements),
            "left_out": got.left_out,
            "answer_bytes": got.answer_bytes,
        }
        if page.lists:
            shown["rows_listed"] = len(re.findall(page.lists, got.text))
        if page.against == BARE:
            shown |= _against_bare(p95, loaded[(name, BARE)], alone[(name, BARE)])
        elif page.against == "api_list":
            shown |= _against_list(p95, list_p95)
        out[name] = shown
    return out


TARGETS = {
    "cron_pages": {"p95_ms_under": MAX_P95_MS, "ratio_p95_vs_bare_at_most": MAX_RATIO_BARE},
    "overview": {"p95_ms_at_most": MAX_P95_MS, "ratio_p95_vs_api_list_at_most": MAX_RATIO_LIST},
    "changed": "the jobs pages were measured against the API's list (3x); now against their"
    " own statements run bare (2x), as every page of the cron is. The overviews keep the"
    " API list: kept for five seconds, the overview reads nothing most times.",
}


async def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """Every page of the table caught, then the pages found timed against their targets."""
    t0 = time.monotonic()
    facts = dashboard_load.facts(url)
    every = table(facts)
    secrets, caught = await catch_all(url, every)
    gone = missing(every, caught)
    pages = {n: p for n, p in every.items() if n not in gone}
    count = max(args.requests, len(pages))  # each page asked at least once by each client
    rng = random.Random(args.seed)
    warm = [mix(rng, pages, max(len(pages), count // 10)) for _ in range(args.clients)]
    phases = [{n: p for n, p in pages.items() if _phase(n, p) == ph} for ph in PHASES]
    pers = [[mix(rng, ph, count) for _ in range(args.clients)] for ph in phases if ph]
    lone = [[(n, side) for n, p in pages.items() for _ in range(args.alone)
             for side in ((PAGE, BARE) if p.against == BARE else (PAGE,))]]  # fmt: skip
    timed = functools.partial(time_items, secrets=secrets, pages=pages, caught=caught)
    with tempfile.TemporaryDirectory(prefix="corral-bench-dashboard-") as scratch:
        proc, base = api.serve(url, Path(scratch), workers=args.workers)
        try:
            await timed(base, url, work=warm)
            cpu, t1 = api.cpu_s(proc.pid), time.monotonic()
            loaded: dict[Item, list[float]] = {}
            for per in pers:
                loaded |= await timed(base, url, work=per)
            wall, cpu = time.monotonic() - t1, api.cpu_s(proc.pid) - cpu
            alone = await timed(base, url, work=lone)
        finally:
            api.stop(proc)
    asked, shown = args.clients * count * len(pers), summary(pages, caught, loaded, alone)
    report = {
        **{k: getattr(args, k) for k in ("jobs", "events", "schedules", "firings", "clients")},
        "server_workers": args.workers,
        "requests_per_client": count,
        "loaded": facts,
        **verdict(pages, shown, gone),
        "warnings": warnings(pages, caught) + slow_floor(shown),
        "server": {
            "page_requests_per_s": round(asked / wall, 1),
            "cpu_ms_per_request": round(cpu * 1000 / asked, 2),
            "cpu_share_of_one_core": round(cpu / wall, 2),
        },
        "run_s": round(time.monotonic() - t0, 1),
    }
    if args.sql:
        report["sql"] = page_sql.shown(caught)
    return report


def verdict(
    pages: dict[str, Page], shown: dict[str, Any], gone: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """The pages' report, what is missing, and whether the targets are met: every page of
    the table measured and each meeting its own (the cold overviews' apart)."""
    held = [
        p["meets_target"] for n, p in shown.items() if "meets_target" in p and not pages[n].cold
    ]
    return {
        "pages": shown,
        "missing": list(gone.values()),
        "targets": TARGETS,
        "meets_targets": not gone and all(held),
        "measured_meet_targets": all(held),
        "cold_meets_targets": all(shown[n]["meets_target"] for n in shown if pages[n].cold),
    }


def main() -> None:
    parser = api.options(__doc__)
    parser.add_argument("--schedules", type=int, default=10_000, help="schedules loaded")
    parser.add_argument(
        "--firings", type=int, default=100_000, help="firings of the one big schedule"
    )
    parser.add_argument("--alone", type=int, default=20, help="of each page, by one client")
    parser.add_argument("--seed", type=int, default=1, help="of the pages' order")
    parser.add_argument("--sql", action="store_true", help="each page's statements in the JSON")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="corral api --workers: processes serving the pages (on 2 cores, 2 did not help:"
        " the clients and PostgreSQL use the other core)",
    )
    args = parser.parse_args()
    try:
        dashboard_load.sizes(args.jobs, args.schedules, args.firings)
    except ValueError as exc:
        parser.error(str(exc))
    if (
        args.events < 0
        or args.requests < 1
        or args.alone < 2
        or min(args.clients, args.workers) < 1
    ):
        parser.error(
            "--events negative, or --requests, --clients, --workers (1) or --alone (2) too small"
        )
    fill = functools.partial(
        dashboard_load.fill,
        jobs=args.jobs,
        events=args.events,
        schedules=args.schedules,
        firings=args.firings,
    )
    with api.loaded(args.pg_url, "dashboard", args.jobs, args.events, fill) as (url, load_s):
        report = asyncio.run(measure(url, args))
    report["load_s"] = load_s
    print(json.dumps(report, indent=2, default=str))


if __name__ == "__main__":
    main()
