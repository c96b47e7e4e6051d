"""A person's decisions on one job: cancel it (a running one's attempt stopped first), and
send a quarantined one back or let it go."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, case, select

from corral import errors, model
from corral.store.events import transition
from corral.store.rows import attempt_from_row, job_get
from corral.store.tables import attempts, jobs

A, J = model.AttemptState, model.JobState


# --- cancel ------------------------------------------------------------------------------------


def job_cancel(
    conn: Connection, *, job_id: int, now: datetime, reason: str
) -> model.Attempt | None:
    """Cancel a job that has not ended; returns its active attempt (now cancelled), if any.

    Cancelling a cancelled job again is a no-op. Raises NotFound, or InvalidInput when the
    job ended otherwise or changed under us. Attempts are written before their job, the
    same order completions use, so a cancel and a completion cannot deadlock.
    """
    job = job_get(conn, job_id=job_id)
    if job.state == J.CANCELLED:
        return None
    if job.state in model.FINAL_JOB_STATES:
        raise errors.Conflict(f"job {job_id} has already ended ({job.state}); nothing to cancel")
    attempt = _active_attempt(conn, job_id)
    if attempt is not None:
        transition(
            conn,
            entity="attempt",
            ids=[attempt.id],
            expected=attempt.state,
            to=A.CANCELLED,
            now=now,
            reason=reason,
            values={"finished_at": now},
        )
    if not transition(
        conn,
        entity="job",
        ids=[job_id],
        expected=job.state,
        to=J.CANCELLED,
        now=now,
        reason=reason,
        attempt_nos=[job.attempt_count],
    ):
        raise errors.InvalidInput(f"job {job_id} changed state while cancelling; look again")
    return attempt


def _active_attempt(conn: Connection, job_id: int) -> model.Attempt | None:
    row = conn.execute(
        select(attempts).where(
            attempts.c.job_id == job_id, attempts.c.state.in_([A.LAUNCHING, A.RUNNING])
        )
    ).first()
    return None if row is None else attempt_from_row(row._mapping)


# --- quarantine ----------------------------------------------------------------------------------


def job_unquarantine(
    conn: Connection, *, job_id: int, to: model.JobState, now: datetime, reason: str
) -> None:
    """A person decides on a quarantined job: back to `queued` now (with one more attempt
    if it had none left), or `cancelled` to give up on it."""
    _quarantined(conn, job_id)
    charged = jobs.c.attempt_count - jobs.c.uncharged_attempts
    values: dict[str, Any] = {}
    if to == J.QUEUED:
        values = {
            "run_at": now,
            "max_attempts": case(
                (jobs.c.max_attempts > charged, jobs.c.max_attempts),
                else_=charged + 1,
            ),
        }
    transition(
        conn,
        entity="job",
        ids=[job_id],
        expected=J.QUARANTINED,
        to=to,
        now=now,
        reason=reason,
        values=values,
    )


def _quarantined(conn: Connection, job_id: int) -> None:
    job = job_get(conn, job_id=job_id)
    if job.state != J.QUARANTINED:
        raise errors.Conflict(
            f"job {job_id} is {job.state}, not quarantined; `corral dead list` shows the"
            " quarantined jobs"
        )
