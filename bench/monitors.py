"""Monitors' pings through the real API, against a bare endpoint doing the same INSERT.

    .venv/bin/python bench/monitors.py [--monitors 1000] [--clients 8] [--requests 500]
                                       [--pg-url URL]

On a fresh PostgreSQL database, migrated by corral and dropped afterwards:
  * `--monitors` monitors are made (through the store, each of its own key), so that no
    monitor nears its 10 pings a second;
  * `corral api --http` serves the real app in one process of its own, and `--clients`
    clients, each `--requests` requests on one HTTP/1.1 connection kept alive
    (bench/api.py's PlainClient), GET /ping/<key> of the monitors in turn: each ping finds
    its monitor by its key, counts its window of pings a second, records the ping and
    moves the monitor, in one transaction;
  * a bare endpoint, in a process of its own on the same stack (FastAPI on uvicorn, the
    store's transaction on its worker thread), answers GET /bare/<monitor id> with the same
    INSERT of a ping row alone, and the same clients ask it the same number of times.
Both sides are warmed first. A request is timed from its first byte written to its
answer's last byte read; each side's pings a second are its requests over its wall time.

JSON on stdout: each side's pings a second and p50/p95 in ms, the ratio of corral's pings a
second to the bare endpoint's, and whether the targets hold (p95 under 50 ms, the ratio at
least 0.5).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx

from bench.api import DEFAULT_PG, PlainClient, _free_port, loaded, quantile, serve, stop
from corral import clock, monitoring, store

MAX_P95_MS = 50.0
"""The target: a ping's p95 under this."""
MIN_RATIO = 0.5
"""The target: corral's pings a second at least this share of the bare endpoint's."""


def make_monitors(url: str, count: int) -> list[tuple[int, str]]:
    """`count` monitors of tenant bench, each pinged every minute: (id, key) of each."""

    async def made() -> list[tuple[int, str]]:
        db = store.Store.connect(url)
        now = clock.SystemClock().now()
        try:
            out = []
            for n in range(count):
                new = monitoring.Monitor(
                    id=0, tenant="bench", name=f"m{n}", ping_key="", period=timedelta(minutes=1),
                    cron=None, tz="UTC", grace=timedelta(minutes=1), state=monitoring.UP,
                    state_at=now, basis_at=now, expected_at=None, check_at=None,
                    last_ping_at=None, run_started_at=None, created_at=now,
                )  # fmt: skip
                m = await db.monitors.add(new=new, rule=None, most=count, rules_most=0, now=now)
                out.append((m.id, m.ping_key))
            return out
        finally:
            await db.close()

    return asyncio.run(made())


# --- the bare endpoint ------------------------------------------------------------------------


def bare_app(url: str) -> Any:
    """A FastAPI app whose one route INSERTs a ping row of the monitor its path names, in a
    transaction of the store's, as the ping route's own INSERT is written."""
    from fastapi import FastAPI
    from sqlalchemy import Connection, insert

    from corral.store.tables import monitor_pings

    db = store.Store.connect(url)
    now = clock.SystemClock().now

    def insert_one(conn: Connection, *, monitor_id: int) -> None:
        conn.execute(
            insert(monitor_pings).values(
                monitor_id=monitor_id, at=now(), kind="success", exit_code=None,
                source="127.0.0.1", user_agent="", body="", duration_seconds=None,
            )
        )  # fmt: skip

    app = FastAPI()

    @app.get("/bare/{monitor_id}")
    async def bare(monitor_id: int) -> dict[str, Any]:
        await db.database.tx(functools.partial(insert_one, monitor_id=monitor_id))
        return {"ok": True, "state": "up"}

    return app


