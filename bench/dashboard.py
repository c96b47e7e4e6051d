"""The dashboard's overview and jobs page over a large store, against the API's own job list.

    .venv/bin/python bench/dashboard.py [--jobs 1000000] [--events 5000000] [--clients 8]
                                        [--requests 200] [--alone 20] [--pg-url URL]

On a fresh PostgreSQL database loaded as bench/api.py loads it (`api.loaded`: `--jobs`
jobs, `--events` events, not timed), `corral api --http` serves the real app, dashboard
and API, in a process of its own (nothing dispatches). Each of `--clients` httpx clients
signs in to the dashboard once with a viewer's API token of every tenant and once with
one of a single tenant's (the sign-in form and its pairing cookie, as a browser does: a
session cookie each), then sends `--requests` requests, the pages in a shuffled order:

  * GET /ui/                   the overview (counts by state, capped; the charts of the
                               last hour and day; quarantined jobs; failing schedules;
                               retry budgets), for every tenant and for one, as people see
                               it: read and drawn at most once every KEEP_SECONDS (5 s) a
                               tenant, shown again until then with its age
  * GET /ui/?fresh=1           the same overview read and drawn anew at each request (its
                               cold cost: what one view costs when nothing is kept), for
                               every tenant and for one
  * GET /ui/jobs               the jobs page, unfiltered
  * GET /ui/jobs?state=queued  the jobs page, filtered
  * GET /api/v1/jobs?limit=50  the API's own job list, a page as long as the dashboard's

so every page is timed under the same load, in the same run. Each client sends its next
request as soon as it has the answer to the last (as in bench/api.py). Then one client
alone asks for each page `--alone` times: a page's cost without the wait behind others.

JSON on stdout: p50/p95 in ms of each page, the ratio of each dashboard page's p95 to the
API list's, whether each meets the targets (p95 at most 300 ms, and at most 3x the API
list's), what the server process spent, and the load time. `meets_targets` is over the
pages as people see them; `cold_meets_targets` over the overviews read at each request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import api
from corral import config, runtime
from corral.web import auth, jobs

MAX_P95_MS = 300.0
"""The target: a dashboard page's p95 at most this."""
MAX_RATIO = 3.0
"""The target: a dashboard page's p95 at most this many times the API list's."""

API_LIST = "api_jobs"
TENANT = "tenant-3"
"""The tenant of the second session: one of ten, with a tenth of the jobs."""
PAGES: dict[str, tuple[str, dict[str, Any], str]] = {
    "overview": ("/ui/", {}, "every"),
    "overview_one_tenant": ("/ui/", {}, TENANT),
    "overview_cold": ("/ui/", {"fresh": "1"}, "every"),
    "overview_one_tenant_cold": ("/ui/", {"fresh": "1"}, TENANT),
    "jobs": ("/ui/jobs", {}, "every"),
    "jobs_queued": ("/ui/jobs", {"state": "queued"}, "every"),
    API_LIST: ("/api/v1/jobs", {"limit": jobs.JOBS_PAGE}, "every"),
}
"""Each timed page: its path, its query, and whose session asks (every tenant's, or
TENANT's); the API list is asked with the token of every tenant's."""
COLD = ("overview_cold", "overview_one_tenant_cold")
"""The overviews read and drawn at each request, nothing kept."""


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


