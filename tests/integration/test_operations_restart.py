"""A bulk operation survives its runner's death: a real `corral api` process stepping a
cancel of many jobs is killed with SIGKILL mid-operation; a new one finishes it, and every
job of the snapshot was cancelled exactly once (one cancelled event, none skipped)."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path

import pytest

from corral import model, store
from corral.clock import SystemClock
from corral.testing import FrozenClock
from tests.support.crash import Site, stop
from tests.support.wait import eventually

Progress = Callable[[], Awaitable[model.Operation]]
JOBS = 600
BATCH = 4  # small steps: the kill lands with most of the operation still to do


def _api(site: Site) -> subprocess.Popen[str]:
    """`corral api` (no dispatcher: the jobs stay queued), its runner in small steps."""
    with open(site.root / "corral.log", "a") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "corral", "api", "--http", "127.0.0.1:0"],
            cwd=site.root,
            env=site.env(
                CORRAL_OPERATION_BATCH_LIMIT=str(BATCH),
                CORRAL_TIMEOUTS__OPERATION_INTERVAL="100ms",
            ),
            stdout=subprocess.DEVNULL,
            stderr=log,
            text=True,
        )


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_an_operation_killed_mid_way_is_finished_by_the_next_process_once(
    db: store.Store, db_url: str, tmp_path: Path
) -> None:
    clock = FrozenClock()
    new = [
        model.NewJob(executor="process", spec={"command": ["true"]}, queue="bulk")
        for _ in range(JOBS)
    ]
    ids = [job_id for job_id, _ in await db.jobs.submit(new=new, now=clock.now())]
    op = await db.operations.create(
        tenant=None,
        action=model.BulkAction.CANCEL,
        given=model.JobFilter(queue="bulk"),
        expect=JOBS,
        token_id=None,
        made_by="test",
        now=clock.now(),
    )
    site = Site(tmp_path, db_url)

    async def progress() -> model.Operation:
        return await db.operations.get(operation_id=op.id)

    first = _api(site)
    try:
        await eventually(lambda: _applied(progress, 40), what="the first runner's progress")
        first.send_signal(signal.SIGKILL)
        assert first.wait(timeout=30) == -signal.SIGKILL
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    cut = await progress()
    assert cut.state == model.OperationState.RUNNING, "finished before the kill: make it longer"
    assert 0 < cut.applied < JOBS
    second = _api(site)
    try:
        await eventually(
            lambda: _ended(progress), within=180, what="the operation finished after a restart"
        )
    finally:
        stop(second)
    done = await progress()
    assert (done.state, done.applied, done.skipped, done.left) == (
        model.OperationState.SUCCEEDED,
        JOBS,
        0,
        0,
    )
    for job_id in ids:
        cancels = [e for e in await db.events.list(job_id=job_id) if e.to_state == "cancelled"]
        assert len(cancels) == 1, f"job {job_id}: {cancels}"


async def _applied(progress: Progress, least: int) -> bool:
    return (await progress()).applied >= least


async def _ended(progress: Progress) -> bool:
    return (await progress()).state == model.OperationState.SUCCEEDED


@pytest.mark.timeout(300)
async def test_corral_serve_without_the_api_runs_bulk_operations_too(
    db: store.Store, db_url: str, tmp_path: Path
) -> None:
    """`corral serve` with no --http steps operations in its own loops (with --http, the
    runner beside the API does, so a process has one)."""
    clock = FrozenClock()
    later = SystemClock().now() + timedelta(days=1)  # not due: the dispatcher leaves them
    new = [
        model.NewJob(executor="process", spec={"command": ["true"]}, queue="bulk", run_at=later)
        for _ in range(5)
    ]
    await db.jobs.submit(new=new, now=clock.now())
    op = await db.operations.create(
        tenant=None,
        action=model.BulkAction.CANCEL,
        given=model.JobFilter(queue="bulk"),
        expect=5,
        token_id=None,
        made_by="test",
        now=clock.now(),
    )

    async def progress() -> model.Operation:
        return await db.operations.get(operation_id=op.id)

    serving = Site(tmp_path, db_url).start("serve")
    try:
        await eventually(lambda: _ended(progress), within=120, what="corral serve ran it")
    finally:
        stop(serving)
    done = await progress()
    assert (done.applied, done.skipped) == (5, 0)
