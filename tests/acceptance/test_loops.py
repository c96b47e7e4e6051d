"""corral's loops as people deploy them, each a real process on a real database: a
dispatcher alone runs a delayed job."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from corral import model, store
from tests.support.crash import Site, stop
from tests.support.wait import eventually_sync


@pytest.fixture
def site(db_url: str, tmp_path: Path) -> Site:
    return Site(tmp_path, db_url)


def _job_state(url: str, job_id: int) -> model.JobState:
    async def read() -> model.JobState:
        db = store.Store.connect(url)
        try:
            return (await db.job_get(job_id=job_id)).state
        finally:
            await db.close()

    return asyncio.run(read())


def test_a_delayed_job_runs_with_only_a_dispatcher(site: Site) -> None:
    """No scheduler runs: the dispatcher's claim queues the job at its time and takes it."""
    made = site.corral("submit", "--delay", "1s", "--", "sh", "-c", "echo later")
    job_id = int(made.stdout.split()[-1])
    assert _job_state(site.url, job_id) == model.JobState.SCHEDULED
    dispatcher = site.start("dispatcher")
    try:
        eventually_sync(
            lambda: _job_state(site.url, job_id) == model.JobState.SUCCEEDED,
            what=f"job {job_id} succeeded",
        )
    finally:
        stop(dispatcher)
    shown = site.corral("jobs", "show", str(job_id))
    assert "its time came" in shown.stdout
