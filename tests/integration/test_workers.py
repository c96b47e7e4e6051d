"""Python workers in one process: payload versions checked at submit, parked jobs that
drain when a worker that reads them registers, upcasting, fresh fields, cancels, the
drain at shutdown, and recovery of a worker that went silent."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from corral import client, config, errors, model, python_tasks, store
from corral.errors import Stopped
from corral.reconciler import Reconciler
from corral.testing import PausedClock
from corral.worker import App, Fresh, Pinned, TaskContext, Worker, current_task
from tests.support.jobs import all_in
from tests.support.wait import eventually

J, A = model.JobState, model.AttemptState


class InvoiceV1(BaseModel):
    customer_id: Pinned[int]
    amount: Pinned[float]


class Invoice(BaseModel):
    customer_id: Pinned[int]
    amount_cents: Pinned[int]
    email: Fresh[str | None] = None


class Ping(BaseModel):
    n: int


SENT: list[dict[str, Any]] = []
EMAILS: dict[int, str] = {}


def app_v1() -> App:
    app = App("billing", version="1.0.0")

    @app.task("send-invoice", version=1)
    def send(invoice: InvoiceV1) -> None:
        SENT.append({"by": "1.0.0", "cents": round(invoice.amount * 100)})

    return app


def app_v2() -> App:
    app = App("billing", version="2.0.0")

    @app.task("send-invoice", version=2)
    async def send(invoice: Invoice) -> None:
        SENT.append({"by": "2.0.0", "cents": invoice.amount_cents, "email": invoice.email})

    @send.upcaster(from_version=1)
    def cents(old: InvoiceV1) -> Invoice:
        return Invoice(customer_id=old.customer_id, amount_cents=round(old.amount * 100))

    @send.resolver("email")
    def email_of(invoice: Invoice) -> str | None:
        return EMAILS.get(invoice.customer_id)

    return app


SETTINGS = dict(
    timeouts={"dispatch_interval": "1s", "heartbeat_interval": "5s", "lease_timeout": "30s"}
)


@pytest.fixture(autouse=True)
def _clean() -> None:
    SENT.clear()
    EMAILS.clear()


@pytest.fixture
def clk() -> PausedClock:
    return PausedClock(pause=0.02)


@pytest.fixture
def settings(db_url: str) -> config.Settings:
    return config.Settings(database_url=db_url, **SETTINGS)  # type: ignore[arg-type]


@pytest.fixture
def c(db: store.Store, settings: config.Settings, clk: PausedClock) -> client.Client:
    return client.Client(store=db, executors={}, settings=settings, clock=clk)


@contextlib.asynccontextmanager
async def running(
    app: App, db: store.Store, settings: config.Settings, clk: PausedClock, **kw: Any
) -> AsyncIterator[Worker]:
    worker = Worker(app, db=db, settings=settings, clk=clk, **kw)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    await eventually(
        lambda: db.workers.list(since=clk.now() - settings.timeouts.lease_timeout),
        what="the worker registered",
    )
    try:
        yield worker
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)


async def states(c: client.Client, ids: list[int]) -> set[J]:
    return {(await c.job(i)).job.state for i in ids}


async def test_a_payload_that_does_not_fit_the_live_workers_schema_is_refused_naming_the_field(
    c: client.Client, db: store.Store, settings: config.Settings, clk: PausedClock
) -> None:
    with pytest.raises(errors.InvalidInput, match="no live worker has registered"):
        await c.submit(task="send-invoice", payload={"customer_id": 7, "amount_cents": 100})
    async with running(app_v2(), db, settings, clk):
        with pytest.raises(errors.InvalidInput, match=r"payload.data.amount_cents: 'lots'"):
            await c.submit(task="send-invoice", payload={"customer_id": 7, "amount_cents": "lots"})
        with pytest.raises(errors.InvalidInput, match="payload.data: 'amount' is a required"):
            await c.submit(task="send-invoice", task_version=1, payload={"customer_id": 7})
        job_id, _ = await c.submit(
            task="send-invoice", payload={"customer_id": 7, "amount_cents": 5}
        )
        job = (await c.job(job_id)).job
        assert job.spec == {"task": "send-invoice", "version": 2}
        data = {"customer_id": 7, "amount_cents": 5}  # as submitted: the worker fills defaults
        assert job.payload == python_tasks.envelope("send-invoice", 2, data)
        await eventually(lambda: SENT, what="sent")


async def test_a_newer_payload_parks_without_an_attempt_and_drains_when_its_worker_registers(
    c: client.Client, db: store.Store, settings: config.Settings, clk: PausedClock
) -> None:
    async with running(app_v1(), db, settings, clk):
        old, _ = await c.submit(task="send-invoice", payload={"customer_id": 1, "amount": 1.5})
        await eventually(lambda: SENT, what="v1 sent the v1 invoice")
        new = [
            (
                await c.submit(
                    task="send-invoice",
                    task_version=2,
                    payload={"customer_id": 2, "amount_cents": 250 + n},
                )
            )[0]
            for n in range(5)
        ]
        assert await states(c, new) == {J.PARKED}
        view = await c.job(new[0])
        assert view.attempts == []
        assert view.job.attempt_count == 0
        parked = await db.workers.parked_list()
        assert [p.job.id for p in parked] == new
        assert parked[0].needs_app_version is None  # no worker ever read version 2
        assert await states(c, [old]) == {J.SUCCEEDED}
    EMAILS[2] = "now@example.com"
    async with running(app_v2(), db, settings, clk):
        await eventually(lambda: all_in(c, new, J.SUCCEEDED), what="drained")
    mine = [s for s in SENT if s["by"] == "2.0.0"]
    assert sorted(s["cents"] for s in mine) == [250, 251, 252, 253, 254]  # each once
    assert all(s["email"] == "now@example.com" for s in mine)
    for job_id in new:
        assert [a.attempt_no for a in (await c.job(job_id)).attempts] == [1]


async def test_a_v2_worker_reads_v1_payloads_through_its_upcaster(
    c: client.Client, db: store.Store, settings: config.Settings, clk: PausedClock
) -> None:
    async with running(app_v2(), db, settings, clk):
        job_id, _ = await c.submit(
            task="send-invoice", task_version=1, payload={"customer_id": 3, "amount": 2.25}
        )
        await eventually(lambda: all_in(c, [job_id], J.SUCCEEDED), what="ran")
    assert SENT == [{"by": "2.0.0", "cents": 225, "email": None}]


async def test_a_worker_gone_silent_has_its_job_parked_when_no_live_worker_reads_it(
    c: client.Client, db: store.Store, settings: config.Settings, clk: PausedClock
) -> None:
    app = App("billing", version="2.0.0")
    started = asyncio.Event()

    @app.task("ping", version=2)
    async def hangs(ping: Ping) -> None:
        started.set()
        await asyncio.Event().wait()

    worker = Worker(app, db=db, settings=settings, clk=clk)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    await eventually(
        lambda: db.workers.list(since=clk.now() - settings.timeouts.lease_timeout),
        what="registered",
    )
    job_id, _ = await c.submit(task="ping", payload={"n": 1})
    await asyncio.wait_for(started.wait(), 60)
    task.cancel()  # the worker dies: no drain, no goodbye, its heartbeats stop
    with contextlib.suppress(asyncio.CancelledError):
        await task
    clk.advance(settings.timeouts.lease_timeout.total_seconds() + 1)
    rec = Reconciler(store=db, executors={}, clock=clk, settings=settings)
    done = await rec.run_once()
    assert done.parked == 1
    view = await c.job(job_id)
    assert view.job.state == J.PARKED
    assert view.attempts[0].state == A.SUPERSEDED
    assert view.attempts[0].reason == model.NO_COMPATIBLE_WORKER
    assert view.job.charged_attempts == 0


class Export(BaseModel):
    pages: int


async def test_a_stopping_worker_hands_back_what_it_runs_with_its_checkpoint_not_charged(
    c: client.Client, db: store.Store, settings: config.Settings, clk: PausedClock
) -> None:
    app = App("reports", version="1.0.0")
    seen: list[tuple[int, int]] = []  # (fence, page) of every page written
    first: list[TaskContext] = []
    stuck_at_3 = asyncio.Event()
    loop = asyncio.get_running_loop()

    @app.task("export", version=1)
    def export(report: Export) -> None:
        ctx = current_task()
        first.append(ctx)
        page = ctx.load_checkpoint(default={"page": 0})["page"]
        while page < report.pages:
            if ctx.attempt_no == 1 and page == 3:  # the first attempt stalls here
                loop.call_soon_threadsafe(stuck_at_3.set)
                ctx.stopping.wait(60)
            if ctx.stopping.is_set():
                ctx.save_checkpoint({"page": page})
                raise Stopped
            seen.append((ctx.fence, page))
            page += 1
            ctx.save_checkpoint({"page": page})

    old = Worker(app, db=db, settings=settings, clk=clk)
    stop = asyncio.Event()
    task = asyncio.create_task(old.run(stop))
    await eventually(lambda: db.workers.list(since=c.since()), what="registered")
    job_id, _ = await c.submit(task="export", payload={"pages": 6})
    await asyncio.wait_for(stuck_at_3.wait(), 60)
    stop.set()  # SIGTERM: stop claiming, let it finish within drain_timeout (it does not)

    def time_passes() -> bool:
        clk.advance(1)  # drain_timeout, then the margin to checkpoint, pass
        return task.done()

    await eventually(time_passes, what="the worker stopped")
    await task
    view = await c.job(job_id)
    assert view.job.state == J.PARKED  # handed back; the only worker that reads it stopped
    assert [(a.state, a.reason) for a in view.attempts] == [(A.SUPERSEDED, model.HANDED_BACK)]
    assert view.job.charged_attempts == 0
    async with running(app, db, settings, clk):
        await eventually(lambda: all_in(c, [job_id], J.SUCCEEDED), what="resumed and done")
    fences = [a.id for a in (await c.job(job_id)).attempts]
    assert [page for _, page in seen] == [0, 1, 2, 3, 4, 5]  # each page once: resumed at 3
    assert {f for f, p in seen if p >= 3} == {fences[1]}
    with pytest.raises(errors.StaleFence):  # the stopped run writes late: refused
        await first[0].save_checkpoint_async({"page": 99})
    assert (await db.sinks.checkpoint_load(job_id=job_id)) == (fences[1], {"page": 6})


async def test_a_cancel_reaches_the_running_task_through_the_store(
    c: client.Client, db: store.Store, settings: config.Settings, clk: PausedClock
) -> None:
    app = App("pings", version="1.0.0")
    started, stopped = asyncio.Event(), asyncio.Event()

    @app.task("ping", version=1)
    async def ping(p: Ping) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            stopped.set()
            raise

    async with running(app, db, settings, clk):
        job_id, _ = await c.submit(task="ping", payload={"n": 1})
        await asyncio.wait_for(started.wait(), 60)
        await c.cancel(job_id)
        await asyncio.wait_for(stopped.wait(), 60)  # its next heartbeat found it cancelled
    view = await c.job(job_id)
    assert view.job.state == J.CANCELLED
    assert view.attempts[0].state == A.CANCELLED


async def test_a_job_scheduled_today_runs_tomorrow_with_its_pinned_amount_and_the_new_email(
    c: client.Client, db: store.Store, settings: config.Settings, clk: PausedClock
) -> None:
    EMAILS[7] = "old@example.com"
    async with running(app_v2(), db, settings, clk):
        tomorrow = clk.now() + timedelta(days=1)
        job_id, _ = await c.submit(
            task="send-invoice", payload={"customer_id": 7, "amount_cents": 1999}, run_at=tomorrow
        )
        assert (await c.job(job_id)).job.state == J.SCHEDULED
        EMAILS[7] = "new@example.com"  # the source changes overnight
        clk.advance(timedelta(days=1).total_seconds())
        await db.jobs.promote_due(now=clk.now(), limit=100)
        await eventually(lambda: all_in(c, [job_id], J.SUCCEEDED), what="sent")
    assert SENT == [{"by": "2.0.0", "cents": 1999, "email": "new@example.com"}]
    view = await c.job(job_id)
    assert any(e.reason == "fresh values resolved: email" for e in view.events)
    log = (await db.runlogs.of_job(job_id=job_id))[view.attempts[0].id]
    fresh = log.stream("fresh")
    assert fresh is not None
    assert "new@example.com" in fresh.text


async def test_a_submitter_with_the_task_in_hand_checks_the_payload_with_its_own_model(
    c: client.Client, db: store.Store, settings: config.Settings, clk: PausedClock
) -> None:
    app = app_v2()
    send = app.get("send-invoice")
    with pytest.raises(errors.InvalidInput, match="send-invoice version 2: data.amount_cents"):
        await c.submit(task=send, payload={"customer_id": 7})
    with pytest.raises(errors.InvalidInput, match="task_version: 1: task send-invoice here"):
        await c.submit(task=send, task_version=1, payload=Invoice(customer_id=7, amount_cents=1))
    EMAILS[7] = "ann@example.com"
    async with running(app, db, settings, clk):
        job_id, _ = await c.submit(task=send, payload=Invoice(customer_id=7, amount_cents=42))
        await eventually(lambda: all_in(c, [job_id], J.SUCCEEDED), what="sent")
        made = await c.schedule_create(
            "monthly",
            every="1h",
            task="send-invoice",
            payload={"customer_id": 7, "amount_cents": 9},
        )
        assert made.template["spec"] == {"task": "send-invoice", "version": 2}
        fired = await c.schedule_trigger("monthly")
        await eventually(lambda: all_in(c, [fired], J.SUCCEEDED), what="the schedule's job ran")
    assert [s["cents"] for s in SENT] == [42, 9]


# --- what goes wrong ---------------------------------------------------------------------


def ping_app(version: str = "1.0.0") -> App:
    app = App("pings", version=version)

    @app.task("ping", version=1)
    def ping(p: Ping) -> None: ...

    return app


async def test_a_worker_heard_from_again_after_a_silence_queues_what_parked_meanwhile(
    c: client.Client, db: store.Store, settings: config.Settings, clk: PausedClock
) -> None:
    worker = Worker(ping_app(), db=db, settings=settings, clk=clk)
    await db.workers.register(worker=worker.info(), now=clk.now(), since=c.since())
    clk.advance(settings.timeouts.lease_timeout.total_seconds() + 1)  # silent past its lease
    job_id, _ = await c.submit(task="ping", task_version=1, payload={"n": 1})
    assert (await c.job(job_id)).job.state == J.PARKED  # nobody live reads it
    await db.workers.beat(worker_id=worker.id, leases={}, now=clk.now(), since=c.since())
    assert (await c.job(job_id)).job.state == J.QUEUED  # its reader is back


async def test_recovery_queues_a_parked_job_that_a_live_worker_reads(
    c: client.Client, db: store.Store, settings: config.Settings, clk: PausedClock
) -> None:
    worker = Worker(ping_app(), db=db, settings=settings, clk=clk)
    await db.workers.register(worker=worker.info(), now=clk.now(), since=c.since())
    job_id, _ = await c.submit(task="ping", payload={"n": 1})
    # A park that raced the registration: it saw no live reader.
    assert await db.workers.park_unread(now=clk.now(), since=clk.now()) == 1
    done = await Reconciler(store=db, executors={}, clock=clk, settings=settings).run_once()
    assert (done.parked, done.unparked) == (0, 1)
    assert (await c.job(job_id)).job.state == J.QUEUED


async def test_a_worker_of_one_queue_neither_reads_nor_releases_another_queue_s_jobs(
    c: client.Client, db: store.Store, settings: config.Settings, clk: PausedClock
) -> None:
    job_id, _ = await c.submit(task="ping", task_version=1, payload={"n": 1}, queue="b")
    assert (await c.job(job_id)).job.state == J.PARKED
    worker = Worker(ping_app(), db=db, settings=settings, clk=clk, queues=("a",))
    assert await db.workers.register(worker=worker.info(), now=clk.now(), since=c.since()) == 0
    assert await db.workers.unpark_read(now=clk.now(), since=c.since()) == 0
    other, _ = await c.submit(task="ping", payload={"n": 2}, queue="b")
    assert (await c.job(other)).job.state == J.PARKED  # queue a's worker does not read b


async def test_an_end_the_store_refused_once_is_written_again(
    c: client.Client,
    db: store.Store,
    settings: config.Settings,
    clk: PausedClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real, failed = db.attempts.finish, []

    async def flaky(**kw: Any) -> Any:
        if not failed:
            failed.append(1)
            raise errors.StoreError("database is locked")
        return await real(**kw)

    monkeypatch.setattr(db.attempts, "finish", flaky)
    async with running(ping_app(), db, settings, clk):
        job_id, _ = await c.submit(task="ping", payload={"n": 1})
        await eventually(lambda: all_in(c, [job_id], J.SUCCEEDED), what="recorded after all")
    assert failed == [1]


async def test_a_plain_task_past_its_deadline_fails_and_holds_its_slot_until_it_returns(
    c: client.Client, db: store.Store, settings: config.Settings, clk: PausedClock
) -> None:
    app = App("slow", version="1.0.0")
    release = threading.Event()
    ran: list[int] = []

    @app.task("nap", version=1)
    def nap(p: Ping) -> None:
        ran.append(p.n)
        if p.n == 1:
            release.wait(60)  # ignores ctx.stopping: Python cannot stop its thread

    async with running(app, db, settings, clk, concurrency=1, prefetch=0):
        first, _ = await c.submit(
            task="nap", payload={"n": 1}, policy={"limits": {"attempt_deadline": "30s"}}
        )
        await eventually(lambda: ran == [1], what="the first started")
        second, _ = await c.submit(task="nap", payload={"n": 2})
        clk.advance(31)
        await eventually(lambda: all_in(c, [first], J.QUEUED), what="timed out, to retry")
        attempt = (await c.job(first)).attempts[0]
        assert (attempt.state, attempt.reason) == (A.FAILED, "timed out: ran past its deadline")
        assert (await c.job(second)).job.state == J.QUEUED  # no free thread, no claim
        assert ran == [1]
        release.set()  # its thread returns: the slot frees
        await eventually(lambda: all_in(c, [second], J.SUCCEEDED), what="the second ran")


async def test_a_task_s_own_timeout_is_its_failure_not_a_deadline(
    c: client.Client, db: store.Store, settings: config.Settings, clk: PausedClock
) -> None:
    app = App("t", version="1.0.0")

    @app.task("call", version=1)
    async def call(p: Ping) -> None:
        raise TimeoutError("the payment service did not answer")

    async with running(app, db, settings, clk):
        job_id, _ = await c.submit(task="call", payload={"n": 1}, max_attempts=1)
        await eventually(lambda: all_in(c, [job_id], J.FAILED), what="failed")
    [attempt] = (await c.job(job_id)).attempts
    assert attempt.reason == "TimeoutError: the payment service did not answer"


async def test_a_python_job_cannot_set_its_own_lease(c: client.Client) -> None:
    with pytest.raises(errors.InvalidInput, match="policy.limits.lease_timeout: a Python task"):
        await c.submit(
            task="ping", task_version=1, payload={}, policy={"limits": {"lease_timeout": "8s"}}
        )
    spec_job = c.validate(
        c.new_job(
            executor="python",
            spec={"task": "ping", "version": 1},
            payload=python_tasks.envelope("ping", 1, {}),
        )
    )
    assert spec_job.policy["heartbeat"] is True  # on its worker's lease, however submitted


async def test_jobs_claimed_ahead_go_back_uncharged_when_the_worker_stops(
    c: client.Client, db: store.Store, settings: config.Settings, clk: PausedClock
) -> None:
    app = App("pings", version="1.0.0")
    release = asyncio.Event()

    @app.task("ping", version=1)
    async def ping(p: Ping) -> None:
        await release.wait()

    worker = Worker(app, db=db, settings=settings, clk=clk, concurrency=1, prefetch=2)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    await eventually(lambda: db.workers.list(since=c.since()), what="registered")
    ids = [(await c.submit(task="ping", payload={"n": n}))[0] for n in range(3)]
    await eventually(lambda: len(worker._ready) == 2, what="two held ahead of the one running")
    stop.set()
    release.set()  # the running one finishes within the drain; the held ones never start
    await task
    views = [await c.job(i) for i in ids]
    ran = [v for v in views if v.job.state == J.SUCCEEDED]
    back = [v for v in views if v.job.state != J.SUCCEEDED]
    assert len(ran) == 1
    assert len(back) == 2
    for v in back:  # parked: no live worker reads them now; and nothing was charged
        assert v.job.state == J.PARKED
        assert [(a.state, a.reason) for a in v.attempts] == [(A.SUPERSEDED, model.HANDED_BACK)]
        assert v.job.charged_attempts == 0


async def test_a_worker_holds_no_jobs_ahead_while_its_runs_are_long(
    c: client.Client, db: store.Store, settings: config.Settings, clk: PausedClock
) -> None:
    app = App("naps", version="1.0.0")
    release = asyncio.Event()

    @app.task("nap", version=1)
    async def nap(p: Ping) -> None:
        if p.n == 0:
            clk.advance(1)  # a run that takes a second of the worker's clock
        else:
            await release.wait()

    async with running(app, db, settings, clk, concurrency=1, prefetch=4) as worker:
        first, _ = await c.submit(task="nap", payload={"n": 0})
        await eventually(lambda: all_in(c, [first], J.SUCCEEDED), what="the long one ran")
        ids = [(await c.submit(task="nap", payload={"n": n}))[0] for n in (1, 2, 3)]
        await eventually(lambda: len(worker._runs) == 1, what="one running")
        assert len(worker._ready) == 0  # runs take long here: none held, the rest stay queued
        assert [(await c.job(i)).job.state for i in ids].count(J.QUEUED) == 2
        release.set()
        await eventually(lambda: all_in(c, ids, J.SUCCEEDED), what="all ran")


async def test_preflight_counts_the_payload_versions_of_jobs_and_of_schedules(
    c: client.Client, db: store.Store, settings: config.Settings, clk: PausedClock
) -> None:
    worker = Worker(app_v2(), db=db, settings=settings, clk=clk)
    await db.workers.register(worker=worker.info(), now=clk.now(), since=c.since())
    await c.submit(task="send-invoice", task_version=1, payload={"customer_id": 1, "amount": 1})
    await c.submit(task="send-invoice", task_version=3, payload={"customer_id": 1})  # parks
    await c.schedule_create(
        "monthly", every="1h", task="send-invoice", payload={"customer_id": 7, "amount_cents": 9}
    )
    found = await db.workers.payload_versions(tasks=["send-invoice", "no-such-task"])
    assert found == {
        ("send-invoice", 1): {"queued": 1},
        ("send-invoice", 2): {"schedule": 1},
        ("send-invoice", 3): {"parked": 1},
    }
