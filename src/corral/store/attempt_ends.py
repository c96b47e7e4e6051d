"""An attempt's supersession and its other ends that queue its job again at once: superseded
when its state is unknown (policy `fence_and_relaunch`), never launched, handed back by
a worker told to stop, or lost with the loop that sent it. Apart from attempts.py (an
attempt's news, waits and reads) because each of these ends an attempt and moves its job
in one fenced step (supersede), which parking.py's attempt_park shares; the ends that
finish an attempt with its outcome are completions.py's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select

from corral import model
from corral.store import dialects
from corral.store.events import jobs_follow, transition
from corral.store.tables import attempts, jobs

A, J = model.AttemptState, model.JobState


def attempt_supersede(
    conn: Connection, *, fences: Sequence[int], now: datetime, reason: str
) -> list[int]:
    """Unknown state, policy `fence_and_relaunch`: each running attempt of `fences` whose job
    has attempts left is superseded, and its job queued at once for a new attempt, whose
    higher fence makes sinks refuse the old one's writes. The superseded attempt ran, so it
    is charged. Returns the superseded fences; the others (no attempts left) are left as
    they are."""
    left = jobs.c.attempt_count - jobs.c.uncharged_attempts < jobs.c.max_attempts
    return supersede(
        conn,
        fences=fences,
        expected=A.RUNNING,
        where=[left],
        now=now,
        reason=reason,
        job_reason=f"relaunch with a higher fence: {reason}",
    )


def attempt_never_launched(
    conn: Connection, *, fences: Sequence[int], now: datetime, why: str, recorded: bool = False
) -> list[int]:
    """Attempts that never reached their platform and can no longer be launched (their
    deadline, fixed at the claim, passed first): each still `launching` is superseded with
    the reason model.NEVER_LAUNCHED, and its job queued at once for a new attempt, with a
    higher fence and a fresh deadline. It is not charged: the job's uncharged_attempts
    grows, so neither max_attempts nor the retry budget pays for it. Returns the
    superseded fences; one that moved meanwhile (adopted, cancelled) is left alone.

    `recorded`: the attempts were recorded `running` before their send (an HTTP request)
    and the process that holds them knows it never sent them; they are superseded from
    `running`. Recovery never sends such an attempt, so nothing else can have sent it."""
    return supersede(
        conn,
        fences=fences,
        expected=A.RUNNING if recorded else A.LAUNCHING,
        now=now,
        reason=f"{model.NEVER_LAUNCHED}: {why}; not charged",
        job_reason=f"new attempt: the last one {model.NEVER_LAUNCHED} ({why}); not charged",
        attempt_reason=model.NEVER_LAUNCHED,
        job_values={"uncharged_attempts": jobs.c.uncharged_attempts + 1},
    )


def attempt_hand_back(conn: Connection, *, fences: Sequence[int], now: datetime) -> list[int]:
    """Running attempts of Python tasks that their worker, told to stop, hands back
    unfinished (their checkpoints saved first): each is superseded with the reason
    model.HANDED_BACK and its job queued at once, not charged (as attempt_never_launched).
    Returns the fences handed back; one that moved meanwhile (a newer attempt, a cancel) is
    left alone, so a stopped run can never hand back a job someone else now runs."""
    dialects.notify(conn, dialects.TASKS)  # another worker may take them at once
    return supersede(
        conn,
        fences=fences,
        expected=A.RUNNING,
        now=now,
        reason=f"{model.HANDED_BACK}: its worker was told to stop; not charged",
        job_reason=f"new attempt: the last one was {model.HANDED_BACK}; not charged",
        attempt_reason=model.HANDED_BACK,
        job_values={"uncharged_attempts": jobs.c.uncharged_attempts + 1},
    )


def attempt_lost_with_sender(
    conn: Connection, *, fences: Sequence[int], now: datetime, why: str
) -> list[int]:
    """Blind attempts (recorded running before their send: an HTTP request) whose sender
    died (`why` says which): each still running is lost, and its job queued at once for a
    new attempt (a higher fence, the same Idempotency-Key). It is not charged, as
    attempt_never_launched: corral's own crash is not the job's failure, and most such
    attempts were still waiting for their turn to be sent. Returns the fences ended."""
    return supersede(
        conn,
        fences=fences,
        expected=A.RUNNING,
        to=A.LOST,
        now=now,
        reason=f"lost: {why}; not charged",
        job_reason=f"new attempt: the last one was lost with its sender ({why}); not charged",
        attempt_reason=f"lost with its sender: {why}",
        job_values={"uncharged_attempts": jobs.c.uncharged_attempts + 1},
    )


def supersede(
    conn: Connection,
    *,
    fences: Sequence[int],
    expected: model.AttemptState,
    now: datetime,
    reason: str,
    job_reason: str,
    where: Sequence[Any] = (),
    attempt_reason: str | None = None,
    job_values: Mapping[str, Any] | None = None,
    job_to: model.JobState = J.QUEUED,
    job_details: Mapping[str, Any] | None = None,
    to: model.AttemptState = A.SUPERSEDED,
) -> list[int]:
    """Supersede (or end as `to`) each current attempt of `fences` still in `expected` (and
    meeting `where`), and queue its job at once for a new attempt (or move it to `job_to`).
    Returns the fences ended."""
    dialects.lock_in_order(conn, attempts, fences)
    current = _current(conn, fences, expected, where)
    if not current:
        return []
    values: dict[str, Any] = {"finished_at": now}
    if attempt_reason is not None:
        values["reason"] = attempt_reason
    applied = transition(
        conn,
        entity="attempt",
        ids=current,
        expected=expected,
        to=to,
        now=now,
        reason=reason,
        values=values,
    )
    values = {"run_at": now, **(job_values or {})}
    jobs_follow(
        conn, applied, to=job_to, now=now, reason=job_reason, details=job_details, values=values
    )
    return [a.id for a in applied]


def _current(
    conn: Connection, fences: Sequence[int], expected: model.AttemptState, where: Sequence[Any]
) -> list[int]:
    """The fences still in `expected` (and meeting `where`) that are their running job's
    current attempt."""
    rows = conn.execute(
        select(attempts.c.id)
        .join(jobs, jobs.c.id == attempts.c.job_id)
        .where(
            dialects.one_of(conn, attempts.c.id, fences),
            attempts.c.state == expected,
            jobs.c.state == J.RUNNING,
            jobs.c.attempt_count == attempts.c.attempt_no,
            *where,
        )
    ).all()
    return [r.id for r in rows]
