"""A schedule's firing history and stats on both stores: a page of firings with what each
job came to, keyset paging through 100,000 firings (bounded reads), the hourly and daily
buckets, closed hours kept and counted once, an hour that waits for a job ending after it,
a late firing that opens a closed hour again, a closing from a stale read that writes
nothing, the kept hours removed with their schedule, and the schedules list by name. Time
is the injected clock's."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select

from corral import client, config, firing_stats, launching, model, scheduler, scheduling, store
from corral.store import Finish, dialects, tables
from corral.store import firing_stats as counting
from corral.testing import FrozenClock
from tests.support.noop import NoopExecutor

A, F, J = model.AttemptState, scheduling.FiringOutcome, model.JobState
START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
JOB = {"spec": {"command": ["true"]}, "executor": "noop", "max_attempts": 1}
HOUR = timedelta(hours=1)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(START)


@pytest.fixture
def c(db: store.Store, clock: FrozenClock) -> client.Client:
    return client.Client(
        store=db, executors={"noop": NoopExecutor()}, settings=config.Settings(), clock=clock
    )


async def fire(c: client.Client) -> None:
    await scheduler.Scheduler(store=c.store, clock=c.clock).pass_once()


async def run_due(
    c: client.Client, ends: Mapping[int, Finish | None], *, took: float = 0.5
) -> list[int]:
    """Claim every due job, start it now, and `took` seconds later end those of `ends` by
    job id as said there (a job whose end is None, or not in `ends`, keeps running): the
    ids claimed."""
    clock: FrozenClock = c.clock  # type: ignore[assignment]
    claimed = await c.store.jobs.claim(now=clock.now(), limit=100, executors=["noop"])
    await c.store.attempts.record_running(fences=[x.attempt.id for x in claimed], now=clock.now())
    clock.advance(took)
    for x in claimed:
        end = ends.get(x.job.id)
        if end is not None:
            finished = dataclasses.replace(end, fence=x.attempt.id)
            await c.store.attempts.finish(finishes=[finished], now=clock.now())
    return [x.job.id for x in claimed]


def ok(status: int = 200, latency: float | None = 0.25) -> Finish:
    log = launching.RunLog(latency=latency, status=status) if latency is not None else None
    return Finish(0, A.SUCCEEDED, 0, None, output=log)


def bad(code: int = 3) -> Finish:
    return Finish(0, A.FAILED, code, "exited")


def insert_firings(db: store.Store, schedule_id: int, rows: list[dict[str, Any]]) -> None:
    """Firings straight into the table, in one statement per batch (COPY on PostgreSQL)."""
    full = [
        {"job_id": None, "recorded_at": r["nominal_at"], "lateness_seconds": 0.0, "note": None, **r}
        for r in rows
    ]
    with db.database.engine.begin() as conn:
        dialects.insert_many(
            conn, tables.firings, [{"schedule_id": schedule_id, **r} for r in full]
        )


async def test_a_page_of_firings_says_what_each_job_came_to(
    c: client.Client, clock: FrozenClock
) -> None:
    made = await c.schedule_create("tick", every="1m", **JOB)
    await fire(c)  # 12:00
    clock.advance(2)
    [first] = await run_due(c, {}, took=0)  # claimed 2 s late, left running a while
    clock.advance(58)
    await fire(c)  # 12:01
    [second] = await run_due(c, {}, took=1.5)
    await c.store.attempts.finish(finishes=await _finishes(c, {second: bad(3)}), now=clock.now())
    await c.store.attempts.finish(
        finishes=await _finishes(c, {first: ok(204, 0.125)}), now=clock.now()
    )
    clock.advance(5 * 60)
    await fire(c)  # 12:06, with 12:02 to 12:05 missed
    page = await c.firing_history("tick")
    assert page.next is None
    newest, *missed, failed, succeeded = page.rows
    assert [r.outcome for r in page.rows] == [F.FIRED] + [F.MISSED] * 4 + [F.FIRED, F.FIRED]
    assert newest.run is not None
    assert newest.run.state == J.QUEUED
    assert newest.lateness is None
    assert all(r.run is None and r.job_id is None for r in missed)
    assert succeeded.nominal_at == START
    assert succeeded.job_id == first
    assert succeeded.run is not None
    assert (succeeded.run.state, succeeded.run.status, succeeded.run.exit_code) == (
        J.SUCCEEDED,
        204,
        0,
    )
    assert succeeded.lateness == pytest.approx(2.0)
    assert succeeded.run.response_time == pytest.approx(0.125)  # the run log's latency
    assert failed.run is not None
    assert (failed.run.state, failed.run.status, failed.run.exit_code) == (J.FAILED, None, 3)
    assert failed.lateness == pytest.approx(0.0)
    assert failed.run.response_time == pytest.approx(1.5)  # no run log: the attempt's time
    runs = await c.last_runs([await c.schedule("tick")])
    assert runs[made.id].job_id == newest.job_id
    assert runs[made.id].state == J.QUEUED


async def test_a_quick_job_s_attempt_started_when_it_was_launched(
    c: client.Client, clock: FrozenClock, db: store.Store
) -> None:
    """Launched and ended in one settle, an attempt is never recorded running (no
    started_at): it started when it was claimed and launched."""
    await c.schedule_create("quick", every="1h", **JOB)
    await fire(c)
    clock.advance(3)
    [claimed] = await db.jobs.claim(now=clock.now(), limit=1, executors=["noop"])
    clock.advance(1.25)
    done = Finish(claimed.attempt.id, A.SUCCEEDED, 0, None)
    await db.attempts.settle(launched=[claimed.attempt.id], finishes=[done], now=clock.now())
    [attempt] = await db.attempts.list(job_id=claimed.job.id)
    assert attempt.started_at is None
    [row] = (await c.firing_history("quick")).rows
    assert row.run is not None
    assert row.run.state == J.SUCCEEDED
    assert row.lateness == pytest.approx(3.0)
    assert row.run.response_time == pytest.approx(1.25)
    clock.advance(3600)
    noon = (await c.schedule_stats("quick")).last_24h.buckets[-2]
    assert noon.latency_max == pytest.approx(1.25)


async def _finishes(c: client.Client, ends: Mapping[int, Finish]) -> list[Finish]:
    """`ends` by job id as finishes of each job's running attempt."""
    out = []
    for job_id, end in ends.items():
        [attempt] = [a for a in await c.store.attempts.list(job_id=job_id) if a.state == A.RUNNING]
        out.append(dataclasses.replace(end, fence=attempt.id))
    return out


