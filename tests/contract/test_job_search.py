"""The job list's page on both databases (store/job_lists.py; on PostgreSQL its reads'
own connections, store/hotreads.py): each job's last run read in one statement for the
whole page, the schedule filter and the URL search through their indexes, keyset paging
with every filter, a URL search that never finds a job by its URL's secrets, and a
tenant's list that never holds another tenant's job, whatever the filter."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import create_engine, select, text
from sqlalchemy.schema import CreateIndex

from corral import launching, model, scheduling, store
from corral.store import Finish, hotreads, job_lists, tables
from corral.store.indexes import EXPRESSIONS
from corral.testing import FrozenClock

A, J = model.AttemptState, model.JobState
SECRET = "s3cr3tvalue"


def http(
    url: str,
    *,
    tenant: str = "a",
    schedule: str | None = None,
    labels: dict[str, str] | None = None,
    run_at: Any = None,
    method: str = "POST",
) -> model.NewJob:
    payload = {scheduling.FIRING: {"schedule": schedule}} if schedule else None
    return model.NewJob(
        executor="http",
        spec={"method": method, "url": url, "headers": {}, "expect": ["2xx"]},
        payload=payload,
        tenant=tenant,
        labels=labels or {},
        run_at=run_at,
    )


def command(*, tenant: str = "a", schedule: str | None = None) -> model.NewJob:
    payload = {scheduling.FIRING: {"schedule": schedule}} if schedule else {"n": 1}
    return model.NewJob(executor="noop", spec={"command": ["true"]}, payload=payload, tenant=tenant)


async def submit(db: store.Store, clock: FrozenClock, *new: model.NewJob) -> list[int]:
    made = await db.jobs.submit(new=list(new), now=clock.now())
    return [job_id for job_id, _ in made]


async def every_page(
    db: store.Store, given: model.JobFilter, limit: int
) -> tuple[list[int], list[job_lists.Page]]:
    """Every page of the list, read by its `next`: the ids in order, and the pages."""
    pages, before = [], None
    while True:
        page = await db.jobs.page(given, limit=limit, before=before)
        pages.append(page)
        if page.next is None:
            break
        assert page.next < (before or 2**63), "the cursor moves on"
        before = page.next
    return [j.id for p in pages for j in p.jobs], pages


# --- what the list shows of each job ------------------------------------------------------------


async def test_each_job_s_last_run_is_read_with_the_page(
    db: store.Store, clock: FrozenClock
) -> None:
    """An HTTP job's last attempt's status and latency; a command's exit code and how long
    it ran; of two attempts, the second's; none for a job not tried, nor for one running."""
    later = clock.now() + timedelta(days=2)
    ids = await submit(
        db,
        clock,
        http("https://a.test/one"),
        http("https://a.test/two"),
        command(),
        http("https://a.test/never", run_at=later),
        http("https://a.test/running"),
    )
    one, two, cmd, never, running = ids
    claimed = {
        c.job.id: c
        for c in await db.jobs.claim(now=clock.now(), limit=10, executors=["http", "noop"])
    }
    assert set(claimed) == {one, two, cmd, running}
    await db.attempts.record_running(
        fences=[c.attempt.id for c in claimed.values()], now=clock.now()
    )
    clock.advance(2)
    log = launching.RunLog(streams=(), latency=0.25, status=201)
    failed = launching.RunLog(streams=(), latency=1.5, status=503)
    await db.attempts.finish(
        finishes=[
            Finish(claimed[one].attempt.id, A.SUCCEEDED, None, "HTTP 201", output=log),
            Finish(claimed[two].attempt.id, A.FAILED, None, "HTTP 503", output=failed),
            Finish(claimed[cmd].attempt.id, A.FAILED, 3, "exited with code 3"),
        ],
        now=clock.now(),
    )
    clock.advance(3600)  # job two's backoff, then its second attempt: 200 in 0.5 s
    [again] = await db.jobs.claim(now=clock.now(), limit=10, executors=["http"])
    assert again.job.id == two
    ok = launching.RunLog(streams=(), latency=0.5, status=200)
    await db.attempts.finish(
        finishes=[Finish(again.attempt.id, A.SUCCEEDED, None, "HTTP 200", output=ok)],
        now=clock.now(),
    )
    page = await db.jobs.page(model.JobFilter(tenant="a"))
    assert [j.id for j in page.jobs] == ids[::-1]
    assert page.next is None
    assert page.runs[one] == job_lists.LastRun(status=201, exit_code=None, response_time=0.25)
    assert page.runs[two] == job_lists.LastRun(status=200, exit_code=None, response_time=0.5)
    assert page.runs[cmd] == job_lists.LastRun(status=None, exit_code=3, response_time=2.0)
    assert page.runs[running] == job_lists.LastRun(None, None, None)
    assert never not in page.runs


