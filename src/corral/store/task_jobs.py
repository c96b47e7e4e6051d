"""Python tasks' jobs as SQL conditions: which task and payload version a job is (its spec
says `{"task": ..., "version": ...}`), which of them a worker reads, and which some live
worker reads. The workers' registrations and their claim (workers.py) and the parking of
jobs (parking.py) all ask these."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, case, exists, false, or_, select, true

from corral import model, python_tasks
from corral.store import dialects
from corral.store.rows import state_is
from corral.store.tables import jobs, worker_tasks, workers

W = python_tasks.WorkerState

TASK = jobs.c.spec["task"].as_string()
"""A job's task, read from its spec."""
VERSION = jobs.c.spec["version"].as_integer()
"""A job's payload version, read from its spec."""


def live(since: datetime) -> Any:
    """A worker that is running (not draining, not stopped) and was heard from after `since`."""
    return and_(workers.c.state == W.RUNNING, workers.c.last_seen_at > since)


def read_by_live(conn: Connection, since: datetime) -> Any:
    """A Python task's job that some live worker reads, of its queue (a correlated EXISTS)."""
    return exists(
        select(worker_tasks.c.worker_id)
        .join(workers, workers.c.id == worker_tasks.c.worker_id)
        .where(
            worker_tasks.c.task == TASK,
            worker_tasks.c.version == VERSION,
            live(since),
            dialects.json_list_empty_or_has(conn, workers.c.queues, jobs.c.queue),
        )
    )


def reads_any(reads: Iterable[tuple[str, Sequence[int]]]) -> Any:
    """A Python task's job whose (task, version) is one of `reads` (task, versions)."""
    terms = [and_(TASK == task, VERSION.in_(list(versions))) for task, versions in reads]
    return or_(*terms) if terms else false()


def claimable(reads: Iterable[tuple[str, Sequence[int]]]) -> Any:
    """reads_any as the claim's pick takes it: inside a CASE, which the planner cannot
    estimate, so it counts on half the queued jobs matching and walks their index in claim
    order, stopping at the limit. Given the JSON fields' equalities as they are, it counts
    on almost none matching and sorts every queued job first (PostgreSQL: 15 ms a claim
    with 20,000 queued, against 0.1 ms)."""
    return case((reads_any(reads), true()), else_=false())


def python_in(state: model.JobState) -> list[Any]:
    """A Python task's job in `state` (the state as the partial indexes name it)."""
    return [jobs.c.state == state_is(state), jobs.c.executor == python_tasks.PYTHON]


def grouped(pairs: Iterable[tuple[str, int]]) -> list[tuple[str, list[int]]]:
    """(task, version) pairs as (task, its versions), each sorted."""
    by_task: dict[str, set[int]] = {}
    for task, version in pairs:
        by_task.setdefault(task, set()).add(version)
    return [(task, sorted(versions)) for task, versions in sorted(by_task.items())]
