"""Rows as corral's values, and the few pieces every part of the store shares."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row, case, literal, literal_column, select

from corral import errors, model, scheduling
from corral.store.tables import (
    UTCDateTime,
    jobs,
)

A, J = model.AttemptState, model.JobState


ACTIVE = (A.LAUNCHING, A.RUNNING)


def job_from_row(row: Any) -> model.Job:
    """A job of a row, or of a row's mapping (what `._mapping` or `.mappings()` give)."""
    # Not hasattr(row, "_mapping"): on a mapping, SQLAlchemy answers that with an error
    # it builds and throws away, a cost per row that a list of a hundred jobs felt.
    m = row._mapping if isinstance(row, Row) else row
    return model.Job(**{**m, "state": J(m["state"])})


def attempt_from_row(row: Any) -> model.Attempt:
    """An attempts row as the model's Attempt; who sent it (`sent_by`) is recovery's, kept
    in the store."""
    cls = row.get("failure_class")
    fields = {k: v for k, v in row.items() if k != "sent_by"}
    return model.Attempt(
        **{
            **fields,
            "state": A(row["state"]),
            "failure_class": model.FailureClass(cls) if cls else None,
        }
    )


def schedule_from_row(row: Any) -> scheduling.Schedule:
    """A schedule of a row, or of a row's mapping (read by schedules, firings and the
    overview alike)."""
    m = dict(row._mapping if hasattr(row, "_mapping") else row)
    return scheduling.Schedule(
        **{
            **m,
            "catchup": scheduling.Catchup(m["catchup"]),
            "overlap": scheduling.Overlap(m["overlap"]),
        }
    )


def per_row(key: Any, at: Mapping[int, datetime | None], default: datetime) -> Any:
    """Each row's own time in one UPDATE: a CASE over the rows' ids."""
    whens = [(key == row_id, literal(t or default, UTCDateTime())) for row_id, t in at.items()]
    return case(*whens, else_=literal(default, UTCDateTime()))


def state_is(state: model.JobState) -> Any:
    """A job state as a literal in the SQL: the partial indexes (tables.py) name their state
    so, and a planner uses one only for a query that names the same literal."""
    return literal_column(f"'{model.JobState(state).value}'")


def job_get(conn: Connection, *, job_id: int) -> model.Job:
    """The job `job_id`; NotFound if there is none."""
    row = conn.execute(select(jobs).where(jobs.c.id == job_id)).first()
    if row is None:
        raise errors.NotFound(f"no job with id {job_id}")
    return job_from_row(row._mapping)