@contextmanager
def statements(db: store.Store) -> Iterator[list[str]]:
    """The statements the store sends while the block runs: through SQLAlchemy, and on
    PostgreSQL on its reads' own connections."""
    from sqlalchemy import event

    sent: list[str] = []

    def seen(conn: Any, cursor: Any, sql: str, *args: Any) -> None:
        sent.append(sql)

    event.listen(db.database.engine, "before_cursor_execute", seen)
    pool = db.database.read_pool
    run = pool.run if pool is not None else None
    if pool is not None:

        class Noting:
            def __init__(self, conn: Any) -> None:
                self.conn = conn

            async def execute(self, sql: str, params: Any = None, **kw: Any) -> Any:
                sent.append(sql)
                return await self.conn.execute(sql, params, **kw)

        async def noted(fn: Callable[[Any], Any], **kw: Any) -> Any:
            assert run is not None
            return await run(lambda conn: fn(Noting(conn)), **kw)

        pool.run = noted  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        event.remove(db.database.engine, "before_cursor_execute", seen)
        if pool is not None:
            pool.run = run  # type: ignore[method-assign]


async def test_a_page_is_read_in_two_statements_however_many_jobs_it_holds(
    db: store.Store, clock: FrozenClock
) -> None:
    await submit(db, clock, *(http(f"https://a.test/{n}") for n in range(60)))
    claimed = await db.jobs.claim(now=clock.now(), limit=60, executors=["http"])
    await db.attempts.finish(
        finishes=[Finish(c.attempt.id, A.SUCCEEDED, None, "ok") for c in claimed], now=clock.now()
    )
    for given in (model.JobFilter(), model.JobFilter(tenant="a", url="a.test")):
        with statements(db) as sent:
            page = await db.jobs.page(given, limit=50)
        assert len(page.jobs) == len(page.runs) == 50
        reads = [s for s in sent if s.lstrip().upper().startswith("SELECT")]
        assert len(reads) == 2, reads


# --- filters, and paging with them ---------------------------------------------------------------


