"""HTTP jobs through corral against a bare httpx loop: how fast requests to a local
receiver drain on the embedded default (SQLite, the dispatcher, the `http` executor).

Phases, interleaved over rounds (these machines are noisy: compare the ratio of one run):
  * bare: an httpx.AsyncClient sends `--jobs` GET requests, at most `--concurrency` at
    once (corral's launch_concurrency), and waits for each answer;
  * corral: `--jobs` jobs of the same request submitted, then drained through the real
    Dispatcher and HttpExecutor (the guard, the headers, the store's run log), timed
    until no job is queued or running. Submitting is not timed.

The receiver is an aiohttp server in a process of its own on 127.0.0.1, answering 200 at
once, so both phases wait on the same thing.

JSON on stdout: requests/s of each phase per round, their medians, and corral/bare.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import statistics
import sys
import tempfile
import time
from typing import Any

import httpx

from corral import config, dispatcher, model, store
from corral.clock import SystemClock
from corral.executors import http

LOCAL = ("127.0.0.0/8:1024-65535",)


def _serve(port: int) -> None:
    from aiohttp import web

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/hook", ok)
    web.run_app(app, host="127.0.0.1", port=port, print=None, handle_signals=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _bare(url: str, jobs: int, concurrency: int) -> float:
    slots = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(trust_env=False) as client:

        async def one() -> None:
            async with slots:
                (await client.get(url)).raise_for_status()

        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(jobs)))
        return jobs / (time.perf_counter() - t0)


async def _corral(url: str, jobs: int, scratch: str) -> float:
    clock = SystemClock()
    settings = config.Settings(
        executors={"enabled": ["http"], "http": {"allow_networks": list(LOCAL)}}  # type: ignore[arg-type]
    )
    db = store.Store.connect(f"sqlite:///{scratch}/bench.db")
    await db.database.migrate()
    for start in range(0, jobs, 1000):
        chunk = [
            model.NewJob(executor="http", spec={"url": url}) for _ in range(min(1000, jobs - start))
        ]
        await db.jobs.submit(new=chunk, now=clock.now())
    executor = http.build(settings, clock)
    await executor.start()
    d = dispatcher.Dispatcher(
        store=db, executors={"http": executor}, clock=clock, settings=settings
    )
    stop = asyncio.Event()
    t0 = time.perf_counter()
    runner = asyncio.create_task(d.run(stop))
    while await db.jobs.list(model.JobFilter(states=["queued", "running"]), limit=1):
        await asyncio.sleep(0.05)
    elapsed = time.perf_counter() - t0
    stop.set()
    await runner
    await executor.close()
    done = await db.jobs.count_by_state()
    await db.close()
    assert done.get("succeeded") == jobs, f"{done} of {jobs}"
    return jobs / elapsed


def run_round(n: int, args: argparse.Namespace, url: str) -> dict[str, Any]:
    rates: dict[str, float] = {}
    for name in ("bare", "corral") if n % 2 == 0 else ("corral", "bare"):
        if name == "bare":
            rates[name] = asyncio.run(_bare(url, args.jobs, args.concurrency))
        else:
            with tempfile.TemporaryDirectory(prefix="corral-bench-") as scratch:
                rates[name] = asyncio.run(_corral(url, args.jobs, scratch))
        print(f"round {n + 1}/{args.rounds} {name}: {rates[name]:,.0f} requests/s", file=sys.stderr)
    return {"round": n + 1, "requests_per_s": rates, "ratio": rates["corral"] / rates["bare"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--concurrency",
        type=int,
        default=config.Settings().launch_concurrency,
        help="The bare loop's (default: corral's launch_concurrency).",
    )
    args = parser.parse_args()
    port = free_port()
    receiver = multiprocessing.get_context("spawn").Process(target=_serve, args=(port,))
    receiver.start()
    url = f"http://127.0.0.1:{port}/hook"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(url, trust_env=False).raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        load_at_start = os.getloadavg()
        rounds = [run_round(n, args, url) for n in range(args.rounds)]
    finally:
        receiver.terminate()
        receiver.join()
    median = {
        k: statistics.median(r["requests_per_s"][k] for r in rounds) for k in ("bare", "corral")
    }
    report = {
        "jobs": args.jobs,
        "concurrency": args.concurrency,
        "cpus": os.cpu_count(),
        "load_average_at_start": load_at_start,
        "load_average_at_end": os.getloadavg(),
        "rounds_detail": rounds,
        "median_requests_per_s": median,
        "ratio_corral_vs_bare": median["corral"] / median["bare"],
        "ratio_by_round": [r["ratio"] for r in rounds],
        "target": 0.5,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
