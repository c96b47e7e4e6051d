"""Alerts: how much noise a burst of failures makes, and what the alerter costs dispatch.

Two measures, on the embedded default (SQLite):
  * noise: `--quarantines` jobs of one schedule (a broken schedule's firings, each its
    job; an alert is about the schedule) quarantined within a minute, read by an alerter
    with two webhook channels (throttle 10m): how many messages each channel gets (the
    target: one message and one digest), and how long reading the events took;
  * throughput: `--jobs` jobs drained through the real Dispatcher (an executor that ends
    each launch at once, a tenth of them with exit 3, which their policy quarantines),
    with the alerter running beside it as `corral serve` runs it (both channels, the
    default throttle: a message per subject that fails, its recovered message, then
    digests) and without, in `--rounds` interleaved rounds: jobs/s of each, their
    medians, on/off. Each round drains 20,000 jobs by default (6 s or so here): a
    shorter one is mostly the alerter's first pass.

The channels post to an aiohttp receiver on 127.0.0.1 in this process.
JSON on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aiohttp import web
from tests.support.noop import NoopExecutor

from corral import alerts, config, dispatcher, launching, model, store
from corral.clock import SystemClock
from corral.testing import FrozenClock

FAIL = {"failure_rules": [{"on_exit_codes": {"operator": "In", "values": [3]}, "action": "fail"}]}


class TenthFails(NoopExecutor):
    """Ends every launch at once; a job whose policy says so exits 3."""

    async def launch(self, launch: launching.Launch) -> None:
        self.fail_exit_code = 3 if launch.payload == "fail" else None
        await super().launch(launch)


def settings(base: str, throttle: str) -> config.Settings:
    return config.Settings(
        executors={"enabled": ["process"], "http": {"allow_networks": ["127.0.0.0/8:1024-65535"]}},  # type: ignore[arg-type]
        alerts={  # type: ignore[arg-type]
            "channels": {
                "hook": {"kind": "webhook", "url": f"{base}/hook"},
                "slack": {"kind": "slack", "webhook_url": f"{base}/slack"},
            },
            "rules": {
                "poison": {
                    "on": ["quarantined"],
                    "channels": ["hook", "slack"],
                    "throttle": throttle,
                }
            },
        },
    )


async def receiver() -> tuple[web.AppRunner, str, dict[str, list[str]]]:
    got: dict[str, list[str]] = {"/hook": [], "/slack": []}

    async def handle(request: web.Request) -> web.Response:
        body = await request.json()
        got.setdefault(request.path, []).append(body.get("type") or body.get("text", ""))
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}", got  # type: ignore[union-attr]


FIRING = {"corral": {"schedule": "billing-sync"}}
"""The payload of a firing's job of schedule billing-sync (scheduling.FIRING): what makes the
noise bench's jobs one subject."""


async def noise(quarantines: int, scratch: str) -> dict[str, Any]:
    runner, base, got = await receiver()
    clock = FrozenClock()
    db = store.Store.connect(f"sqlite:///{scratch}/noise.db")
    await db.database.migrate()
    s = settings(base, "10m")
    alerter = alerts.Alerter(store=db, clock=clock, settings=s)
    await alerter.read_once()  # its cursor: from here on
    for start in range(0, quarantines, 1000):
        n = min(1000, quarantines - start)
        await db.jobs.submit(
            new=[
                model.NewJob(executor="noop", spec={}, queue="billing", payload=FIRING)
                for _ in range(n)
            ],
            now=clock.now(),
        )
        claimed = await db.jobs.claim(now=clock.now(), limit=n, executors=["noop"])
        await db.attempts.finish(
            finishes=[
                store.Finish(
                    c.attempt.id, model.AttemptState.FAILED, 2, None, model.FailureClass.PERMANENT
                )
                for c in claimed
            ],
            now=clock.now(),
        )
        clock.advance(5)  # 10,000 in under a minute
    t0 = time.perf_counter()
    while await alerter.read_once() == alerts.BATCH:
        pass
    read_s = time.perf_counter() - t0
    await alerter.deliver_all()
    clock.advance(600)  # the window ends: its digest is due
    await alerter.deliver_all()
    await alerter.close()
    await db.close()
    await runner.cleanup()
    return {
        "quarantines": quarantines,
        "messages_per_channel": {
            path.strip("/"): len(bodies) for path, bodies in sorted(got.items())
        },
        "read_seconds": read_s,
        "events_per_s": 2 * quarantines / read_s,  # a quarantine is two events at least
    }


async def dispatch(jobs: int, scratch: str, with_alerter: bool) -> float:
    runner, base, _ = await receiver()
    clock = SystemClock()
    db = store.Store.connect(f"sqlite:///{scratch}/dispatch-{with_alerter}.db")
    await db.database.migrate()
    s = settings(base, "10m")  # the default throttle: the alerter reads every event
    stop = asyncio.Event()
    loops = []
    if with_alerter:
        alerter = alerts.Alerter(store=db, clock=clock, settings=s)  # as `corral serve` runs it
        await alerter.read_once()
        loops.append(asyncio.create_task(alerter.run(stop)))
    for start in range(0, jobs, 1000):
        chunk = [
            model.NewJob(
                executor="noop",
                spec={},
                payload="fail" if (start + i) % 10 == 0 else None,
                policy=FAIL,
                queue=f"q{(start + i) % 50}",
            )
            for i in range(min(1000, jobs - start))
        ]
        await db.jobs.submit(new=chunk, now=clock.now())
    d = dispatcher.Dispatcher(store=db, executors={"noop": TenthFails()}, clock=clock, settings=s)
    t0 = time.perf_counter()
    loops.append(asyncio.create_task(d.run(stop)))
    while await db.jobs.list(model.JobFilter(states=["queued", "running"]), limit=1):
        await asyncio.sleep(0.02)
    elapsed = time.perf_counter() - t0
    stop.set()
    await asyncio.gather(*loops)
    await db.close()
    await runner.cleanup()
    return jobs / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quarantines", type=int, default=10_000)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pg-url", default=None, help="Not used: the embedded default only.")
    args = parser.parse_args()
    report: dict[str, Any] = {"cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as scratch:
        report["noise"] = asyncio.run(noise(args.quarantines, scratch))
        print(f"noise: {report['noise']['messages_per_channel']}", file=sys.stderr)
        rates: dict[str, list[float]] = {"off": [], "on": []}
        for n in range(args.rounds):
            for name in ("off", "on") if n % 2 == 0 else ("on", "off"):
                with tempfile.TemporaryDirectory(dir=scratch) as round_dir:
                    rates[name].append(asyncio.run(dispatch(args.jobs, round_dir, name == "on")))
                print(
                    f"round {n + 1}/{args.rounds} {name}: {rates[name][-1]:,.0f} jobs/s",
                    file=sys.stderr,
                )
    median = {name: statistics.median(r) for name, r in rates.items()}
    report |= {
        "jobs": args.jobs,
        "rounds": args.rounds,
        "jobs_per_s": rates,
        "median_jobs_per_s": median,
        "ratio_on_vs_off": median["on"] / median["off"],
        "ratio_by_round": [on / off for on, off in zip(rates["on"], rates["off"], strict=True)],
        "target": {"messages_per_channel": 2, "ratio_on_vs_off": 0.95},
        "load_average_at_end": os.getloadavg(),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
