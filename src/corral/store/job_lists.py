"""The job list: the jobs a filter (model.JobFilter) matches, the newest first, a page at a
time (keyset: ids below `before`), and what the list shows of each beside its row: its last
attempt's HTTP status, exit code and response time (LastRun), read for the page's jobs
alone, in one statement.

Each filter has an index that hands its jobs over newest first, or few enough to sort
(indexes.py): states ix_jobs_state, a queue ix_jobs_queue_state, a tenant
ix_jobs_tenant_state, labels ix_jobs_labels (PostgreSQL), a schedule ix_jobs_schedule
(the schedule's name in a firing's payload, and the id), the URL search ix_jobs_http_url
(PostgreSQL: trigrams, pg_trgm; SQLite reads it with a LIKE). The expressions below are
written as those indexes name them, their JSON paths literals rather than parameters:
SQLite uses an expression index only for the same expression, and PostgreSQL's generic
plans (the reads' prepared statements) match a partial index's WHERE only to literals.

The URL search never finds a job by what the URL's redaction hides (a password, a token in
its query), or a viewer could find a secret a letter at a time, by which searches list a
job: the database finds the HTTP jobs whose stored URL contains the text, and a job is
listed only when its URL as shown (redaction.redacted) contains it too. Where that leaves a
page short, the next rows are read, at most SEARCH_ROUNDS times; the page's `next` says
where to read on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import ColumnElement, Connection, Select, String, func, literal_column, select

from corral import model, redaction, scheduling
from corral.store import dialects
from corral.store.rows import job_from_row
from corral.store.tables import attempts, jobs, run_logs

HTTP = "http"
"""The executor whose jobs have a URL to search (executors/http_spec.py's KIND)."""
SEARCH_ROUNDS = 3
"""The most reads one page of a URL search makes, when what the database matched is left
out for matching only inside a URL's secrets: the first of the page's length, each next one
SEARCH_GROWTH times the last (a read through the trigrams costs about the same however
many rows it returns, so few larger reads cost less than many)."""
SEARCH_GROWTH = 4
LIKE_ESCAPE = "\\"
"""The escape character of the URL search's LIKE pattern (PostgreSQL's default)."""


@dataclass(frozen=True, slots=True)
class LastRun:
    """What the job list shows of a job's last attempt: the HTTP status of its run log,
    its exit code, and its response time in seconds (the run log's latency, else how long
    the attempt ran); each None where there is none (yet)."""

    status: int | None
    exit_code: int | None
    response_time: float | None


@dataclass(frozen=True, slots=True)
class Page:
    """A page of the job list: its jobs, the newest first; the last run of each that has
    had an attempt, by job id; and the id to read on from (`before`), None at the end."""

    jobs: list[model.Job]
    runs: Mapping[int, LastRun] = field(default_factory=dict)
    next: int | None = None


# --- the filter ----------------------------------------------------------------------------------


def _literal(value: str) -> ColumnElement[Any]:
    """A fixed string of this module as a SQL literal (a user's values are parameters)."""
    assert "'" not in value, value
    return literal_column(f"'{value}'", String())


def schedule_of(dialect: str) -> ColumnElement[Any]:
    """The schedule of a firing's job (its payload's FIRING.schedule; NULL for any other
    job), as ix_jobs_schedule names it on `dialect`."""
    if dialect == "postgresql":
        path = (_literal(scheduling.FIRING), _literal("schedule"))
        return func.jsonb_extract_path_text(jobs.c.payload, *path)
    return func.json_extract(jobs.c.payload, _literal(f'$."{scheduling.FIRING}"."schedule"'))


def url_of(dialect: str) -> ColumnElement[Any]:
    """An HTTP job's URL (its spec's `url`), as ix_jobs_http_url names it."""
    if dialect == "postgresql":
        return jobs.c.spec.op("->>", return_type=String())(_literal("url"))
    return func.json_extract(jobs.c.spec, _literal("$.url"))


def url_pattern(text: str) -> str:
    """The LIKE pattern of a URL search for `text`: it anywhere, its own % and _ as they are."""
    escaped = "".join(LIKE_ESCAPE + c if c in "%_" + LIKE_ESCAPE else c for c in text)
    return f"%{escaped}%"


def url_where(dialect: str, pattern: Any) -> list[ColumnElement[bool]]:
    """The URL search's conditions: an HTTP job (as ix_jobs_http_url's WHERE says it) whose
    URL is like `pattern` (url_pattern's, or a parameter that will be), in any case."""
    return [
        jobs.c.executor == _literal(HTTP),
        url_of(dialect).ilike(pattern, escape=LIKE_ESCAPE),
    ]


def job_where(conn: Connection, given: model.JobFilter) -> list[ColumnElement[bool]]:
    """The conditions of the job list's filter, for every read that filters jobs as it does
    (a bulk action's preview and snapshot), but its URL search: that is the list's alone
    (url_where, and `shows_url` on what it matched)."""
    where: list[ColumnElement[bool]] = []
    if given.states:
        where.append(jobs.c.state.in_(list(given.states)))
    equal = (
        (jobs.c.queue, given.queue),
        (jobs.c.tenant, given.tenant),
        (jobs.c.pool, given.pool),
        (jobs.c.executor, given.executor),
        (schedule_of(conn.dialect.name), given.schedule),
    )
    where += [column == value for column, value in equal if value is not None]
    if given.labels:
        where.append(dialects.json_has(conn, jobs.c.labels, given.labels))
    if given.since is not None:
        where.append(jobs.c.created_at >= given.since)
    if given.until is not None:
        where.append(jobs.c.created_at < given.until)
    return where


def shows_url(job: model.Job, text: str | None) -> bool:
    """Whether `job` is one a URL search for `text` lists: an HTTP job whose URL as shown,
    its secrets redacted, contains `text` in any case (any job, without a search)."""
    if not text:
        return True
    url = job.spec.get("url") if job.executor == HTTP else None
    return isinstance(url, str) and text.lower() in redaction.redacted(url).lower()


# --- the list ------------------------------------------------------------------------------------


def matched(
    conn: Connection, given: model.JobFilter, *, limit: int, before: int | None
) -> list[model.Job]:
    """The newest `limit` jobs with ids below `before` that `given` matches in the
    database: a URL search's before `shows_url` has looked at them."""
    stmt = select(jobs).where(*job_where(conn, given)).order_by(jobs.c.id.desc()).limit(limit)
    if given.url:
        stmt = stmt.where(*url_where(conn.dialect.name, url_pattern(given.url)))
    if before is not None:
        stmt = stmt.where(jobs.c.id < before)
    return [job_from_row(m) for m in conn.execute(stmt).mappings().all()]


class Filling:
    """A page filled from what the database matched, a read at a time: a URL search leaves
    out what `shows_url` does not list, and reads on (at most SEARCH_ROUNDS reads, each
    `size` jobs from `before` on) until the page is full or no job is left."""

    def __init__(self, given: model.JobFilter, limit: int, before: int | None) -> None:
        self.given, self.limit = given, limit
        self.jobs: list[model.Job] = []
        self.next: int | None = None
        self.rounds = 0
        self.before, self.size = before, limit

    def take(self, read: Sequence[model.Job]) -> bool:
        """Add a read of `size` jobs from `before` on; whether to read again (from the new
        `before`, the new `size`)."""
        self.rounds += 1
        self.jobs += [j for j in read if shows_url(j, self.given.url)]
        if len(self.jobs) >= self.limit:
            del self.jobs[self.limit :]
            self.next = self.jobs[-1].id
            return False
        if len(read) < self.size:
            self.next = None
            return False
        self.before = self.next = read[-1].id
        self.size *= SEARCH_GROWTH
        return self.rounds < SEARCH_ROUNDS


def job_list(
    conn: Connection, given: model.JobFilter, *, limit: int = 100, before: int | None = None
) -> list[model.Job]:
    """Newest jobs first, those `given` matches, and (keyset pagination) with ids below
    `before` (a URL search's page may be shorter: job_page says where to read on)."""
    return _filled(conn, given, limit, before).jobs


def _filled(conn: Connection, given: model.JobFilter, limit: int, before: int | None) -> Filling:
    filling = Filling(given, limit, before)
    while filling.take(matched(conn, given, limit=filling.size, before=filling.before)):
        pass
    return filling


def job_page(
    conn: Connection, given: model.JobFilter, *, limit: int = 100, before: int | None = None
) -> Page:
    """A page of the job list (`job_list`) with the last run of each of its jobs, and the
    id to read on from."""
    filling = _filled(conn, given, limit, before)
    return Page(filling.jobs, last_runs(conn, listed=filling.jobs), filling.next)


# --- the last runs -------------------------------------------------------------------------------


def tried(listed: Sequence[model.Job]) -> list[tuple[int, int]]:
    """(job id, attempt number) of each listed job's last attempt: of those that had one."""
    return [(j.id, j.attempt_count) for j in listed if j.attempt_count > 0]


def last_runs_select(which: ColumnElement[bool]) -> Select[Any]:
    """The facts of the attempts `which` matches (by job id and attempt number, the unique
    key), with their run logs' status and latency: a lookup each."""
    return (
        select(
            attempts.c.job_id,
            attempts.c.exit_code,
            attempts.c.started_at,
            attempts.c.finished_at,
            run_logs.c.status,
            run_logs.c.latency,
        )
        .select_from(attempts.outerjoin(run_logs, run_logs.c.attempt_id == attempts.c.id))
        .where(which)
    )


def last_runs(conn: Connection, *, listed: Sequence[model.Job]) -> dict[int, LastRun]:
    """The last run of each of `listed` that has had an attempt, by job id: one statement."""
    pairs = tried(listed)
    if not pairs:
        return {}
    which = dialects.pairs_in(conn, attempts.c.job_id, attempts.c.attempt_no, pairs)
    return {row[0]: last_run(row) for row in conn.execute(last_runs_select(which))}


def last_run(row: Sequence[Any]) -> LastRun:
    """A row of last_runs_select as a LastRun."""
    _, exit_code, started, finished, status, latency = row
    if latency is None and started is not None and finished is not None:
        latency = max(0.0, (finished - started).total_seconds())
    return LastRun(status=status, exit_code=exit_code, response_time=latency)
