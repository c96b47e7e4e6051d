"""What a hot claim made, as the model's values: both databases' hot paths read their rows
through these.

A claim's rows come back as the driver's tuples, each job's columns in the order of
model.Job's fields (a test checks the table's order). A batch repeats the same texts (`{}`,
one submit's policies and times), so each distinct JSON or time text is parsed once, and
each distinct policy's limits are read once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from corral import model
from corral.store import claims, dialects
from corral.store.tables import UTCDateTime, jobs

A, J = model.AttemptState, model.JobState

JOB_COLUMNS = [c.name for c in jobs.c]
"""The jobs table's columns, in the order of model.Job's fields."""

JSON_COLUMNS = {c.name for c in jobs.c if dialects.is_json(c.type)}
"""The columns read as JSON text and parsed by Reader."""

_STATE = JOB_COLUMNS.index("state")
_JSON_AT = [i for i, c in enumerate(jobs.c) if dialects.is_json(c.type)]
_TIME_AT = [i for i, c in enumerate(jobs.c) if isinstance(c.type, UTCDateTime)]


class Reader:
    """Rows of claimed jobs with JSON as text (and, from SQLite, times as text) into
    model.Job; a batch repeats the same texts, so each is parsed once."""

    def __init__(self, *, times: bool = True) -> None:
        self._json: dict[str | None, Any] = {None: None}
        self._times: dict[str, datetime] = {}
        self._time_at = _TIME_AT if times else []

    def job(self, row: Sequence[Any]) -> model.Job:
        """A claimed job's row (its columns in JOB_COLUMNS' order) as the job, running."""
        values = list(row)
        for i in _JSON_AT:
            values[i] = self._load(values[i])
        for i in self._time_at:
            values[i] = self._time(values[i])
        values[_STATE] = J.RUNNING
        return model.Job(*values)

    def _load(self, text: str | None) -> Any:
        if text not in self._json:
            self._json[text] = json.loads(text)  # type: ignore[arg-type]
        return self._json[text]

    def _time(self, text: str) -> datetime:
        if text not in self._times:
            self._times[text] = datetime.fromisoformat(text).replace(tzinfo=UTC)
        return self._times[text]


def launching(
    job: model.Job,
    fence: int,
    launch_name: str,
    now: datetime,
    limits: tuple[datetime | None, datetime | None, float | None],
    started: bool = False,
) -> model.Attempt:
    """The attempt a claim just made, as the row it wrote says (`started`: running);
    `limits`: its deadline, lease end and lease length."""
    deadline_at, lease_until, lease_seconds = limits
    return model.Attempt(
        id=fence,
        job_id=job.id,
        attempt_no=job.attempt_count,
        launch_name=launch_name,
        executor=job.executor,
        state=A.RUNNING if started else A.LAUNCHING,
        created_at=now,
        updated_at=now,
        started_at=now if started else None,
        finished_at=None,
        exit_code=None,
        reason=None,
        last_seen_at=now if started else None,
        deadline_at=deadline_at,
        lease_until=lease_until,
        lease_seconds=lease_seconds,
    )


class Limits:
    """claims.attempt_limits for each claimed job, read once per distinct policy."""

    def __init__(self, now: datetime, deadline: float | None, lease: float | None) -> None:
        self.now = now
        self.limits = (
            None
            if deadline is None
            else claims.DefaultLimits(timedelta(seconds=deadline), timedelta(seconds=lease or 0))
        )
        self._seen: dict[int, tuple[Any, tuple[datetime | None, datetime | None, float | None]]]
        self._seen = {}

    def of(self, job: model.Job) -> tuple[datetime | None, datetime | None, float | None]:
        """`job`'s new attempt's deadline, lease end and lease length."""
        # By the policy object: Reader gives the jobs of one policy text the same one (and
        # it is kept here beside its limits, so its id is not another's).
        seen = self._seen.get(id(job.policy))
        if seen is None:
            seen = (job.policy, claims.attempt_limits(job.policy, self.now, self.limits))
            self._seen[id(job.policy)] = seen
        return seen[1]
