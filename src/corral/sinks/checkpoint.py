"""Fenced checkpoints: a job's progress, kept in corral's store, that only its newest
attempt may write. A relaunched attempt resumes from the newest state; the attempt it
replaced, still running somewhere, cannot roll that state back.

    from corral.sinks import load_checkpoint, save_checkpoint

    done = load_checkpoint(default={"page": 0})["page"]
    for page in range(done, pages):
        work(page)
        save_checkpoint({"page": page + 1})   # StaleFence once a newer attempt exists: stop

Inside an attempt the job and the fence come from CORRAL_JOB_ID and CORRAL_FENCE; the
calls go to corral's API with CORRAL_ATTEMPT_TOKEN when corral gave the attempt one
(CORRAL_API_URL), else to the store at CORRAL_DATABASE_URL. A state is any JSON value.
"""

from __future__ import annotations

import json
from typing import Any

from corral import clock, config, errors
from corral.sinks.fence import run_blocking, store_for
from corral.worker import CurrentAttempt, current_attempt, in_task, own_api
from corral.worker.api import AttemptApi
from corral.worker.context import TaskContext


async def save_checkpoint_async(
    state: Any, *, attempt: CurrentAttempt | None = None, settings: config.Settings | None = None
) -> None:
    """Keep `state` as this job's checkpoint. StaleFence when a newer attempt of the job
    exists or has saved one: this attempt has been replaced and must stop."""
    if (task := _own_task(attempt)) is not None:
        await task.save_checkpoint_async(state)
        return
    attempt = attempt or current_attempt()
    try:
        json.dumps(state)
    except (TypeError, ValueError) as exc:
        raise errors.InvalidInput(f"checkpoint state: must be JSON: {exc}") from None
    if (reach := own_api(attempt.fence)) is not None:
        async with AttemptApi(reach) as api:
            await api.checkpoint_save(state)
        return
    db = store_for(settings)
    try:
        now = clock.SystemClock().now()
        await db.sinks.checkpoint_save(
            job_id=attempt.job_id, fence=attempt.fence, state=state, now=now
        )
    finally:
        await db.close()


async def load_checkpoint_async(
    *,
    default: Any = None,
    attempt: CurrentAttempt | None = None,
    settings: config.Settings | None = None,
) -> Any:
    """This job's newest checkpoint, whichever attempt saved it; `default` if none."""
    if (task := _own_task(attempt)) is not None:
        return await task.load_checkpoint_async(default)
    attempt = attempt or current_attempt()
    if (reach := own_api(attempt.fence)) is not None:
        async with AttemptApi(reach) as api:
            found = await api.checkpoint_load()
        return default if found is None else found[1]
    db = store_for(settings)
    try:
        found = await db.sinks.checkpoint_load(job_id=attempt.job_id)
    finally:
        await db.close()
    return default if found is None else found[1]


def save_checkpoint(
    state: Any, *, attempt: CurrentAttempt | None = None, settings: config.Settings | None = None
) -> None:
    """`save_checkpoint_async` for code that does not run an event loop."""
    run_blocking(save_checkpoint_async(state, attempt=attempt, settings=settings))


def load_checkpoint(
    *,
    default: Any = None,
    attempt: CurrentAttempt | None = None,
    settings: config.Settings | None = None,
) -> Any:
    """`load_checkpoint_async` for code that does not run an event loop."""
    return run_blocking(load_checkpoint_async(default=default, attempt=attempt, settings=settings))


def _own_task(attempt: CurrentAttempt | None) -> TaskContext | None:
    """The task a `corral worker` runs here, when the call is for its own attempt: its
    checkpoints go over the worker's own store."""
    task = in_task()
    if task is None or (attempt is not None and attempt.fence != task.fence):
        return None
    return task
