"""What the integration tests share: corral's loops running in-process on a real SQLite
file, with the process executor and short limits, and a client to drive them; on the real
clock (`corral`), or on a PausedClock that only the test moves (`paused_corral`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from corral import client, clock, config, errors, health, model, runtime, timeouts
from corral.api.server import serve_attempts
from corral.testing import PausedClock
from tests.support.cluster import cluster  # noqa: F401  (the Kubernetes double, a fixture)
from tests.support.mail import smtp  # noqa: F401  (an SMTP server on 127.0.0.1, a fixture)
from tests.support.procs import kill_leftovers
from tests.support.wait import PATIENCE, eventually

J = model.JobState
ROUND = (health.DISPATCHER, health.RECONCILER, health.SCHEDULER, health.ALERTER)
"""The loops `corral serve` runs (the alerter too, with no rule set), each with a round."""


@dataclass
class Corral:
    client: client.Client
    root: Path
    database_url: str
    health_file: Path
    clock: clock.Clock

    async def submit(self, script: str, **kw: Any) -> int:
        job_id, _ = await self.client.submit(spec={"command": ["sh", "-c", script]}, **kw)
        return job_id

    async def wait(self, job_id: int, *states: J, seconds: float = PATIENCE) -> client.jobs.JobView:
        async def there() -> client.jobs.JobView | None:
            view = await self.client.job(job_id)
            return view if view.job.state in states else None

        found: client.jobs.JobView = await eventually(
            there, within=seconds, every=0.1, what=f"job {job_id} {states}"
        )
        return found

    async def after_a_round(self) -> None:
        """Return once the dispatcher has made a whole tick and the reconciler a whole pass
        after this call: what either would do next, it has had the chance to do. (The
        health file has when each last ended; a round that ended after one that ended
        after this call began after this call.)"""

        async def ended_after(since: Mapping[str, datetime]) -> dict[str, datetime] | None:
            try:
                loops = dict(health.read(self.health_file).loops)
            except errors.Unhealthy:
                return None  # not written yet
            later = len(loops) == len(ROUND) and all(
                at > since.get(name, at) for name, at in loops.items()
            )
            return loops if later else None

        now = self.client.clock.now()
        first = await eventually(
            lambda: ended_after(dict.fromkeys(ROUND, now)),
            what="a tick and a pass of each loop ended",
        )
        await eventually(lambda: ended_after(first), what="a whole tick and pass after that")

    def runs(self, job_id: int) -> list[str]:
        return sorted(p.name for p in self.root.glob(f"corral-{job_id}-*"))


@contextlib.asynccontextmanager
async def _running(tmp_path: Path, url: str, clk: clock.Clock) -> AsyncIterator[Corral]:
    settings = config.Settings(
        database_url=url,
        state_dir=tmp_path / "state",
        health_file=tmp_path / "health.json",
        timeouts=timeouts.Timeouts(
            margin="500ms",
            tick_margin="50ms",
            dispatch_interval="200ms",
            observe_interval="200ms",
            reconcile_interval="300ms",
            launch_grace="2s",
            lease_timeout="10s",
            attempt_deadline="40s",
            cancel_grace="1s",
            recovery_grace="60s",
        ),
    ).serving_attempts()  # as `corral serve` does: process jobs reach it on its socket
    stop = asyncio.Event()
    loops = asyncio.create_task(runtime.serve(settings, stop, clk=clk))
    attempts = asyncio.create_task(serve_attempts(settings, stop))
    async with runtime.opened(settings, clk=clk) as rt:
        c = client.Client(store=rt.store, executors=rt.executors, settings=settings, clock=clk)
        try:
            yield Corral(c, settings.process_root, url, tmp_path / "health.json", clk)
        finally:
            stop.set()
            await asyncio.wait_for(loops, PATIENCE)
            await asyncio.wait_for(attempts, PATIENCE)
            kill_leftovers(settings.process_root)


@pytest.fixture
async def corral(tmp_path: Path, sqlite_url: str) -> AsyncIterator[Corral]:
    async with _running(tmp_path, sqlite_url, clock.SystemClock()) as running:
        yield running


@pytest.fixture
async def paused_corral(tmp_path: Path, sqlite_url: str) -> AsyncIterator[Corral]:
    """corral's loops and the client on a PausedClock that starts at the real time: a lease
    or a deadline passes for them only when the test moves the clock on (`corral.clock`).
    The jobs' processes keep real time: a heartbeat renews a lease from when it is sent.
    Its loops sleep a tenth of a second of real time each round, as often as on the real
    clock, not more."""
    clk = PausedClock(datetime.now(UTC), pause=0.1)
    async with _running(tmp_path, sqlite_url, clk) as running:
        clk.advance(max((datetime.now(UTC) - clk.now()).total_seconds(), 0.0))  # the test's start
        yield running
