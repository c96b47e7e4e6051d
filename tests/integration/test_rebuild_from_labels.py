"""With every corral process gone and the store intact, a fresh reconciler and a fresh
process executor (no memory of anything) rebuild which launch is which attempt from the
run folders' labels alone."""

from __future__ import annotations

from pathlib import Path

from corral import config, durations, launching, model, reconciler, store, timeouts
from corral.clock import SystemClock
from corral.executors.process import ProcessExecutor
from corral.testing import FrozenClock
from tests.support.wait import eventually

A, J = model.AttemptState, model.JobState


async def test_a_fresh_reconciler_adopts_and_stops_orphans_from_labels(
    db: store.Store, tmp_path: Path
) -> None:
    clock = SystemClock()
    first = ProcessExecutor(root=tmp_path / "runs", clock=clock)
    await first.start()
    spec = {"command": ["sleep", "30"]}
    jobs = [model.NewJob(executor="process", spec=spec) for _ in range(3)]
    await db.jobs.submit(new=jobs, now=clock.now())
    claimed = await db.jobs.claim(now=clock.now(), limit=3, executors=["process"])
    for c in claimed:  # launched, then corral died before recording anything
        await first.launch(
            launching.build_launch(c, reach=launching.Reach(), deadline_seconds=None)
        )
    await first.close()
    del first
    keep, cancel, adopt = claimed
    await db.jobs.cancel(
        job_id=cancel.job.id, now=clock.now(), reason="cancelled while corral was down"
    )

    fresh = ProcessExecutor(root=tmp_path / "runs", clock=clock)
    await fresh.start()
    settings = config.Settings(timeouts=timeouts.Timeouts(cancel_grace="2s"))
    later = FrozenClock(clock.now())  # the reconciler's time; the platform's stays real
    later.advance(settings.timeouts.launch_grace.total_seconds() + 1)
    r = reconciler.Reconciler(
        store=db, executors={"process": fresh}, clock=later, settings=settings
    )
    summary = await r.run_once()
    assert (summary.adopted, summary.orphans_cancelled, summary.relaunched) == (2, 1, 0)
    states = {a.job_id: a.state for c in claimed for a in await db.attempts.list(job_id=c.job.id)}
    assert states == {keep.job.id: A.RUNNING, cancel.job.id: A.CANCELLED, adopt.job.id: A.RUNNING}
    name = cancel.attempt.launch_name

    async def finished() -> launching.Observation | None:  # the shim writes the exit
        obs = (await fresh.observe([name]))[name]
        return obs if obs.phase.finished else None

    stopped = await eventually(finished, what="the orphan stopped")
    assert stopped.phase is launching.Phase.FAILED
    assert stopped.identity == model.Identity(cancel.job.id, 1, cancel.attempt.id)
    for c in (keep, adopt):  # clean up the two still sleeping
        await fresh.cancel(c.attempt.launch_name, durations.parse_duration("1s"))
    await fresh.close()