def serve_bare(url: str, scratch: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The bare endpoint on a free port of 127.0.0.1, in a process of its own."""
    port = _free_port()
    log = (scratch / "bare.log").open("ab")
    proc = subprocess.Popen(
        [sys.executable, __file__, "--bare-server", url, "--port", str(port)],
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [str(Path(__file__).parents[1]), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
        },
        stdout=log,
        stderr=log,
    )
    base = f"http://127.0.0.1:{port}"
    until = time.monotonic() + 60
    while time.monotonic() < until:
        if proc.poll() is not None:
            raise RuntimeError(f"the bare endpoint exited with {proc.returncode}: see bare.log")
        try:
            httpx.get(f"{base}/docs", timeout=1)
            return proc, base
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the bare endpoint did not answer in 60 s")


def run_bare_server(url: str, port: int) -> None:
    import uvicorn

    uvicorn.run(bare_app(url), host="127.0.0.1", port=port, log_level="warning", access_log=False)


# --- the clients ------------------------------------------------------------------------------


async def timed(base: str, targets: list[list[str]]) -> tuple[list[float], float, dict[int, int]]:
    """Each client's GETs of `targets` on a connection of its own, all clients at once:
    each request's ms, the wall time, and how many answers of each status."""
    head = f"Host: {httpx.URL(base).netloc.decode()}\r\n".encode()
    clients = [await PlainClient.open(base) for _ in targets]
    times: list[float] = []
    statuses: dict[int, int] = {}

    async def client(c: PlainClient, mine: list[str]) -> None:
        for target in mine:
            t0 = time.perf_counter()
            status, _ = await c.get(target, head)
            times.append((time.perf_counter() - t0) * 1000)
            statuses[status] = statuses.get(status, 0) + 1

    t0 = time.monotonic()
    try:
        await asyncio.gather(*(client(c, t) for c, t in zip(clients, targets, strict=True)))
    finally:
        for c in clients:
            await c.aclose()
    return times, time.monotonic() - t0, statuses


def side(times: list[float], wall: float, statuses: dict[int, int]) -> dict[str, Any]:
    return {
        "pings_per_s": round(len(times) / wall, 1),
        "p50_ms": round(quantile(times, 0.5), 2),
        "p95_ms": round(quantile(times, 0.95), 2),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
    }


def work(
    monitors: list[tuple[int, str]], clients: int, requests: int, bare: bool
) -> list[list[str]]:
    """Each client's targets: the monitors in turn, spread over the clients."""
    out = []
    for i in range(clients):
        mine = []
        for n in range(requests):
            monitor_id, key = monitors[(i + n * clients) % len(monitors)]
            mine.append(f"/bare/{monitor_id}" if bare else f"/ping/{key}")
        out.append(mine)
    return out


async def measure(
    url: str, args: argparse.Namespace, monitors: list[tuple[int, str]]
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="corral-bench-monitors-") as scratch:
        api, api_base = serve(url, Path(scratch))
        bare, bare_base = serve_bare(url, Path(scratch))
        try:
            warm = max(5, args.requests // 10)
            await timed(api_base, work(monitors, args.clients, warm, bare=False))
            await timed(bare_base, work(monitors, args.clients, warm, bare=True))
            await asyncio.sleep(1.0)  # a new second: the warm-up's pings leave every window
            corral = side(
                *await timed(api_base, work(monitors, args.clients, args.requests, False))
            )
            plain = side(*await timed(bare_base, work(monitors, args.clients, args.requests, True)))
        finally:
            stop(api)
            stop(bare)
    ratio = corral["pings_per_s"] / plain["pings_per_s"]
    return {
        "monitors": len(monitors),
        "clients": args.clients,
        "requests_per_client": args.requests,
        "corral": corral,
        "bare_insert": plain,
        "ratio_pings_per_s_corral_vs_bare": round(ratio, 2),
        "targets": {"p95_ms_under": MAX_P95_MS, "ratio_at_least": MIN_RATIO},
        "meets_targets": corral["p95_ms"] < MAX_P95_MS and ratio >= MIN_RATIO,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--monitors", type=int, default=1000, help="monitors made")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients")
    parser.add_argument("--requests", type=int, default=500, help="timed pings per client")
    parser.add_argument("--pg-url", default=DEFAULT_PG, help="a database to make others from")
    parser.add_argument("--bare-server", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_server:
        run_bare_server(args.bare_server, args.port)
        return
    if args.monitors < 1:
        parser.error("--monitors must be at least 1")
    with loaded(args.pg_url, "monitors", 1, 0) as (url, _):
        monitors = make_monitors(url, args.monitors)
        report = asyncio.run(measure(url, args, monitors))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