async def _mixed(db: store.Store, clock: FrozenClock) -> None:
    """40 jobs of tenants a and b: HTTP jobs of two hosts, commands, the firings of two
    schedules (each tenant has a "nightly"), labels, a few scheduled for later."""
    later = clock.now() + timedelta(hours=1)
    for i in range(40):
        tenant = "b" if i % 5 in (1, 2) else "a"
        schedule = ("nightly", "hourly")[i // 3 % 2] if i % 3 == 0 else None
        labels = {"team": f"t{i % 3}"}
        if i % 5 == 4:
            new = command(tenant=tenant, schedule=schedule)
        else:
            host = "Orders.Example.com" if i % 2 else "billing.example.org"
            new = http(
                f"https://{host}/v1/{i}?page=1&token={SECRET}{i}",
                tenant=tenant,
                schedule=schedule,
                labels=labels,
                run_at=later if i % 7 == 0 else None,
            )
        await submit(db, clock, new)
        clock.advance(1)


def _url(job: model.Job) -> str:
    return str(job.spec.get("url", "")) if job.executor == "http" else ""


FILTERS: list[tuple[dict[str, Any], Callable[[model.Job], bool]]] = [
    ({}, lambda j: True),
    ({"states": ["scheduled"]}, lambda j: j.state == J.SCHEDULED),
    (
        {"schedule": "nightly"},
        lambda j: (j.payload or {}).get(scheduling.FIRING, {}).get("schedule") == "nightly",
    ),
    ({"labels": {"team": "t1"}}, lambda j: j.labels.get("team") == "t1"),
    ({"url": "orders.example"}, lambda j: "orders.example" in _url(j).lower()),
    ({"url": "EXAMPLE.ORG/v1"}, lambda j: "example.org/v1" in _url(j).lower()),
    ({"url": "page=1"}, lambda j: j.executor == "http"),
    (
        {"url": "example", "schedule": "hourly", "states": ["queued"]},
        lambda j: (
            j.executor == "http"
            and j.state == J.QUEUED
            and (j.payload or {}).get(scheduling.FIRING, {}).get("schedule") == "hourly"
        ),
    ),
]


@pytest.mark.parametrize("tenant", ["a", "b", None])
@pytest.mark.parametrize(("given", "matches"), FILTERS)
async def test_each_filter_pages_by_keyset_through_every_job_it_matches_once(
    db: store.Store,
    clock: FrozenClock,
    given: dict[str, Any],
    matches: Callable[[model.Job], bool],
    tenant: str | None,
) -> None:
    """Every filter, for each tenant (and for every tenant, None), a page of 3 at a time:
    the jobs it matches, the newest first, each once, and never another tenant's."""
    await _mixed(db, clock)
    every = await db.jobs.list(model.JobFilter(), limit=1000)
    assert len(every) == 40
    expected = [j.id for j in every if matches(j) and tenant in (None, j.tenant)]
    assert expected, "each filter matches some jobs"
    read, pages = await every_page(db, model.JobFilter(**given, tenant=tenant), limit=3)
    assert read == expected
    assert all(len(p.jobs) == 3 for p in pages[:-1])
    assert await db.jobs.list(model.JobFilter(**given, tenant=tenant), limit=1000) == [
        j for j in every if j.id in expected
    ]


async def test_a_url_search_is_a_contains_its_wildcards_taken_as_they_are(
    db: store.Store, clock: FrozenClock
) -> None:
    ids = await submit(
        db,
        clock,
        http("https://a.test/100%25_off?q=a_b"),
        http("https://a.test/100x25Xoff?q=aXb"),
        command(),
    )
    pct, plain, _ = ids
    for said, found in (
        ("25_off", [pct]),
        ("%25", [pct]),
        ("a_b", [pct]),
        ("A.TEST", [plain, pct]),
    ):
        page = await db.jobs.page(model.JobFilter(url=said))
        assert [j.id for j in page.jobs] == found, said


# --- the URL search and secrets ----------------------------------------------------------------


async def test_a_url_search_never_finds_a_job_by_what_its_redaction_hides(
    db: store.Store, clock: FrozenClock
) -> None:
    """A token in the query, a password in the userinfo, a key by a secret's name: a search
    for any part of them finds nothing, letter by letter; what the URL shows is found."""
    await submit(
        db,
        clock,
        http(f"https://user:{SECRET}@hooks.test/v1/run?api_key={SECRET}&region=eu"),
        http(f"https://hooks.test/v2/run?token={SECRET}x&signature=abcdef"),
        http(f"https://{SECRET}visible.test/v3"),  # not a secret: its host
    )
    assert [j.spec["url"] for j in (await db.jobs.page(model.JobFilter(url="hooks.test"))).jobs]
    for part in (SECRET, SECRET[:3], SECRET[2:6], "user:", f"{SECRET}x", "abcdef", "bcd"):
        listed = await db.jobs.page(model.JobFilter(url=part))
        assert [j.spec["url"] for j in listed.jobs if "visible" not in j.spec["url"]] == [], part
    for shown in ("api_key=", "region=eu", "token=", "v2/run", f"{SECRET}visible"):
        assert (await db.jobs.page(model.JobFilter(url=shown))).jobs, shown


async def test_a_page_left_short_by_secrets_reads_on_and_says_where(
    db: store.Store, clock: FrozenClock
) -> None:
    """Most jobs match the search only inside their token: a page reads on past them (at
    most SEARCH_ROUNDS reads, each SEARCH_GROWTH times the last), and its `next` leads to
    the rest, which still holds every job the search lists, once."""
    shown = []
    for i in range(90):
        new = [http(f"https://h.test/{i}?token=needle{i}")]
        new += [http(f"https://needle.test/{i}")] if i % 30 == 0 else []
        made = await submit(db, clock, *new)
        shown += made[1:]
    read, pages = await every_page(db, model.JobFilter(url="needle"), limit=2)
    assert read == shown[::-1]
    assert len(pages) >= 3, "short pages, each saying where to read on"
    first = await db.jobs.page(model.JobFilter(url="needle"), limit=2)
    assert [j.id for j in first.jobs] == [shown[-1]]  # 2 + 8 + 32 read, one kept
    assert first.next is not None


# --- indexes ---------------------------------------------------------------------------------------


def test_the_expression_indexes_are_made_as_the_tables_declare_them(db_url: str) -> None:
    """ix_jobs_schedule and ix_jobs_http_url (which the schema comparison leaves out:
    SQLAlchemy reflects no index of an expression on SQLite): each database's definition
    of each is the one the metadata would make."""
    engine = create_engine(db_url)
    dialect = engine.dialect
    declared = [
        ix
        for ix in tables.jobs.indexes
        if ix.name in EXPRESSIONS and ix._ddl_if.dialect == dialect.name
    ]
    assert {ix.name for ix in declared} == (
        EXPRESSIONS if dialect.name == "postgresql" else {"ix_jobs_schedule"}
    )
    with engine.begin() as conn:
        for ix in declared:
            made = str(CreateIndex(ix).compile(dialect=dialect)).replace(ix.name, "probe_ix", 1)
            conn.execute(text(made))
            try:
                assert _definition(conn, ix.name, ix.name) == _definition(conn, "probe_ix", ix.name)
            finally:
                conn.execute(text("DROP INDEX probe_ix"))
    engine.dispose()


def _definition(conn: Any, name: str, as_: str) -> str:
    if conn.dialect.name == "postgresql":
        sql = "SELECT indexdef FROM pg_indexes WHERE indexname = :n"
    else:
        sql = "SELECT sql FROM sqlite_master WHERE type = 'index' AND name = :n"
    found = conn.execute(text(sql), {"n": name}).scalar_one()
    said = found.replace(name, as_).replace("IF NOT EXISTS ", "")
    return re.sub(r"\s+", " ", said)


async def test_the_schedule_filter_and_the_url_search_read_their_indexes(
    db: store.Store, db_url: str, clock: FrozenClock
) -> None:
    """The statements the store sends read ix_jobs_schedule and (PostgreSQL) ix_jobs_http_url.
    On PostgreSQL the schedule's also once prepared (a generic plan, its values unknown,
    which matches a partial index's WHERE only to literals); a URL search is never
    prepared (hotreads: it is planned for its own text)."""
    jobs = [
        http(f"https://h{i}.test/x", schedule=f"s{i % 40}", tenant=f"t{i % 10}")
        for i in range(4000)
    ]
    await db.jobs.submit(
        new=[*jobs, *(command(schedule="s1") for _ in range(500))], now=clock.now()
    )
    await db.database.analyze()
    schedule = model.JobFilter(tenant="t1", schedule="s1")
    if db.database.dialect == "sqlite":
        assert "ix_jobs_schedule" in _sqlite_plan(db, db_url, schedule)
        return
    for generic in (False, True):
        plan = await _pg_plan(db, schedule, generic=generic)
        assert "ix_jobs_schedule" in plan, (generic, plan)
    plan = await _pg_plan(db, model.JobFilter(url="h17.test"), generic=False)  # one job
    assert "ix_jobs_http_url" in plan, plan


def _sqlite_plan(db: store.Store, db_url: str, given: model.JobFilter) -> str:
    """EXPLAIN QUERY PLAN of the statement job_lists.matched sends for `given`."""
    with db.database.engine.connect() as conn:
        sql = (
            select(tables.jobs.c.id)
            .where(*job_lists.job_where(conn, given))
            .order_by(tables.jobs.c.id.desc())
            .limit(50)
            .compile(conn)
        )
        raw = sqlite3.connect(db_url.removeprefix("sqlite:///"))
        params = [sql.params[p] for p in sql.positiontup or []]
        plan = " ".join(str(r[-1]) for r in raw.execute(f"EXPLAIN QUERY PLAN {sql}", params))
        raw.close()
        return plan


async def _pg_plan(db: store.Store, given: model.JobFilter, *, generic: bool) -> str:
    """EXPLAIN of the statement the reads' connections send for `given`'s first page."""
    params: dict[str, Any] = {"limit": 50}
    if given.tenant:
        params["tenant"] = given.tenant
    if given.schedule:
        params["schedule"] = given.schedule
    if given.url:
        params["url"] = job_lists.url_pattern(given.url)
    sql, fixed = hotreads._job_list_sql(frozenset(params))
    assert not fixed
    names = re.findall(r"%\((\w+)\)s", sql)
    order = list(dict.fromkeys(names))
    numbered = re.sub(r"%\((\w+)\)s", lambda m: f"${order.index(m[1]) + 1}", sql)
    engine = create_engine(db.database.engine.url)
    with engine.connect() as conn:
        # New rows wait in a GIN index's pending list, which a search reads whole (and the
        # planner prices so) until a vacuum, as autovacuum's, merges them into the index.
        conn.exec_driver_sql("SELECT gin_clean_pending_list('ix_jobs_http_url')")
        conn.exec_driver_sql("SET enable_seqscan = off")
        mode = "force_generic_plan" if generic else "force_custom_plan"
        conn.exec_driver_sql(f"SET plan_cache_mode = {mode}")
        conn.exec_driver_sql(f"PREPARE listed AS {numbered}")
        args = ", ".join(_pg_literal(params[n]) for n in order)
        plan = "\n".join(r[0] for r in conn.exec_driver_sql(f"EXPLAIN EXECUTE listed({args})"))
    engine.dispose()
    return plan


def _pg_literal(value: Any) -> str:
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("'", "''").replace("%", "%%") + "'"