async def test_100000_firings_page_by_keyset_and_count_once(
    c: client.Client, clock: FrozenClock, db: store.Store
) -> None:
    """A firing every 30 s for 35 days: each page reads its own rows only (the walk of the
    firings' key from `before`), pages meet without a gap or a repeat, and once the stats
    have kept the closed hours a view counts only the current hour from the firings."""
    made = await c.schedule_create("busy", every="30s", **JOB)
    outcomes = [F.FIRED, F.FIRED, F.FIRED, F.MISSED, F.SKIPPED, F.OVERLAP, F.REFUSED]
    times = [START - timedelta(seconds=30 * k) for k in range(1, 100_001)]
    rows = [{"nominal_at": at, "outcome": outcomes[i % 7].value} for i, at in enumerate(times)]
    insert_firings(db, made.id, rows)
    first = await c.firing_history("busy", limit=1000)
    assert [r.nominal_at for r in first.rows] == times[:1000]
    assert first.next == times[999]
    second = await c.firing_history("busy", before=first.next, limit=1000)
    assert [r.nominal_at for r in second.rows] == times[1000:2000]
    between = await c.firing_history("busy", before=times[4] + timedelta(microseconds=1), limit=2)
    assert [r.nominal_at for r in between.rows] == times[4:6]  # a cursor between two times
    last = await c.firing_history("busy", before=times[-3], limit=1000)
    assert [r.nominal_at for r in last.rows] == times[-2:]
    assert last.next is None
    assert (await c.firing_history("busy", before=times[-1])).rows == []
    if db.database.dialect == "postgresql":
        with db.database.engine.connect() as conn:
            # As autovacuum would after 100,000 rows: a plan made before any statistics of
            # the table guesses a few dozen rows a schedule and sorts them all.
            conn.exec_driver_sql("ANALYZE firings")
            plan = "\n".join(
                conn.execute(dialects.Explain(_page(made.id, times[50_000]))).scalars()
            )
        assert "Index Scan Backward" in plan, plan
        assert "Seq Scan on firings" not in plan, plan

    stats = await c.schedule_stats("busy")  # counts the window once, and keeps its hours
    total = stats.last_30d.total
    in_window = [r for r in rows if r["nominal_at"] >= firing_stats.since(clock.now())]
    assert total.firings == len(in_window)
    assert total.missed == sum(r["outcome"] == "missed" for r in in_window)
    assert total.pending == total.jobs  # no firing here has a job: none ended
    counted = await db.schedules.stats_read(schedule_id=made.id, now=clock.now())
    assert counted.counted_until == firing_stats.hour_of(clock.now())
    assert set(counted.open) == set()  # the current hour (12:00) has no firing yet
    assert len(counted.kept) == 24 * 29 + 12
    assert firing_stats.stats(counted, clock.now()) == stats
    page, same_stats = await c.page_of(await c.schedule("busy"), before=None, limit=1000)
    assert page == first  # the page's one read says what the two do
    assert same_stats == stats


