"""A retry storm: everything fails at once. How many retries does corral launch, with the
retry budget and without it?

    .venv/bin/python bench/retry_storm.py [--jobs 2000] [--attempts 4]

N jobs in one queue all fail transiently on every attempt (a dependency is down). On a
real SQLite file, with a clock that moves only when told, the dispatcher runs until every
job has ended; the figures count the retries launched in the first minute, and how long
it took until every job ended. The baseline is the same run with a budget so large it
never delays anything (the storm as it would be without one). Prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.noop import NoopExecutor

from corral import config, dispatcher, model, policy, store
from corral.testing import FrozenClock

RETRY_75 = {
    "failure_rules": [{"on_exit_codes": {"operator": "In", "values": [75]}, "action": "retry"}]
}
STEP_SECONDS = 15.0  # the clock moves this far when nothing is due


async def storm(jobs: int, attempts: int, budget: config.BudgetSettings) -> dict[str, Any]:
    folder = tempfile.mkdtemp(prefix="corral-storm-")
    db = store.Store.connect(f"sqlite:///{folder}/storm.db")
    await db.database.migrate()
    clock = FrozenClock()
    settings = config.Settings(
        claim_batch_limit=500,
        recovery_batch_limit=1000,  # two claims: a tick's, and the next one made meanwhile
        retry=config.RetrySettings(base=1, cap=30, seed=1, budget=budget),
    )
    executor = NoopExecutor(fail_exit_code=75)
    d = dispatcher.Dispatcher(
        store=db, executors={"noop": executor}, clock=clock, settings=settings
    )
    stored = policy.job_policy(settings, RETRY_75).stored()
    new = [model.NewJob(executor="noop", spec={}, max_attempts=attempts, policy=stored)] * jobs
    await db.jobs.submit(new=new, now=clock.now())
    start, launched_at = clock.now(), []
    events = executor.events()
    while True:
        tick = await d.run_once()
        for _ in range(tick.launched):
            d.completions.offer(await anext(events))
        await d.completions.flush()
        launched_at += [(clock.now() - start).total_seconds()] * tick.launched
        if tick.claimed == 0:
            if await db.jobs.count_by_state() == {"failed": jobs}:
                break
            clock.advance(STEP_SECONDS)
    await db.close()
    retries = launched_at[jobs:]
    first_minute = sum(1 for t in retries if t <= 60)
    return {
        "retries": len(retries),
        "retries_in_first_minute": first_minute,
        "retries_per_first_attempt_in_first_minute": first_minute / jobs,
        "seconds_until_every_job_ended": launched_at[-1],
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--attempts", type=int, default=4)
    args = parser.parse_args()
    budget = config.BudgetSettings()
    unbounded = config.BudgetSettings(ratio=10, floor_per_minute=1_000_000, burst=1_000_000)
    with_budget = await storm(args.jobs, args.attempts, budget)
    without = await storm(args.jobs, args.attempts, unbounded)
    print(
        json.dumps(
            {
                "jobs": args.jobs,
                "attempts_each": args.attempts,
                "budget": budget.model_dump(),
                "with_budget": with_budget,
                "without_budget": without,
                "ratio_first_minute_retries_with_vs_without": with_budget["retries_in_first_minute"]
                / max(without["retries_in_first_minute"], 1),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