def mix(rng: random.Random, count: int) -> list[str]:
    """`count` page names, each page as often as the others, in a shuffled order."""
    names = [name for _ in range(count // len(PAGES) + 1) for name in PAGES][:count]
    rng.shuffle(names)
    return names


async def time_pages(
    base: str, secrets: dict[str, str], work: list[list[str]]
) -> dict[str, list[float]]:
    """Each client of `work` signed in (a session of each of `secrets`, by whose it is),
    then its pages asked for in order: each page's ms."""
    bearer = {"Authorization": f"Bearer {secrets['every']}"}
    clients = [{who: httpx.AsyncClient(base_url=base, timeout=60) for who in secrets} for _ in work]
    by_page: dict[str, list[float]] = {}
    try:
        for sessions in clients:
            for who, c in sessions.items():
                await sign_in(c, secrets[who])

        async def one(i: int, name: str) -> None:
            path, query, who = PAGES[name]
            headers = bearer if name == API_LIST else None
            t0 = time.perf_counter()
            got = await clients[i][who].get(path, params=query, headers=headers)
            by_page.setdefault(name, []).append((time.perf_counter() - t0) * 1000)
            if got.status_code != 200:
                raise RuntimeError(f"GET {got.url}: {got.status_code} {got.text[:300]}")

        await api.run_clients(len(work), work, one)
    finally:
        for sessions in clients:
            for c in sessions.values():
                await c.aclose()
    return by_page


def ms(values: list[float]) -> dict[str, float]:
    return {"p50": round(api.quantile(values, 0.5), 2), "p95": round(api.quantile(values, 0.95), 2)}


def summary(loaded: dict[str, list[float]], alone: dict[str, list[float]]) -> dict[str, Any]:
    """Each page's times; for the dashboard's, against the targets and the API list."""
    list_p95 = api.quantile(loaded[API_LIST], 0.95)
    out: dict[str, Any] = {}
    for name, (path, query, who) in PAGES.items():
        times = loaded[name]
        p95 = api.quantile(times, 0.95)
        shown: dict[str, Any] = {
            "get": path + (f"?{httpx.QueryParams(query)}" if query else ""),
            "session_of": "every tenant" if who == "every" else who,
            "requests": len(times),
            "ms": ms(times),
            "alone_ms": ms(alone[name]),
        }
        if name != API_LIST:
            ratio = p95 / list_p95
            shown["ratio_p95_vs_api_list"] = round(ratio, 2)
            shown["p95_within_300_ms"] = p95 <= MAX_P95_MS
            shown["p95_within_3x_api_list"] = ratio <= MAX_RATIO
            shown["meets_target"] = p95 <= MAX_P95_MS and ratio <= MAX_RATIO
        out[name] = shown
    return out


async def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    settings = config.Settings(database_url=url)
    secrets: dict[str, str] = {}
    async with runtime.connect(settings, platforms=False) as c:
        for who in ("every", TENANT):
            tenant = None if who == "every" else who
            _, secrets[who] = await c.token_create(
                name=f"bench-{who}", tenant=tenant, role="viewer"
            )
    rng = random.Random(args.seed)
    warm = [mix(rng, max(len(PAGES), args.requests // 10)) for _ in range(args.clients)]
    per = [mix(rng, args.requests) for _ in range(args.clients)]
    with tempfile.TemporaryDirectory(prefix="corral-bench-dashboard-") as scratch:
        proc, base = api.serve(url, Path(scratch))
        try:
            await time_pages(base, secrets, warm)
            cpu = api.cpu_s(proc.pid)
            t0 = time.monotonic()
            loaded = await time_pages(base, secrets, per)
            wall, cpu = time.monotonic() - t0, api.cpu_s(proc.pid) - cpu
            alone = await time_pages(base, secrets, [[n for n in PAGES for _ in range(args.alone)]])
        finally:
            api.stop(proc)
    shown = summary(loaded, alone)
    done = args.clients * args.requests
    return {
        "jobs": args.jobs,
        "events": args.events,
        "clients": args.clients,
        "requests_per_client": args.requests,
        "pages": shown,
        "server": {
            "requests_per_s": round(done / wall, 1),
            "cpu_ms_per_request": round(cpu * 1000 / done, 2),
            "cpu_share_of_one_core": round(cpu / wall, 2),
        },
        "targets": {"p95_ms_at_most": MAX_P95_MS, "ratio_p95_vs_api_list_at_most": MAX_RATIO},
        "meets_targets": all(
            p["meets_target"] for n, p in shown.items() if n != API_LIST and n not in COLD
        ),
        "cold_meets_targets": all(shown[n]["meets_target"] for n in COLD),
    }


def main() -> None:
    parser = api.options(__doc__)
    parser.add_argument("--alone", type=int, default=20, help="of each page, by one client")
    parser.add_argument("--seed", type=int, default=1, help="of the pages' order")
    args = parser.parse_args()
    if args.jobs < 1 or args.events < 0 or args.requests < len(PAGES) or args.alone < 2:
        parser.error(
            f"--jobs, --requests ({len(PAGES)}) or --alone (2) too small, or --events negative"
        )
    with api.loaded(args.pg_url, "dashboard", args.jobs, args.events) as (url, load_s):
        report = asyncio.run(measure(url, args))
    report["load_s"] = load_s
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