async def test_a_long_range_is_counted_in_spans_that_sum_to_one_count(
    c: client.Client, db: store.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A busy schedule's first view counts days of firings in spans of whole hours of about
    CHUNK_FIRINGS each (a statement over them all is planned as scans of whole tables):
    the spans' hours are the one statement's, hour for hour."""
    made = await c.schedule_create("spans", every="30s", **JOB)
    outcomes = [F.FIRED, F.MISSED, F.SKIPPED]
    rows = [
        {"nominal_at": START - timedelta(seconds=30 * k), "outcome": outcomes[k % 3].value}
        for k in range(1, 3 * 24 * 120)
    ]
    insert_firings(db, made.id, rows)
    start, end = START - 3 * firing_stats.DAY, START

    def counted() -> dict[datetime, tuple[firing_stats.Tally, bool]]:
        with db.database.engine.connect() as conn:
            return counting.hours_counted(conn, schedule_id=made.id, start=start, end=end)

    monkeypatch.setattr(counting, "CHUNK_FIRINGS", 300)
    with db.database.engine.connect() as conn:
        spans = counting._spans(conn, made.id, start, end)
    assert len(spans) == 3 * 24 // 2, "two hours (240 firings) a span, the third past 300"
    assert all(high == low + 2 * HOUR for low, high in spans[:-1])
    in_spans = counted()
    monkeypatch.setattr(counting, "ONE_STATEMENT", 4 * firing_stats.DAY)
    whole = counted()
    assert in_spans == whole
    assert len(whole) == 3 * 24
    assert sum(t.missed for t, _ in whole.values()) == sum(r["outcome"] == "missed" for r in rows)


def _page(schedule_id: int, before: datetime) -> Any:
    f = tables.firings.c
    return (
        select(f.nominal_at, *counting._run_columns())
        .select_from(counting._FIRED)
        .where(f.schedule_id == schedule_id, f.nominal_at < before)
        .order_by(f.nominal_at.desc())
        .limit(51)
    )


async def test_stats_count_hours_and_days_as_the_table_says(
    c: client.Client, clock: FrozenClock
) -> None:
    """Two firings an hour for three hours, their jobs ending each way; the tally of a
    page's rows and the store's sums agree."""
    await c.schedule_create("half", every="30m", **JOB)
    verdicts = [ok(200, 0.2), bad(7), ok(201, 0.6), None, ok(200, None), "cancel"]
    for verdict in verdicts:
        await fire(c)
        [job_id] = await run_due(c, {}, took=0)
        clock.advance(1.0)
        if verdict == "cancel":
            await c.cancel(job_id)
        elif isinstance(verdict, Finish):
            await c.store.attempts.finish(
                finishes=await _finishes(c, {job_id: verdict}), now=clock.now()
            )
        clock.advance(30 * 60 - 1.0)
    stats = await c.schedule_stats("half")  # now 15:00: 12:00 to 14:59 had firings
    assert stats.at == START + 3 * HOUR
    hours = stats.last_24h.buckets
    assert stats.last_24h.start == START + 3 * HOUR - 23 * HOUR
    twelve, one, two, three = hours[-4:]
    assert (twelve.fired, twelve.succeeded, twelve.failed, twelve.success_rate) == (2, 1, 1, 0.5)
    assert twelve.latency_count == 2
    assert twelve.latency_mean == pytest.approx(
        (0.2 + 1.0) / 2
    )  # the failed one: its attempt's time
    assert twelve.latency_max == pytest.approx(1.0)
    assert (one.succeeded, one.failed, one.pending) == (1, 0, 1)
    assert (two.succeeded, two.cancelled, two.pending, two.latency_count) == (1, 1, 0, 1)
    assert two.latency_max == pytest.approx(1.0)  # no run log latency: its attempt's second
    assert three == firing_stats.Tally()
    day = stats.last_30d.buckets[-1]
    assert stats.last_30d.start == datetime(2026, 1, 31, tzinfo=UTC)
    assert (day.fired, day.succeeded, day.failed, day.cancelled, day.pending) == (6, 3, 1, 1, 1)
    assert day.success_rate == pytest.approx(0.75)
    assert stats.last_30d.total == day
    assert stats.last_24h.total == day
    rows = (await c.firing_history("half")).rows
    assert same(firing_stats.tally(rows), day)
    for hour, counted in zip(
        (START, START + HOUR, START + 2 * HOUR), (twelve, one, two), strict=True
    ):
        assert same(
            firing_stats.tally(r for r in rows if firing_stats.hour_of(r.nominal_at) == hour),
            counted,
        )


def same(one: firing_stats.Tally, other: firing_stats.Tally) -> bool:
    """Equal tallies, but for the last bits of the sums of floats (added in another order)."""
    return dataclasses.replace(one, latency_sum=0) == dataclasses.replace(
        other, latency_sum=0
    ) and one.latency_sum == pytest.approx(other.latency_sum)


async def test_an_hour_waits_for_its_job_and_counts_it_once_it_ends(
    c: client.Client, clock: FrozenClock, db: store.Store
) -> None:
    made = await c.schedule_create("slow", every="1h", **JOB)
    await fire(c)  # 12:00
    [job_id] = await run_due(c, {}, took=0)
    clock.advance(3600 + 60)  # 13:01: 12:00 is over, its job still running
    first = await c.schedule_stats("slow")
    assert first.last_24h.buckets[-2].pending == 1
    counted = await db.schedules.stats_read(schedule_id=made.id, now=clock.now())
    assert counted.counted_until == START  # 12:00 waits: counted from the firings still
    assert START in counted.open
    assert counted.kept == {}
    await c.store.attempts.finish(
        finishes=await _finishes(c, {job_id: ok(200, 3.0)}), now=clock.now()
    )
    after = await c.schedule_stats("slow")  # counted again from the firings, now closed
    noon = after.last_24h.buckets[-2]
    assert (noon.succeeded, noon.pending, noon.latency_max) == (1, 0, 3.0)
    counted = await db.schedules.stats_read(schedule_id=made.id, now=clock.now())
    assert START in counted.kept
    assert START not in counted.open
    assert counted.kept[START].succeeded == 1
    assert (await c.schedule_stats("slow")) == after  # read from what is kept, the same


async def test_an_hour_closes_whatever_its_jobs_do_past_the_settle_limit(
    c: client.Client, clock: FrozenClock, db: store.Store
) -> None:
    made = await c.schedule_create("stuck", every="1h", **JOB)
    await fire(c)
    [job_id] = await run_due(c, {}, took=0)
    clock.advance((HOUR + firing_stats.SETTLE_LIMIT).total_seconds())
    stats = await c.schedule_stats("stuck")
    counted = await db.schedules.stats_read(schedule_id=made.id, now=clock.now())
    assert counted.kept[START].pending == 1
    await c.store.attempts.finish(finishes=await _finishes(c, {job_id: ok()}), now=clock.now())
    again = await c.schedule_stats("stuck")  # counted when its hour closed: it stays so
    assert again.last_30d.total.pending == 1 == stats.last_30d.total.pending


async def test_a_firing_recorded_late_opens_its_hour_again(
    c: client.Client, clock: FrozenClock, db: store.Store
) -> None:
    made = await c.schedule_create("daily", cron="0 9 * * *", start="2026-02-20T00:00:00Z", **JOB)
    clock.advance(3 * 3600)
    assert (await c.schedule_stats("daily")).last_30d.total.firings == 0
    counted = await db.schedules.stats_read(schedule_id=made.id, now=clock.now())
    version = counted.version
    assert counted.counted_until == START + 3 * HOUR
    assert version is not None
    created, _ = await c.backfill("daily", start="2026-02-25T00:00:00Z", end="2026-02-27T00:00:00Z")
    assert created == 2
    counted = await db.schedules.stats_read(schedule_id=made.id, now=clock.now())
    assert counted.counted_until == datetime(2026, 2, 25, 9, tzinfo=UTC)
    assert counted.version == version + 1
    assert set(counted.open) == {datetime(2026, 2, d, 9, tzinfo=UTC) for d in (25, 26)}
    stats = await c.schedule_stats("daily")
    assert stats.last_30d.total.backfilled == 2
    assert stats.last_30d.total.pending == 2


async def test_a_closing_from_a_read_older_than_a_late_firing_writes_nothing(
    c: client.Client, clock: FrozenClock, db: store.Store
) -> None:
    made = await c.schedule_create("m", every="1m", **JOB)
    await fire(c)
    await run_due(c, {}, took=0)
    clock.advance(2 * 3600)
    read = await db.schedules.stats_read(schedule_id=made.id, now=clock.now())
    closing = firing_stats.closing(read, clock.now())
    assert closing is not None
    assert closing.version is None
    await c.schedule_pause("m")
    clock.advance(60)
    await c.schedule_resume("m")  # 120 skipped firings, recorded into past hours
    kept = await db.schedules.hours_close(
        schedule_id=made.id, closing=closing, keep_from=firing_stats.since(clock.now())
    )
    assert kept is False
    now_read = await db.schedules.stats_read(schedule_id=made.id, now=clock.now())
    assert now_read.kept == {}
    assert now_read.counted_until is None
    assert now_read.version == 1
    assert (await c.schedule_stats("m")).last_24h.total.skipped >= 60


async def test_deleting_a_schedule_removes_its_kept_hours(
    c: client.Client, clock: FrozenClock, db: store.Store
) -> None:
    await c.schedule_create("gone", every="10m", **JOB)
    await fire(c)
    await c.cancel((await c.schedule("gone")).last_job_id or 0)  # its hour need not wait
    clock.advance(3 * 3600)
    await c.schedule_stats("gone")
    with db.database.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(tables.firing_hours)).scalar() == 1
    await c.schedule_delete("gone")
    with db.database.engine.connect() as conn:
        for table in (tables.firing_hours, tables.firing_rollups, tables.firings):
            assert conn.execute(select(func.count()).select_from(table)).scalar() == 0


async def test_the_schedules_list_pages_by_tenant_and_name(c: client.Client) -> None:
    for tenant in ("a", "b"):
        for i in range(60):
            await c.schedule_create(f"s-{i:03d}", every="1h", tenant=tenant, **JOB)
    page, after = await c.schedules_page(tenant="a")
    assert [s.name for s in page] == [f"s-{i:03d}" for i in range(50)]
    assert after == ("a", "s-049")
    rest, end = await c.schedules_page(tenant="a", after=after)
    assert [s.name for s in rest] == [f"s-{i:03d}" for i in range(50, 60)]
    assert end is None
    seen: list[tuple[str, str]] = []
    cursor: tuple[str, str] | None = None
    while True:
        some, cursor = await c.schedules_page(tenant=None, after=cursor, limit=7)
        seen += [(s.tenant, s.name) for s in some]
        if cursor is None:
            break
    assert seen == sorted((t, f"s-{i:03d}") for t in ("a", "b") for i in range(60))
