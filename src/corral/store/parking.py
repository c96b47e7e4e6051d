"""The parking of Python tasks' jobs: a job no live worker reads (its task and payload
version, of its queue) waits `parked` until a worker that reads it registers or is heard
from again, or a person releases it. Apart from workers.py because it moves jobs (and ends
the attempts of a worker gone away), while workers.py keeps who is registered and alive,
what each reads and its claim.

Parking never makes an attempt: a queued job moves to `parked` and back with one event
each, so it costs neither an attempt nor a token of its queue's retry budget. Each park
records the lowest app version known to read the job (lowest_app_versions).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, exists, func, or_, select

from corral import model, python_tasks
from corral.store import attempt_ends, dialects, task_jobs
from corral.store.events import transition
from corral.store.rows import job_from_row, state_is
from corral.store.tables import events, jobs, schedules, worker_tasks, workers

A, J = model.AttemptState, model.JobState

RELEASED = "released by a person: parked no more"
"""The reason of a manual release; the park pass leaves a job so released alone."""

BATCH = 5000
"""Jobs parked or released per statement: a backlog of tens of thousands moves in a few."""


def attempt_park(
    conn: Connection, *, fences: Sequence[int], task: str, version: int, now: datetime, why: str
) -> list[int]:
    """Running attempts of (task, version) whose worker went away while no live worker reads
    it: each is superseded with the reason model.NO_COMPATIBLE_WORKER and its job parked,
    not charged, until a worker that reads it registers; the park records the lowest app
    version known to read it. Returns the fences."""
    need = lowest_app_versions(conn, pairs=[(task, version)]).get((task, version))
    return attempt_ends.supersede(
        conn,
        fences=fences,
        expected=A.RUNNING,
        now=now,
        reason=f"{model.NO_COMPATIBLE_WORKER}: {why}; not charged",
        job_reason=f"parked: {model.NO_COMPATIBLE_WORKER} ({why}); not charged",
        attempt_reason=model.NO_COMPATIBLE_WORKER,
        job_values={"uncharged_attempts": jobs.c.uncharged_attempts + 1},
        job_to=J.PARKED,
        job_details={"task": task, "version": version, "needs_app_version": need},
    )


def jobs_park_unread(
    conn: Connection, *, now: datetime, since: datetime, job_ids: Sequence[int] | None = None
) -> int:
    """Park every queued Python task's job (of `job_ids`, when given) that no live worker
    reads (before its first pickup, or back in the queue after a retry), unless a person
    released it. Each park's event records the lowest app version known to read the job.
    Returns how many parked."""
    released = exists(
        select(events.c.id).where(
            events.c.job_id == jobs.c.id,
            events.c.entity == "job",
            events.c.to_state == J.QUEUED,
            events.c.reason == RELEASED,
        )
    )
    parked = 0
    while True:
        rows = conn.execute(
            select(jobs.c.id, task_jobs.TASK.label("task"), task_jobs.VERSION.label("version"))
            .where(
                *task_jobs.python_in(J.QUEUED),
                *([dialects.one_of(conn, jobs.c.id, job_ids)] if job_ids is not None else []),
                ~task_jobs.read_by_live(conn, since),
                ~released,
            )
            .order_by(jobs.c.id)
            .limit(BATCH)
        ).all()
        parked += _jobs_park(conn, rows, now)
        if len(rows) < BATCH:
            return parked


def _jobs_park(conn: Connection, rows: Sequence[Any], now: datetime) -> int:
    """Park the queued jobs of `rows` (id, task, version), one transition per (task,
    version), each event naming the lowest app version known to read it; how many parked."""
    needs = lowest_app_versions(conn, pairs=[(r.task, r.version) for r in rows])
    by_pair: dict[tuple[str, int], list[int]] = {}
    for r in rows:
        by_pair.setdefault((r.task, r.version), []).append(r.id)
    parked = 0
    for (task, version), ids in sorted(by_pair.items()):
        need = needs.get((task, version))
        wants = f"app version {need} or later reads it" if need else "no worker ever read it"
        parked += len(
            transition(
                conn,
                entity="job",
                ids=ids,
                expected=J.QUEUED,
                to=J.PARKED,
                now=now,
                reason=f"parked: no live worker reads task {task} version {version}"
                f" ({wants}); no attempt spent",
                details={"task": task, "version": version, "needs_app_version": need},
            )
        )
    return parked


def jobs_unpark(
    conn: Connection,
    *,
    reads: Sequence[tuple[str, Sequence[int]]],
    now: datetime,
    reason: str,
    queues: Sequence[str] = (),
) -> int:
    """Queue again every parked job of `reads` (task, versions), of `queues` (all when
    empty); tell waiting workers. Returns how many."""
    if not reads:
        return 0
    in_queues = [jobs.c.queue.in_(list(queues))] if queues else []
    return len(
        _queue_parked(conn, [task_jobs.reads_any(reads), *in_queues], now=now, reason=reason)
    )


def jobs_unpark_read(conn: Connection, *, now: datetime, since: datetime) -> int:
    """Queue again every parked job some live worker reads (of its queue): what a park
    that raced a registration, or one made while its worker was silent, left behind.
    Returns how many."""
    reason = "a live worker reads it: queued again"
    return len(_queue_parked(conn, [task_jobs.read_by_live(conn, since)], now=now, reason=reason))


def parked_release(
    conn: Connection, *, job_ids: Sequence[int] = (), task: str | None = None, now: datetime
) -> list[int]:
    """A person's release of parked jobs (by id, or every one of `task`): queued again,
    and left alone by the park pass. Returns the job ids released."""
    where = []
    if job_ids:
        where.append(dialects.one_of(conn, jobs.c.id, job_ids))
    if task is not None:
        where.append(task_jobs.TASK == task)
    return _queue_parked(conn, where, now=now, reason=RELEASED)


def _queue_parked(
    conn: Connection, where: Sequence[Any], *, now: datetime, reason: str
) -> list[int]:
    """Move the parked Python tasks' jobs that meet `where` to queued, BATCH a statement,
    one event each; tell waiting workers. Returns the job ids moved."""
    moved: list[int] = []
    while True:
        ids = (
            conn.execute(
                select(jobs.c.id)
                .where(*task_jobs.python_in(J.PARKED), *where)
                .order_by(jobs.c.id)
                .limit(BATCH)
            )
            .scalars()
            .all()
        )
        applied = transition(
            conn, entity="job", ids=ids, expected=J.PARKED, to=J.QUEUED, now=now, reason=reason
        )
        moved += [a.id for a in applied]
        if len(ids) < BATCH:
            break
    if moved:
        dialects.notify(conn, dialects.TASKS)
    return moved


def parked_list(
    conn: Connection, *, task: str | None = None, tenant: str | None = None, limit: int = 100
) -> list[python_tasks.ParkedJob]:
    """Parked jobs, oldest first, each with what its park recorded."""
    stmt = select(jobs).where(jobs.c.state == state_is(J.PARKED)).order_by(jobs.c.id).limit(limit)
    if task is not None:
        stmt = stmt.where(jobs.c.executor == python_tasks.PYTHON, task_jobs.TASK == task)
    if tenant is not None:
        stmt = stmt.where(jobs.c.tenant == tenant)
    found = [job_from_row(r) for r in conn.execute(stmt)]
    if not found:
        return []
    parks = _parks(conn, [j.id for j in found])
    return [_parked(job, parks.get(job.id)) for job in found]


def _parks(conn: Connection, job_ids: Sequence[int]) -> dict[int, Any]:
    """The newest park event of each of `job_ids` (absent: none recorded)."""
    parks: dict[int, Any] = {}
    for e in conn.execute(
        select(events.c.job_id, events.c.at, events.c.reason, events.c.details)
        .where(
            dialects.one_of(conn, events.c.job_id, job_ids),
            events.c.entity == "job",
            events.c.to_state == J.PARKED,
        )
        .order_by(events.c.id)
    ):
        parks[e.job_id] = e  # the newest park of each job
    return parks


def _parked(job: model.Job, park: Any) -> python_tasks.ParkedJob:
    """A parked job with what its park event `park` recorded (None: no park recorded)."""
    task, version = (
        python_tasks.task_of(job.spec) if job.executor == python_tasks.PYTHON else ("", 0)
    )
    details = park.details if park is not None else {}
    return python_tasks.ParkedJob(
        job=job,
        task=task,
        version=version,
        needs_app_version=details.get("needs_app_version"),
        parked_at=park.at if park is not None else None,
        reason=park.reason if park is not None else "",
    )


def payload_versions(
    conn: Connection, *, tasks: Sequence[str]
) -> dict[tuple[str, int], dict[str, int]]:
    """For each (task, version) of `tasks` among jobs not yet run (scheduled, queued,
    parked) and the schedules that make them: how many of each (by job state, and
    "schedule")."""
    if not tasks:
        return {}
    out: dict[tuple[str, int], dict[str, int]] = {}
    for (template,) in conn.execute(select(schedules.c.template)):
        if template.get("executor") == python_tasks.PYTHON:
            task, version = python_tasks.task_of(template["spec"])
            if task in tasks:
                counts = out.setdefault((task, version), {})
                counts["schedule"] = counts.get("schedule", 0) + 1
    for state in (J.SCHEDULED, J.QUEUED, J.PARKED):
        rows = conn.execute(
            select(task_jobs.TASK.label("task"), task_jobs.VERSION.label("version"), func.count())
            .where(*task_jobs.python_in(state), task_jobs.TASK.in_(list(tasks)))
            .group_by(task_jobs.TASK, task_jobs.VERSION)
        ).all()
        for task, version, count in rows:
            out.setdefault((task, version), {})[state.value] = count
    return out


def lowest_app_versions(
    conn: Connection, *, pairs: Iterable[tuple[str, int]]
) -> dict[tuple[str, int], str]:
    """For each (task, version), the lowest app version of any worker ever registered that
    reads it (absent: none ever has)."""
    wanted = set(pairs)
    if not wanted:
        return {}
    rows = conn.execute(
        select(worker_tasks.c.task, worker_tasks.c.version, workers.c.app_version)
        .join(workers, workers.c.id == worker_tasks.c.worker_id)
        .where(
            or_(*(and_(worker_tasks.c.task == t, worker_tasks.c.version == v) for t, v in wanted))
        )
        .distinct()
    ).all()
    out: dict[tuple[str, int], str] = {}
    for r in rows:
        key = (r.task, r.version)
        if key not in out or python_tasks.version_key(r.app_version) < python_tasks.version_key(
            out[key]
        ):
            out[key] = r.app_version
    return out
