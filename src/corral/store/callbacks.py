"""Callback jobs made where a job ends: `callbacks_make`, in the transaction that ends it.

A job ends (succeeded, failed, quarantined) only from `running`, when its current attempt
ends: completions.attempt_finish is where every end is applied (the dispatcher's
completions, the reconciler's repairs, a worker's ends of Python tasks, a stop's), and it
calls `callbacks_make` with what it ended. The hot settles (hotpath.py) apply no success
of a job that has a `callback`: they hand it to attempt_finish. So the callback job is
written with the job's end, or neither is; and the job's end is a compare-and-set that
applies once, so its callback job is made once (its idempotency key says so again). What
the callback job is, is corral.callbacks' decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, or_, select

from corral import callbacks, launching, model, redaction
from corral.store import dialects
from corral.store import jobs as jobs_
from corral.store.events import event_insert, event_row
from corral.store.rows import job_from_row
from corral.store.tables import jobs


@dataclass(frozen=True, slots=True)
class JobEnd:
    """A job a completion ended, and how its attempt `fence` ended."""

    job_id: int
    state: model.JobState
    fence: int
    attempt_no: int
    attempt_state: model.AttemptState
    exit_code: int | None = None
    http_status: int | None = None
    reason: str | None = None
    output: launching.RunLog | None = None


def callbacks_make(conn: Connection, *, ends: Sequence[JobEnd], now: datetime) -> list[int]:
    """Make the callback job of each job of `ends` that has somewhere to send its result
    (corral.callbacks.target), with a line in the ended attempt's run log naming it; the
    ids of the callback jobs made. One read of the jobs that ended with a state that sends
    a result, and that name a callback; nothing else when none does."""
    sent = {e.job_id: e for e in ends if e.state in callbacks.SENT_ON}
    if not sent:
        return []
    rows = conn.execute(
        select(jobs).where(
            dialects.one_of(conn, jobs.c.id, sorted(sent)),
            or_(jobs.c.callback.is_not(None), jobs.c.failure_callback.is_not(None)),
        )
    ).all()
    made: list[tuple[JobEnd, model.NewJob]] = []
    for row in rows:
        e = sent[row.id]
        ended = callbacks.Ended(
            job_from_row(row),
            e.state,
            e.fence,
            e.attempt_no,
            e.exit_code,
            e.http_status,
            e.reason,
            e.output,
        )
        if (new := callbacks.callback_job(ended, now)) is not None:
            made.append((e, new))
    if not made:
        return []
    ids = jobs_.job_submit(conn, new=[new for _, new in made], now=now)
    _noted(conn, [(e, new, job_id) for (e, new), (job_id, _) in zip(made, ids, strict=True)], now)
    return [job_id for job_id, _ in ids]


def _noted(
    conn: Connection, made: Sequence[tuple[JobEnd, model.NewJob, int]], now: datetime
) -> None:
    """A line in each ended attempt's run log: which job sends its result, and where."""
    event_insert(
        conn,
        [
            event_row(
                job_id=e.job_id,
                attempt_id=e.fence,
                entity="attempt",
                frm=e.attempt_state,
                to=e.attempt_state,
                reason=f"result to be sent by job {job_id}"
                f" to {redaction.redacted(str(new.spec['url']))}",
                now=now,
                details={"callback_job": job_id},
            )
            for e, new, job_id in made
        ],
    )
