"""Recovery time: how long the reconciler takes to repair a whole batch of orphaned attempts.

    .venv/bin/python bench/recovery.py [--n 500] [--db sqlite,postgres]

For each recoverable state it leaves N attempts (default: recovery_batch_limit) orphaned
exactly as a crash would, on a real database, against an in-memory platform:

    relaunch    launching, nothing on the platform (died between claim and launch)
    adopt       launching, present on the platform (died between launch and record)
    complete    running, finished on the platform, no news (died before the completion)
    lost        running, gone from the platform, past recovery_grace

then starts a reconciler and times until every one is repaired. The target is one
reconciler interval plus one dispatcher tick. Prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.platform import Platform

from bench.throughput import DEFAULT_PG, Database
from corral import config, launching, model, reconciler, store
from corral.clock import SystemClock

A, P = model.AttemptState, launching.Phase
SCENARIOS = ("relaunch", "adopt", "complete", "lost")


async def orphan(
    db: store.Store, platform: Platform, scenario: str, n: int, settings: config.Settings
) -> None:
    """Leave n attempts as a crash in `scenario` would, started an hour ago."""
    then = SystemClock().now() - timedelta(hours=1)
    await db.jobs.submit(new=[model.NewJob(executor="noop", spec={}) for _ in range(n)], now=then)
    claimed = await db.jobs.claim(now=then, limit=n, executors=["noop"])
    if scenario in ("complete", "lost"):
        await db.attempts.record_running(fences=[c.attempt.id for c in claimed], now=then)
    for c in claimed:
        launch = launching.build_launch(c, reach=launching.Reach(), deadline_seconds=None)
        if scenario == "adopt":
            platform.put(launch)
        elif scenario == "complete":
            platform.put(launch, P.SUCCEEDED, exit_code=0)


async def scenario_time(url: str, scenario: str, n: int) -> dict[str, Any]:
    # At least the default batch (which covers two claims, as the settings require).
    least = config.Settings().recovery_batch_limit
    settings = config.Settings(database_url=url, recovery_batch_limit=max(n, least))
    db = store.Store.connect(url)
    platform = Platform()
    await platform.start()
    await orphan(db, platform, scenario, n, settings)
    r = reconciler.Reconciler(
        store=db, executors={"noop": platform}, clock=SystemClock(), settings=settings
    )
    stop = asyncio.Event()
    t0 = time.perf_counter()
    task = asyncio.create_task(r.run(stop))
    while await db.attempts.list_for_recovery(
        now=SystemClock().now(),
        launch_grace=settings.timeouts.launch_grace,
        lease_timeout=settings.timeouts.lease_timeout,
        attempt_deadline=settings.timeouts.attempt_deadline,
        limit=1,
    ):
        await asyncio.sleep(0.01)
    elapsed = time.perf_counter() - t0
    stop.set()
    await task
    await db.close()
    target = (
        settings.timeouts.reconcile_interval + settings.timeouts.dispatch_interval
    ).total_seconds()
    return {
        "attempts": n,
        "seconds": round(elapsed, 3),
        "target_seconds": target,
        "within_target": elapsed <= target,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=config.Settings().recovery_batch_limit)
    parser.add_argument("--db", default="sqlite,postgres")
    parser.add_argument("--pg-url", default=DEFAULT_PG)
    args = parser.parse_args()
    report: dict[str, Any] = {"n": args.n}
    for kind in args.db.split(","):
        report[kind] = {}
        for scenario in SCENARIOS:
            db = Database(kind, args.pg_url)
            try:
                report[kind][scenario] = asyncio.run(scenario_time(db.url, scenario, args.n))
            finally:
                db.drop()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
