"""Jobs put straight into a store, as the tests of the store, its loops and the API set
the scene (submitted at a clock's time, or moved to quarantined with nothing run), and
their states read back."""

from __future__ import annotations

from corral import client, clock, model, store

J = model.JobState


async def submit(db: store.Store, at: clock.Clock, *jobs: model.NewJob) -> list[int]:
    """Submit `jobs` at `at`'s now: their ids, in order."""
    return [job_id for job_id, _ in await db.jobs.submit(new=list(jobs), now=at.now())]


async def quarantine(db: store.Store, at: clock.Clock, ids: list[int]) -> None:
    """Move the queued jobs `ids` to quarantined, through running, at `at`'s now."""
    for frm, to in ((J.QUEUED, J.RUNNING), (J.RUNNING, J.QUARANTINED)):
        await db.events.transition(
            entity="job", ids=ids, expected=frm, to=to, now=at.now(), reason="test"
        )


async def all_in(c: client.Client, ids: list[int], state: model.JobState) -> bool:
    """Whether every job of `ids` is in `state`."""
    return all([(await c.job(i)).job.state == state for i in ids])
