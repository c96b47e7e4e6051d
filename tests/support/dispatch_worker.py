"""A dispatcher in its own OS process, with the no-op executor, for multi-dispatcher tests.
A job whose spec says `{"sleep": SECONDS}` runs that long (its work: no test waits on it),
and when each such run began and ended, by the wall clock, is written beside the ledger
(`LEDGER.slept`): what a test of how many ran at once reads."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from corral import config, dispatcher, launching, model, store, timeouts
from corral.clock import SystemClock
from tests.support.noop import NoopExecutor


class SleepyExecutor(NoopExecutor):
    """The no-op executor, but a launch whose spec has `sleep` finishes that many seconds
    later."""

    def __init__(self) -> None:
        super().__init__()
        self._runs: set[asyncio.Task[None]] = set()
        self.slept: list[tuple[float, float]] = []  # each sleeping run's (begin, end)

    async def launch(self, launch: launching.Launch) -> None:
        seconds = float(launch.spec.get("sleep", 0))
        if not seconds or launch.name in self.launches:
            await super().launch(launch)
            return
        if launch.name in self._seen:
            return  # sleeping already
        self._seen[launch.name] = launching.Observation(
            launch.name, launching.Phase.RUNNING, labels=launch.labels
        )
        run = asyncio.create_task(self._later(launch, seconds))
        self._runs.add(run)
        run.add_done_callback(self._runs.discard)

    async def _later(self, launch: launching.Launch, seconds: float) -> None:
        begun = time.time()  # the wall clock: the same in every dispatcher process
        await asyncio.sleep(seconds)
        self.slept.append((begun, time.time()))
        await super().launch(launch)


def run(url: str, ledger: str, claim_batch_limit: int, start: Any = None) -> None:
    """Dispatch until no job is queued or running, then write every launched name to `ledger`.
    `start`, a multiprocessing barrier, makes all the workers begin together."""
    if start is not None:
        start.wait(timeout=120)
    asyncio.run(_run(url, Path(ledger), claim_batch_limit))


async def _run(url: str, ledger: Path, claim_batch_limit: int) -> None:
    db = store.Store.connect(url)
    executor = SleepyExecutor()
    settings = config.Settings(
        database_url=url,
        claim_batch_limit=claim_batch_limit,
        timeouts=timeouts.Timeouts(
            dispatch_interval=0.02, tick_deadline=0.015, tick_margin=0.005, observe_interval=0.5
        ),
    )
    d = dispatcher.Dispatcher(
        store=db, executors={"noop": executor}, clock=SystemClock(), settings=settings
    )
    stop = asyncio.Event()
    runner = asyncio.create_task(d.run(stop))
    while await db.jobs.list(model.JobFilter(states=["queued", "running"]), limit=1):
        await asyncio.sleep(0.05)
    stop.set()
    await runner
    await db.close()
    ledger.write_text("".join(f"{name}\n" for name in executor.launches))
    slept = ledger.with_suffix(".slept")
    slept.write_text("".join(f"{begun} {ended}\n" for begun, ended in executor.slept))
