"""The API's most asked reads on PostgreSQL, a job list and a job's page, on async
connections of their own (hotpool.py) on the event loop, as the dispatcher's hot path runs.

They read what job_lists.job_page and jobs.job_record read, by the same statements (the same
conditions, in the same form, so the planner picks the same indexes: ix_jobs_state,
ix_jobs_queue_state, ix_jobs_labels, ix_jobs_schedule, ix_jobs_http_url), each one round
trip outside a transaction. What they
leave out is what a read of a hundred jobs felt as much as the database's work: the hop to
a worker thread and back, SQLAlchemy's execution context and result rows. A row comes as
the driver's tuple, JSON as text parsed once per distinct text (a page repeats the same
specs, policies and labels), and becomes the model's value by position: the columns are
named from the model's own fields.

On SQLite the store reads the same through SQLAlchemy (job_lists.job_page), on its reading
thread: a file has no round trip to save.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import orjson
from sqlalchemy import (
    BigInteger,
    Connection,
    Integer,
    String,
    Text,
    bindparam,
    func,
    select,
    tuple_,
)
from sqlalchemy import cast as sa_cast

from corral import errors, launching, model
from corral.store import dialects, job_lists, runlogs, tables

if TYPE_CHECKING:
    import psycopg

A, J = model.AttemptState, model.JobState

JSON_FIELDS = frozenset({"spec", "payload", "labels", "policy", "details", "streams"})
"""The columns read as JSON text (`::text`) and parsed here."""


def _columns(table: str, names: Sequence[str]) -> str:
    return ", ".join(f"{table}.{n}::text" if n in JSON_FIELDS else f"{table}.{n}" for n in names)


def _json_at(names: Sequence[str]) -> list[int]:
    return [i for i, n in enumerate(names) if n in JSON_FIELDS]


_JOB = [f.name for f in dataclasses.fields(model.Job)]  # the columns, in the model's order
_ATTEMPT = [f.name for f in dataclasses.fields(model.Attempt)]
_EVENT = [f.name for f in dataclasses.fields(model.Event)]
_RUN_LOG = ["attempt_id", "latency", "status", "address", "recorded_at", "trimmed_at", "streams"]

_JOB_STATE = _JOB.index("state")
_ATTEMPT_STATE = _ATTEMPT.index("state")
_FAILURE_CLASS = _ATTEMPT.index("failure_class")
_JOB_JSON, _EVENT_JSON = _json_at(_JOB), _json_at(_EVENT)

_JOB_STATES = {s.value: s for s in J}
_ATTEMPT_STATES = {s.value: s for s in A}
_FAILURE_CLASSES = {c.value: c for c in model.FailureClass}

JOB = f"SELECT {_columns('jobs', _JOB)} FROM jobs WHERE jobs.id = %(job_id)s::BIGINT"
ATTEMPTS = f"""SELECT {_columns("attempts", _ATTEMPT)} FROM attempts
WHERE attempts.job_id = %(job_id)s::BIGINT ORDER BY attempts.id"""
EVENTS = f"""SELECT {_columns("events", _EVENT)} FROM events
WHERE events.job_id = %(job_id)s::BIGINT ORDER BY events.id"""
RUN_LOGS = f"""SELECT {_columns("run_logs", _RUN_LOG)} FROM run_logs
WHERE run_logs.job_id = %(job_id)s::BIGINT ORDER BY run_logs.attempt_id"""

_EQUAL = ("queue", "tenant", "pool", "executor")
"""The job list's filters that are one column's value."""


async def job_list(
    conn: psycopg.AsyncConnection[Any],
    given: model.JobFilter,
    *,
    limit: int = 100,
    before: int | None = None,
) -> list[model.Job]:
    """job_lists.job_list: the newest jobs first, those `given` matches (one statement,
    more for a URL search that left jobs out)."""
    return (await _filled(conn, given, limit, before)).jobs


async def job_page(
    conn: psycopg.AsyncConnection[Any],
    given: model.JobFilter,
    *,
    limit: int = 100,
    before: int | None = None,
) -> job_lists.Page:
    """job_lists.job_page: a page of the job list and the last run of each of its jobs, on
    one connection."""
    filling = await _filled(conn, given, limit, before)
    return job_lists.Page(filling.jobs, await _last_runs(conn, filling.jobs), filling.next)


async def _filled(
    conn: psycopg.AsyncConnection[Any], given: model.JobFilter, limit: int, before: int | None
) -> job_lists.Filling:
    filling = job_lists.Filling(given, limit, before)
    while filling.take(await _matched(conn, given, filling.size, filling.before)):
        pass
    return filling


async def _matched(
    conn: psycopg.AsyncConnection[Any], given: model.JobFilter, limit: int, before: int | None
) -> list[model.Job]:
    """job_lists.matched in one statement. A URL search's is planned for its own text
    each time (not prepared): whether its trigrams or the newest ids find a page sooner
    depends on how many jobs the text matches."""
    from psycopg.types.json import Jsonb

    params: dict[str, Any] = {f"state_{n}": s for n, s in enumerate(given.states)}
    equal: dict[str, Any] = {"queue": given.queue, "tenant": given.tenant, "pool": given.pool}
    equal |= {"executor": given.executor, "schedule": given.schedule, "before": before}
    params.update({k: v for k, v in equal.items() if v is not None})
    if given.labels:
        params["labels"] = Jsonb(dict(given.labels))
    if given.since is not None:
        params["since"] = _utc(given.since)
    if given.until is not None:
        params["until"] = _utc(given.until)
    if given.url:
        params["url"] = job_lists.url_pattern(given.url)
    params["limit"] = limit
    sql, fixed = _job_list_sql(frozenset(params))
    rows = await _rows(conn, sql, {**fixed, **params}, prepare=False if given.url else None)
    read = _Reader()
    return [read.job(row) for row in rows]


@functools.lru_cache(maxsize=256)
def _job_list_sql(names: frozenset[str]) -> tuple[str, Mapping[str, Any]]:
    """The job list's statement for the parameters `names` (state_0, state_1, ... for the
    states), and any values it sets itself: the conditions of job_lists.job_where (and
    url_where), each filter's value a parameter of its own, compiled as
    SQLAlchemy sends them to PostgreSQL (so the planner sees what it sees from the store's
    own reads, and picks the same indexes)."""
    from sqlalchemy.dialects.postgresql import JSONB
    from sqlalchemy.dialects.postgresql import psycopg as postgresql

    def named(name: str, type_: Any = None) -> Any:
        return bindparam(name, type_=type_)

    def given(name: str, type_: Any = None) -> Any:
        return named(name, type_) if name in names else None

    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    conn = cast(Connection, SimpleNamespace(dialect=dialect))  # only its dialect is asked
    states = sorted((n for n in names if n.startswith("state_")), key=lambda n: int(n[6:]))
    matching = model.JobFilter(
        states=[named(n, String()) for n in states],
        **{n: given(n) for n in _EQUAL},
        schedule=given("schedule", String()),
        since=given("since"),
        until=given("until"),
    )
    where = job_lists.job_where(conn, matching)
    if "labels" in names:  # (job_where's labels are values: a parameter is named here)
        where.append(dialects.json_has(conn, tables.jobs.c.labels, given("labels", JSONB())))
    if "url" in names:
        where += job_lists.url_where("postgresql", named("url", String()))
    if "before" in names:
        where.append(tables.jobs.c.id < bindparam("before"))
    columns = [sa_cast(c, Text) if c.name in JSON_FIELDS else c for c in tables.jobs.c]
    newest = select(*columns).where(*where).order_by(tables.jobs.c.id.desc())
    stmt = newest.limit(bindparam("limit", type_=Integer()))
    compiled = stmt.compile(dialect=dialect)
    return str(compiled), {k: v for k, v in compiled.params.items() if k not in names}


async def job_record(
    conn: psycopg.AsyncConnection[Any], *, job_id: int
) -> tuple[model.Job, list[model.Attempt], list[model.Event], dict[int, launching.RunLog]]:
    """A job, its attempts, its events and its run logs, four statements on one connection
    (as jobs.job_record reads them); NotFound if there is no such job."""
    params = {"job_id": job_id}
    read = _Reader()
    found = await _rows(conn, JOB, params)
    if not found:
        raise errors.NotFound(f"no job with id {job_id}")
    job = read.job(found[0])
    attempts = [read.attempt(row) for row in await _rows(conn, ATTEMPTS, params)]
    events = [read.event(row) for row in await _rows(conn, EVENTS, params)]
    logs = {row[0]: read.run_log(row) for row in await _rows(conn, RUN_LOGS, params)}
    return job, attempts, events, logs


async def _rows(
    conn: psycopg.AsyncConnection[Any],
    sql: str,
    params: Mapping[str, Any],
    *,
    prepare: bool | None = None,
) -> list[tuple[Any, ...]]:
    """One statement's rows as the driver's tuples (psycopg prepares it once it repeats,
    unless `prepare` is False)."""
    cursor = await conn.execute(sql, params, prepare=prepare)
    return await cursor.fetchall()


async def _last_runs(
    conn: psycopg.AsyncConnection[Any], listed: Sequence[model.Job]
) -> dict[int, job_lists.LastRun]:
    """job_lists.last_runs in one statement: the job ids and attempt numbers as two arrays."""
    pairs = job_lists.tried(listed)
    if not pairs:
        return {}
    params = {"job_ids": [p[0] for p in pairs], "attempt_nos": [p[1] for p in pairs]}
    rows = await _rows(conn, _last_runs_sql(), params)
    return {row[0]: job_lists.last_run(row) for row in rows}


@functools.cache
def _last_runs_sql() -> str:
    """job_lists.last_runs_select as dialects.pairs_in writes its pairs on PostgreSQL
    (unnest of two arrays), the arrays named."""
    from sqlalchemy.dialects.postgresql import ARRAY
    from sqlalchemy.dialects.postgresql import psycopg as postgresql

    arrays = [bindparam(n, type_=ARRAY(BigInteger())) for n in ("job_ids", "attempt_nos")]
    pairs = func.unnest(*arrays).table_valued("a", "b").render_derived("u")
    key = tuple_(tables.attempts.c.job_id, tables.attempts.c.attempt_no)
    stmt = job_lists.last_runs_select(key.in_(select(pairs.c.a, pairs.c.b)))
    return str(stmt.compile(dialect=postgresql.dialect()))  # type: ignore[no-untyped-call]


def _utc(at: datetime) -> datetime:
    if at.tzinfo is None:
        raise ValueError("corral stores only timezone-aware datetimes")
    return at.astimezone(UTC)


_LONG_NUMBER = re.compile(r"[0-9]{19}")
"""Digits enough for an integer past 64 bits, which orjson would read as a float."""


def _parsed(text: str) -> Any:
    """JSON text as the json module reads it, by orjson (several times faster) where the
    two read the same: not where an integer may be past 64 bits, nor where orjson refuses
    what the json module takes (NaN, a lone surrogate)."""
    if _LONG_NUMBER.search(text) is None:
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return json.loads(text)


class _Reader:
    """Rows into the model's values, each distinct JSON text parsed once."""

    def __init__(self) -> None:
        self._json: dict[str | None, Any] = {None: None}

    def _load(self, text: str | None) -> Any:
        if text not in self._json:
            self._json[text] = _parsed(text)  # type: ignore[arg-type]
        return self._json[text]

    def job(self, row: Sequence[Any]) -> model.Job:
        values = list(row)
        for i in _JOB_JSON:
            values[i] = self._load(values[i])
        values[_JOB_STATE] = _JOB_STATES[values[_JOB_STATE]]
        return model.Job(*values)

    def attempt(self, row: Sequence[Any]) -> model.Attempt:
        values = list(row)
        values[_ATTEMPT_STATE] = _ATTEMPT_STATES[values[_ATTEMPT_STATE]]
        failure = values[_FAILURE_CLASS]
        values[_FAILURE_CLASS] = _FAILURE_CLASSES[failure] if failure else None
        return model.Attempt(*values)

    def event(self, row: Sequence[Any]) -> model.Event:
        values = list(row)
        for i in _EVENT_JSON:
            values[i] = self._load(values[i])
        return model.Event(*values)

    @staticmethod
    def run_log(row: Sequence[Any]) -> launching.RunLog:
        values = dict(zip(_RUN_LOG, row, strict=True))
        values["streams"] = _parsed(values["streams"])
        return runlogs.run_log_from_row(values)
