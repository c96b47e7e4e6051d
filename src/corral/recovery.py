"""What the reconciler's parts share: the tally of one pass, the log line of a repair, and
a stop on a platform that says whether it got through.

The reconciler (corral.reconciler) repairs due attempts; its maintenance passes
(corral.maintenance), its handling of the unknown state (corral.unknown) and its stopping
of overdue attempts (corral.stopping) each count what they did in the same `Pass`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from datetime import timedelta

from corral import errors, model, store
from corral.executors.base import Executor

log = logging.getLogger("corral.reconciler")


@dataclass(slots=True)
class Pass:
    """What one reconciler pass did."""

    looked: int = 0
    adopted: int = 0
    relaunched: int = 0
    completed: int = 0
    timed_out: int = 0
    labelled: int = 0  # an earlier corral's launches, given this installation's label
    stopping: int = 0  # stopped, but a part still runs (a pod in its termination grace)
    lost: int = 0
    conflicts: int = 0
    unknown: int = 0
    waiting: int = 0
    superseded: int = 0
    never_launched: int = 0
    orphans_cancelled: int = 0
    forgotten: int = 0
    jobs_removed: int = 0
    logs_trimmed: int = 0  # run logs trimmed for their tenant's run_log_bytes
    slas_missed: int = 0
    parked: int = 0  # Python tasks' jobs no live worker reads (queued, or whose worker went)
    unparked: int = 0  # parked ones a live worker reads after all (a race, a silence ended)

    def __str__(self) -> str:
        return ", ".join(
            f"{f.name.replace('_', ' ')} {getattr(self, f.name)}" for f in fields(self)
        )


def repaired(attempt: model.Attempt, what: str) -> None:
    """Say in the log what recovery did to `attempt`."""
    log.info("%s (job %d, fence %d): %s", attempt.launch_name, attempt.job_id, attempt.id, what)


async def stop(executor: Executor, name: str, grace: timedelta) -> bool:
    """Cancel `name` on its platform; False (and a log line) when that did not get through."""
    try:
        await executor.cancel(name, grace)
    except errors.ExecutorError as exc:
        log.warning("%s: could not stop it, will try again: %s", name, exc)
        return False
    return True


def failed(attempt: model.Attempt, why: str) -> store.Finish:
    """A failure recovery decided on (a timeout, a launch conflict): never the job's fault."""
    return store.Finish(
        attempt.id, model.AttemptState.FAILED, None, why, model.FailureClass.TRANSIENT
    )
