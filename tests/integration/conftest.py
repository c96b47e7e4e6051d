"""What the integration tests share: corral's loops running in-process on a real SQLite
file, with the process executor and short limits, and a client to drive them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from corral import client, config, model, runtime, store
from tests.integration.test_process_executor import kill_leftovers

J = model.JobState


@dataclass
class Corral:
    client: client.Client
    root: Path
    database_url: str

    async def submit(self, script: str, **kw: Any) -> int:
        job_id, _ = await self.client.submit(spec={"command": ["sh", "-c", script]}, **kw)
        return job_id

    async def wait(self, job_id: int, *states: J, seconds: float = 40) -> client.JobView:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            view = await self.client.job(job_id)
            if view.job.state in states:
                return view
            await asyncio.sleep(0.1)
        raise AssertionError(f"job {job_id} not {states} after {seconds}s: {view}")

    def runs(self, job_id: int) -> list[str]:
        return sorted(p.name for p in self.root.glob(f"corral-{job_id}-*"))


@pytest.fixture
async def corral(tmp_path: Path) -> AsyncIterator[Corral]:
    url = f"sqlite:///{tmp_path}/corral.db"
    settings = config.Settings(
        database_url=url,
        state_dir=tmp_path / "state",
        timeouts=config.Timeouts(
            margin="500ms",
            tick_margin="50ms",
            dispatch_interval="200ms",
            observe_interval="200ms",
            reconcile_interval="300ms",
            launch_grace="2s",
            lease_timeout="10s",
            attempt_deadline="20s",
            cancel_grace="1s",
            recovery_grace="30s",
        ),
    )
    db = store.Store.connect(url)
    await db.migrate()
    await db.close()
    stop = asyncio.Event()
    loops = asyncio.create_task(runtime.serve(settings, stop))
    async with runtime.connect(settings) as c:
        try:
            yield Corral(c, settings.process_root, url)
        finally:
            stop.set()
            await asyncio.wait_for(loops, 30)
            kill_leftovers(settings.process_root)
