"""The scheduler under load: many schedules due at the same instant, dispatch off.

Phases, on SQLite (a file) and on PostgreSQL (a fresh database), one after the other:
  * one: `--schedules` interval schedules, all due at the same instant a few seconds
    ahead (`--lead`), fired by one Scheduler on the real clock. Lateness of a firing = when
    the transaction that recorded it and its job committed - its nominal time (p50, p99, max);
  * three: the same with three Schedulers (each on its own store connection pool) at
    once: the lateness again, and duplicates (firings per nominal time above one; any is
    a failure);
  * scaling: a pass's time with `--schedules` due against a tenth of them due (linear
    when the ratio is near 10), and the time of a pass with nothing due over
    `--paused` paused schedules against one over none (flat when the ratio is near 1).

JSON on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import throughput
from corral import scheduler, scheduling, store
from corral.clock import SystemClock
from corral.testing import FrozenClock

TEMPLATE = {
    "executor": "process",
    "spec": {"command": ["true"]},
    "payload": None,
    "queue": "default",
    "pool": None,
    "tenant": "default",
    "priority": 0,
    "max_attempts": 3,
    "labels": {},
    "policy": {},
    "code_version": None,
}


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def make_schedules(
    db: store.Store, count: int, at: datetime, now: datetime, *, prefix: str, paused: bool = False
) -> None:
    """`count` schedules every minute, each due first at `at`."""
    for start in range(0, count, 5000):
        items = [
            (
                scheduling.NewSchedule(
                    name=f"{prefix}{n}", template=TEMPLATE, every_seconds=60, anchor=at
                ),
                at,
                at,
            )
            for n in range(start, min(count, start + 5000))
        ]
        await db.schedules.create_many(items=items, now=now, paused=paused)


class Timed(scheduler.Scheduler):
    """A Scheduler that notes when each of its transactions returned, with what it fired."""

    commits: list[tuple[float, list[scheduling.Firing]]]

    async def pass_once(self) -> scheduler.PassResult:
        self.commits = getattr(self, "commits", [])  # kept across passes
        real = self.store.schedules.fire_due

        async def timed(**kw: Any) -> Any:
            done = await real(**kw)
            self.commits.append((time.time(), done.firings))
            return done

        self.store.schedules.fire_due = timed  # type: ignore[method-assign]
        try:
            return await super().pass_once()
        finally:
            del self.store.schedules.fire_due


async def fire_once(url: str, count: int, schedulers: int, lead_s: float = 3.0) -> dict[str, Any]:
    """`count` schedules due at one instant, `schedulers` Scheduler loops firing them (as
    `corral scheduler` does: ahead of the instant, scheduler.AHEAD). The schedules are made
    in the `lead_s` seconds before they fire, and a second more a thousand schedules."""
    clock = SystemClock()
    setup = store.Store.connect(url)
    await setup.database.migrate()
    lead = scheduler.AHEAD + timedelta(seconds=lead_s + count / 1000)
    due = clock.now().replace(microsecond=0) + lead
    await make_schedules(setup, count, due, clock.now(), prefix=f"s{schedulers}-")
    if clock.now() >= due - scheduler.AHEAD:
        raise SystemExit(f"making {count} schedules took too long: raise the lead time")
    dbs = [store.Store.connect(url) for _ in range(schedulers)]
    loops = [Timed(store=db, clock=clock) for db in dbs]
    stop = asyncio.Event()
    running = [asyncio.create_task(s.run(stop)) for s in loops]

    def fired() -> list[tuple[float, scheduling.Firing]]:
        return [
            (at, f)
            for s in loops
            for at, done in getattr(s, "commits", [])
            for f in done
            if f.nominal_at == due
        ]

    deadline = time.monotonic() + lead.total_seconds() + 120
    while len(fired()) < count and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    stop.set()
    await asyncio.gather(*running)
    found = fired()
    # Committed: when the transaction that recorded a firing and its job returned, less
    # the nominal time (negative: ahead of it). Claimable: when its job could first be
    # claimed (its commit, or its run_at, the nominal time, if later), less the same.
    committed = [at - f.nominal_at.timestamp() for at, f in found]
    claimable = [max(0.0, c) for c in committed]
    counts = Counter(f.schedule_id for _, f in found)
    for db in dbs:
        await db.close()
    await setup.close()
    return {
        "schedulers": schedulers,
        "fired": len(found),
        "expected": count,
        "duplicates": sum(n - 1 for n in counts.values()),
        "by_scheduler": [sum(len(done) for _, done in getattr(s, "commits", [])) for s in loops],
        "lateness_s": _spread(committed),
        "claimable_after_s": _spread(claimable),
    }


def _spread(values: list[float]) -> dict[str, float | None]:
    return {
        "p50": quantile(values, 0.5) if values else None,
        "p99": quantile(values, 0.99) if values else None,
        "max": max(values) if values else None,
    }


async def pass_time(url: str, due: int, paused: int, prefix: str) -> float:
    """Seconds of one pass (a frozen clock at the due instant) with `due` schedules due and
    `paused` paused ones."""
    db = store.Store.connect(url)
    await db.database.migrate()
    at = datetime(2030, 1, 1, tzinfo=SystemClock().now().tzinfo)
    clock = FrozenClock(at - timedelta(seconds=1))
    if paused:
        await make_schedules(db, paused, at, clock.now(), prefix=f"{prefix}p", paused=True)
    await make_schedules(db, due, at, clock.now(), prefix=prefix)
    clock.advance(1)
    s = scheduler.Scheduler(store=db, clock=clock)
    t0 = time.perf_counter()
    result = await s.pass_once()
    spent = time.perf_counter() - t0
    assert result.fired == due, result
    await db.close()
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--paused", type=int, default=100_000)
    parser.add_argument(
        "--lead", type=float, default=3.0, help="seconds to make the schedules in before they fire"
    )
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgres"])
    parser.add_argument("--pg-url", default=throughput.DEFAULT_PG)
    args = parser.parse_args()
    report: dict[str, Any] = {
        "schedules": args.schedules,
        "paused": args.paused,
        "cpus": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
    }
    for backend in args.backends:
        dbs = [throughput.Database(backend, args.pg_url, migrated=True) for _ in range(6)]
        try:
            one = asyncio.run(fire_once(dbs[0].url, args.schedules, 1, args.lead))
            print(f"{backend}: one scheduler {one['lateness_s']}", file=sys.stderr)
            three = asyncio.run(fire_once(dbs[1].url, args.schedules, 3, args.lead))
            print(f"{backend}: three schedulers {three['lateness_s']}", file=sys.stderr)
            full = asyncio.run(pass_time(dbs[2].url, args.schedules, 0, "f"))
            tenth = asyncio.run(pass_time(dbs[3].url, args.schedules // 10, 0, "t"))
            over_paused = asyncio.run(pass_time(dbs[4].url, 1, args.paused, "x"))
            alone = asyncio.run(pass_time(dbs[5].url, 1, 0, "y"))
        finally:
            for db in dbs:
                db.drop()
        report[backend] = {
            "one_scheduler": one,
            "three_schedulers": three,
            "pass_s": {
                "all_due": full,
                "tenth_due": tenth,
                "one_due_over_paused": over_paused,
                "one_due_alone": alone,
            },
            "ratio_all_vs_tenth_due": full / tenth,
            "ratio_over_paused_vs_alone": over_paused / alone,
            "p99_within_1s": one["lateness_s"]["p99"] is not None
            and one["lateness_s"]["p99"] <= 1.0
            and three["lateness_s"]["p99"] is not None
            and three["lateness_s"]["p99"] <= 1.0,
        }
        print(f"{backend}: {json.dumps(report[backend]['pass_s'])}", file=sys.stderr)
    report["load_average_at_end"] = os.getloadavg()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
