"""The scheduler on both stores: each nominal time fires once however many schedulers run,
catch-up, pause, overlap, until, backfills, jobs that wait for their time, and bad input
refused with nothing written. Time is the injected clock's."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from corral import client, config, errors, model, scheduler, scheduling, store
from corral.testing import FrozenClock
from tests.support.noop import NoopExecutor

F, J = scheduling.FiringOutcome, model.JobState
START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(START)


def make_client(db: store.Store, clock: FrozenClock, **settings: Any) -> client.Client:
    return client.Client(
        store=db,
        executors={"noop": NoopExecutor()},
        settings=config.Settings(**settings),
        clock=clock,
    )


def make_scheduler(db: store.Store, clock: FrozenClock, **kw: Any) -> scheduler.Scheduler:
    return scheduler.Scheduler(store=db, clock=clock, **kw)


JOB = {"spec": {"command": ["true"]}, "executor": "noop"}


async def firings(db: store.Store, schedule_id: int) -> list[scheduling.Firing]:
    return sorted(
        await db.schedules.firings(schedule_id=schedule_id, limit=100_000),
        key=lambda f: f.nominal_at,
    )


async def test_an_interval_fires_each_nominal_time_once_with_its_interval(
    db: store.Store, clock: FrozenClock
) -> None:
    c = make_client(db, clock)
    made = await c.schedule_create("tick", every="30s", payload={"region": "eu"}, **JOB)
    assert made.next_due == START  # an interval's first nominal time is its creation
    one, two = make_scheduler(db, clock), make_scheduler(db, clock)
    for _ in range(6):
        await one.pass_once()
        await two.pass_once()  # a second scheduler at the same instant finds nothing to do
        clock.advance(15)
    fired = await firings(db, made.id)
    assert [f.nominal_at for f in fired] == [START + timedelta(seconds=30 * k) for k in range(3)]
    assert {f.outcome for f in fired} == {F.FIRED}
    assert all(f.lateness_seconds >= 0 for f in fired)
    job = await db.jobs.get(job_id=fired[1].job_id or 0)
    assert job.idempotency_key == scheduling.firing_key(made.id, START + timedelta(seconds=30))
    assert job.payload == {
        "region": "eu",
        "corral": {
            "schedule": "tick",
            "nominal_time": "2026-03-01T12:00:30Z",
            "interval_start": "2026-03-01T12:00:30Z",
            "interval_end": "2026-03-01T12:01:00Z",
        },
    }
    assert scheduling.firing_env(job.payload)["CORRAL_INTERVAL_END"] == "2026-03-01T12:01:00Z"
    assert (await db.schedules.by_id(schedule_id=made.id)).last_job_id == fired[-1].job_id


async def test_after_downtime_catch_up_none_fires_the_latest_and_records_the_missed(
    db: store.Store, clock: FrozenClock
) -> None:
    made = await make_client(db, clock).schedule_create("m", every="1m", **JOB)
    clock.advance(10 * 60 + 5)  # down for ten minutes
    await make_scheduler(db, clock).pass_once()
    fired = await firings(db, made.id)
    assert [f.outcome for f in fired] == [F.MISSED] * 10 + [F.FIRED]
    assert fired[-1].nominal_at == START + timedelta(minutes=10)
    after = await db.schedules.by_id(schedule_id=made.id)
    assert after.missed_total == 10
    assert after.next_due == START + timedelta(minutes=11)


async def test_catch_up_all_fires_at_most_its_max_within_its_window(
    db: store.Store, clock: FrozenClock
) -> None:
    made = await make_client(db, clock).schedule_create(
        "all", every="1m", catchup="all", catchup_max=3, catchup_window="1h", **JOB
    )
    clock.advance(10 * 60)
    await make_scheduler(db, clock).pass_once()
    fired = await firings(db, made.id)
    # The missed ones recorded one by one are the latest, at most catchup_max; all counted.
    assert [f.outcome for f in fired] == [F.MISSED] * 3 + [F.FIRED] * 3
    assert (await db.schedules.by_id(schedule_id=made.id)).missed_total == 8
    assert [f.nominal_at for f in fired if f.outcome == F.FIRED] == [
        START + timedelta(minutes=m) for m in (8, 9, 10)
    ]


async def test_a_paused_schedule_records_what_passed_as_skipped_and_fires_none_of_it(
    db: store.Store, clock: FrozenClock
) -> None:
    c = make_client(db, clock)
    made = await c.schedule_create("p", every="1m", **JOB)
    s = make_scheduler(db, clock)
    await s.pass_once()
    await c.schedule_pause("p")
    clock.advance(5 * 60 + 30)
    await s.pass_once()
    assert [f.outcome for f in await firings(db, made.id)] == [F.FIRED]
    resumed = await c.schedule_resume("p")
    assert resumed.next_due == START + timedelta(minutes=6)
    await s.pass_once()
    outcomes = [f.outcome for f in await firings(db, made.id)]
    assert outcomes == [F.FIRED] + [F.SKIPPED] * 5
    clock.advance(30)
    await s.pass_once()
    assert [f.outcome for f in await firings(db, made.id)][-1] == F.FIRED


async def test_overlap_forbid_skips_while_the_previous_job_runs_and_replace_cancels_it(
    db: store.Store, clock: FrozenClock
) -> None:
    c = make_client(db, clock)
    forbid = await c.schedule_create("f", every="1m", overlap="forbid", **JOB)
    replace = await c.schedule_create("r", every="1m", overlap="replace", **JOB)
    s = make_scheduler(db, clock)
    await s.pass_once()
    clock.advance(60)
    await s.pass_once()  # nothing ran the first jobs: they are still queued
    f_fired = await firings(db, forbid.id)
    assert [f.outcome for f in f_fired] == [F.FIRED, F.OVERLAP]
    r_fired = await firings(db, replace.id)
    assert [f.outcome for f in r_fired] == [F.FIRED, F.FIRED]
    assert (await db.jobs.get(job_id=r_fired[0].job_id or 0)).state == J.CANCELLED
    await c.cancel(f_fired[0].job_id or 0)  # it ended: the next firing goes ahead
    clock.advance(60)
    await s.pass_once()
    assert [f.outcome for f in await firings(db, forbid.id)][-1] == F.FIRED


async def test_a_schedule_fires_nothing_at_or_after_until(
    db: store.Store, clock: FrozenClock
) -> None:
    made = await make_client(db, clock).schedule_create(
        "u", every="1m", until=(START + timedelta(minutes=2)).isoformat(), **JOB
    )
    clock.advance(10 * 60)
    await make_scheduler(db, clock).pass_once()
    assert max(f.nominal_at for f in await firings(db, made.id)) == START + timedelta(minutes=1)
    assert (await db.schedules.by_id(schedule_id=made.id)).next_due is None


async def test_a_cron_schedule_in_a_zone_fires_once_on_the_day_clocks_go_forward(
    db: store.Store,
) -> None:
    clock = FrozenClock(datetime(2026, 3, 28, 12, tzinfo=UTC))
    made = await make_client(db, clock).schedule_create(
        "berlin", cron="30 2 * * *", tz="Europe/Berlin", **JOB
    )
    s = make_scheduler(db, clock)
    for _ in range(3 * 24):
        clock.advance(3600)
        await s.pass_once()
    fired = await firings(db, made.id)
    assert [f.nominal_at for f in fired] == [
        datetime(2026, 3, 29, 1, 0, tzinfo=UTC),  # 02:30 does not exist: at the jump, 03:00
        datetime(2026, 3, 30, 0, 30, tzinfo=UTC),
        datetime(2026, 3, 31, 0, 30, tzinfo=UTC),
    ]
    assert fired[0].note is not None
    assert "does not exist" in fired[0].note


async def test_a_backfill_makes_one_job_per_nominal_time_once(
    db: store.Store, clock: FrozenClock
) -> None:
    c = make_client(db, clock, pools={"backfill": 2})
    made = await c.schedule_create("daily", cron="0 0 * * *", **JOB)
    counted: list[int] = []
    result = await c.backfill(
        "daily",
        start="2025-01-01",
        end="2025-01-11",
        pool="backfill",
        code_version="abc123",
        batch=4,
        progress=counted.append,
    )
    assert result == (10, 0)
    assert counted == [4, 4, 2]
    assert await c.backfill("daily", start="2025-01-01", end="2025-01-11") == (0, 10)
    assert await c.backfill("daily", start="2025-01-05", end="2025-01-13") == (2, 6)
    fired = await firings(db, made.id)
    assert len(fired) == 12
    assert {f.outcome for f in fired} == {F.BACKFILLED}
    job = await db.jobs.get(job_id=fired[0].job_id or 0)
    assert (job.pool, job.code_version) == ("backfill", "abc123")
    assert job.payload["corral"]["interval_start"] == "2025-01-01T00:00:00Z"
    assert job.payload["corral"]["interval_end"] == "2025-01-02T00:00:00Z"
    assert await c.backfill("daily", start="2026-01-01", end="2026-01-31", dry_run=True) == (
        30,
        0,
    )
    assert len(await firings(db, made.id)) == 12  # a dry run stores nothing


async def test_a_job_for_later_is_scheduled_until_its_time_then_queued(
    db: store.Store, clock: FrozenClock
) -> None:
    c = make_client(db, clock)
    job_id, _ = await c.submit(run_at=START + timedelta(minutes=10), **JOB)  # type: ignore[arg-type]
    assert (await db.jobs.get(job_id=job_id)).state == J.SCHEDULED
    s = make_scheduler(db, clock)
    await s.pass_once()
    assert (await db.jobs.get(job_id=job_id)).state == J.SCHEDULED
    assert await db.schedules.next_wake() == START + timedelta(minutes=10)
    clock.advance(600)
    assert (await s.pass_once()).promoted == 1
    assert (await db.jobs.get(job_id=job_id)).state == J.QUEUED


async def test_trigger_fires_now_and_rerun_makes_a_new_job(
    db: store.Store, clock: FrozenClock
) -> None:
    c = make_client(db, clock)
    await c.schedule_create("t", cron="0 0 1 1 *", **JOB)
    job_id = await c.schedule_trigger("t")
    job = await db.jobs.get(job_id=job_id)
    assert job.state == J.QUEUED
    assert job.payload["corral"]["schedule"] == "t"
    with pytest.raises(errors.InvalidInput, match="only a failed or cancelled job"):
        await c.rerun(job_id)
    await c.cancel(job_id)
    again = await db.jobs.get(job_id=await c.rerun(job_id))
    assert again.labels == {client.jobs.RERUN_OF: str(job_id)}
    assert (again.spec, again.payload) == (job.spec, job.payload)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"cron": "61 * * * *"}, "cron: "),
        ({"cron": "* * *"}, "cron: "),
        ({"cron": "0 9 * * *", "tz": "Mars/Olympus"}, "tz: "),
        ({"every": "500ms"}, "every: "),
        ({"every": "0s"}, "every: "),
        ({"every": "soon"}, "every: "),
        ({"every": "1m", "start": "next tuesday"}, "start: "),
        ({"every": "1m", "until": "2020-01-01"}, "until: "),
        ({"every": "1m", "payload": [1, 2]}, "payload: "),
        ({"every": "1m", "payload": "x" * 70_000}, "payload: "),
        ({"every": "1m", "catchup": "some"}, "catchup: "),
        ({"every": "1m", "overlap": "never"}, "overlap: "),
        ({"every": "1m", "jitter": "a bit"}, "jitter: "),
        ({"every": "1m", "cron": "* * * * *"}, "give either cron"),
        ({"every": "1m", "queue": "no spaces"}, "queue: "),
    ],
)
async def test_bad_schedules_are_refused_naming_the_field_and_nothing_is_written(
    db: store.Store, clock: FrozenClock, args: dict[str, Any], message: str
) -> None:
    c = make_client(db, clock, max_payload_bytes=65_536)
    with pytest.raises(errors.InvalidInput) as refused:
        await c.schedule_create("bad", **{**JOB, **args})
    assert str(refused.value).startswith(message), str(refused.value)
    assert await db.schedules.list() == []


async def test_a_backfill_range_that_ends_before_it_starts_is_refused(
    db: store.Store, clock: FrozenClock
) -> None:
    c = make_client(db, clock)
    await c.schedule_create("d", cron="0 0 * * *", **JOB)
    with pytest.raises(errors.InvalidInput, match="^to: "):
        await c.backfill("d", start="2025-02-01", end="2025-01-01")
    with pytest.raises(errors.InvalidInput, match="^from: "):
        await c.backfill("d", start="yesterday", end="2025-01-01")
    with pytest.raises(errors.InvalidInput, match="^pool: "):
        await c.backfill("d", start="2025-01-01", end="2025-01-02", pool="nope")
    made = await db.schedules.get(name="d")
    assert await firings(db, made.id) == []


async def test_update_changes_what_is_given_and_delete_removes_the_firings(
    db: store.Store, clock: FrozenClock
) -> None:
    c = make_client(db, clock)
    made = await c.schedule_create(
        "x", every="1m", queue="a", catchup_window="30d", jitter="2s", **JOB
    )
    await make_scheduler(db, clock).pass_once()
    changed = await c.schedule_update("x", every="5m", queue="b")
    assert (changed.every_seconds, changed.template["queue"]) == (300, "b")
    assert (changed.catchup_window_seconds, changed.jitter_seconds) == (30 * 86400, 2)
    assert changed.template["spec"] == JOB["spec"]
    assert changed.next_due == START + timedelta(minutes=5)
    with pytest.raises(errors.InvalidInput, match="^name: a schedule named 'x' exists"):
        await c.schedule_create("x", every="1m", **JOB)
    await c.schedule_delete("x")
    assert await db.schedules.firings(schedule_id=made.id) == []
    with pytest.raises(errors.NotFound):
        await c.schedule("x")


async def test_a_schedule_that_allows_overlap_fires_ahead_and_its_job_waits_for_its_time(
    db: store.Store, clock: FrozenClock
) -> None:
    c = make_client(db, clock)
    allow = await c.schedule_create("a", every="1m", **JOB)
    forbid = await c.schedule_create("f", every="1m", overlap="forbid", **JOB)
    s = make_scheduler(db, clock, ahead=timedelta(seconds=5))
    await s.pass_once()  # both fire their first time, now
    assert await db.schedules.next_wake(ahead=timedelta(seconds=5)) == START + timedelta(seconds=55)
    clock.advance(57)
    await s.pass_once()
    [_first, early] = await firings(db, allow.id)
    assert early.nominal_at == START + timedelta(minutes=1)
    assert early.lateness_seconds == -3  # recorded three seconds ahead of its time
    job = await db.jobs.get(job_id=early.job_id or 0)
    assert (job.state, job.run_at) == (J.QUEUED, START + timedelta(minutes=1))
    assert len(await firings(db, forbid.id)) == 1, "forbid decides at its time, not before"
    clock.advance(3)
    await s.pass_once()
    assert len(await firings(db, forbid.id)) == 2


async def test_a_schedule_whose_firings_cannot_be_worked_out_never_stops_the_others(
    db: store.Store, clock: FrozenClock, caplog: pytest.LogCaptureFixture
) -> None:
    c = make_client(db, clock)
    good = await c.schedule_create("good", every="1m", **JOB)
    new, anchor = c.new_schedule("broken", cron="0 * * * *", **JOB)
    # Stored as an older corral might have, in a zone this tzdata no longer knows.
    broken = await db.schedules.create(
        new=dataclasses.replace(new, tz="Atlantis/Capital"),
        anchor=anchor,
        next_due=START,
        now=START,
    )
    await make_scheduler(db, clock).pass_once()
    assert len(await firings(db, good.id)) == 1
    assert await firings(db, broken.id) == []
    assert "'broken'" in caplog.text
    assert "cannot be worked out" in caplog.text


async def test_a_backfill_never_becomes_the_job_overlap_watches(
    db: store.Store, clock: FrozenClock
) -> None:
    c = make_client(db, clock)
    made = await c.schedule_create("r", cron="* * * * *", overlap="replace", **JOB)
    s = make_scheduler(db, clock)
    await s.pass_once()
    [regular] = await firings(db, made.id)
    await c.backfill("r", start="2026-02-01T00:00Z", end="2026-02-01T00:03Z")
    assert (await db.schedules.by_id(schedule_id=made.id)).last_job_id == regular.job_id
    clock.advance(60)
    await s.pass_once()
    assert (await db.jobs.get(job_id=regular.job_id or 0)).state == J.CANCELLED
    backfilled = [f for f in await firings(db, made.id) if f.outcome == F.BACKFILLED]
    assert {(await db.jobs.get(job_id=f.job_id or 0)).state for f in backfilled} == {J.QUEUED}


async def test_catching_up_with_replace_fires_only_the_latest(
    db: store.Store, clock: FrozenClock
) -> None:
    made = await make_client(db, clock).schedule_create(
        "cr", every="1m", catchup="all", overlap="replace", **JOB
    )
    clock.advance(3 * 60)
    await make_scheduler(db, clock).pass_once()
    assert [f.outcome for f in await firings(db, made.id)] == [F.OVERLAP] * 3 + [F.FIRED]


async def test_catch_up_all_misses_a_lone_time_older_than_its_window(
    db: store.Store, clock: FrozenClock
) -> None:
    made = await make_client(db, clock).schedule_create(
        "w", cron="0 0 * * *", catchup="all", catchup_window="1h", **JOB
    )
    clock.advance(12 * 3600 + 23 * 3600)  # its one due time is 23 hours old
    await make_scheduler(db, clock).pass_once()
    assert [f.outcome for f in await firings(db, made.id)] == [F.MISSED]


async def test_resuming_never_fires_before_the_start(db: store.Store, clock: FrozenClock) -> None:
    c = make_client(db, clock)
    await c.schedule_create("s", cron="0 9 * * *", start="2026-04-01", **JOB)
    await c.schedule_pause("s")
    resumed = await c.schedule_resume("s")
    assert resumed.next_due == datetime(2026, 4, 1, 9, tzinfo=UTC)


async def test_long_durations_survive_an_update(db: store.Store, clock: FrozenClock) -> None:
    c = make_client(db, clock)
    await c.schedule_create("l", every="36500d", catchup_window="36500d", **JOB)
    changed = await c.schedule_update("l", queue="b")
    assert (changed.every_seconds, changed.catchup_window_seconds) == (36500 * 86400,) * 2


async def test_a_stuck_schedule_is_tried_again_a_minute_later(
    db: store.Store, clock: FrozenClock
) -> None:
    c = make_client(db, clock)
    new, anchor = c.new_schedule("broken", cron="0 * * * *", **JOB)
    broken = await db.schedules.create(
        new=dataclasses.replace(new, tz="Atlantis/Capital"),
        anchor=anchor,
        next_due=START,
        now=START,
    )
    await make_scheduler(db, clock, batch=1).pass_once()
    after = await db.schedules.by_id(schedule_id=broken.id)
    assert after.next_due == START + scheduler.STUCK_BACKOFF


class _SlowClock(FrozenClock):
    """Each look at the monotonic clock finds three seconds gone: every batch is slow."""

    def monotonic(self) -> float:
        self._ticks = getattr(self, "_ticks", 0.0) + 3.0
        return self._ticks


async def test_slow_batches_halve_the_next_until_all_due_are_fired(db: store.Store) -> None:
    clock = _SlowClock(START)
    c = make_client(db, clock)
    made = [await c.schedule_create(f"s{n}", every="1m", **JOB) for n in range(10)]
    s = make_scheduler(db, clock, batch=4)
    result = await s.pass_once()
    assert result.fired == 10
    assert s._limit == 1  # 4, then 2, then 1 a batch
    assert [len(await firings(db, m.id)) for m in made] == [1] * 10


class _Stops:
    """An executor that notes what it is asked to stop."""

    def __init__(self) -> None:
        self.cancelled: list[str] = []

    async def cancel(self, name: str, grace: timedelta) -> None:
        self.cancelled.append(name)


async def test_replace_stops_the_running_attempt_of_the_previous_job_on_its_platform(
    db: store.Store, clock: FrozenClock
) -> None:
    c = make_client(db, clock)
    made = await c.schedule_create("rr", every="1m", overlap="replace", **JOB)
    noop = _Stops()
    s = make_scheduler(db, clock, executors={"noop": noop})  # type: ignore[dict-item]
    await s.pass_once()
    [claimed] = await db.jobs.claim(now=clock.now(), limit=10, executors=["noop"])
    clock.advance(60)
    await s.pass_once()
    assert noop.cancelled == [claimed.attempt.launch_name]
    assert (await db.jobs.get(job_id=claimed.job.id)).state == J.CANCELLED
    assert [f.outcome for f in await firings(db, made.id)] == [F.FIRED, F.FIRED]
