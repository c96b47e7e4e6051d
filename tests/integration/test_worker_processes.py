"""Python workers as real processes: `corral worker` of the example app's two releases
(examples/billing/v1 and v2) on one database, through a rollout and a rollback, a SIGTERM
in the middle of a long task and a SIGKILL of a worker. No job is lost, none runs twice,
and no attempt is charged for a rollout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from corral import client, clock, config, model, store
from corral.reconciler import Reconciler
from tests.support.jobs import all_in
from tests.support.wait import eventually

pytestmark = pytest.mark.slow

J, A = model.JobState, model.AttemptState
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "billing"
CORRAL = str(Path(sys.executable).with_name("corral"))
TIMEOUTS = {
    # Real processes keep real time: heartbeats every second, a lease of five, so a worker
    # killed is known dead five seconds on, and one alive never looks dead on a busy machine
    # (at load 8, a worker's heartbeats come 1.1 s apart at most).
    "margin": "1s",
    "heartbeat_interval": "1s",
    "lease_timeout": "5s",
    "drain_timeout": "1s",
}


class Fleet:
    """Worker processes of the example app on one database, and what their tasks did."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.url = url
        self.tmp = tmp
        self.outbox = tmp / "outbox.jsonl"
        self.reports = tmp / "reports.jsonl"
        self.customers = tmp / "customers.json"
        self.customers.write_text(json.dumps({"7": {"email": "ann@example.com"}}))
        self.procs: list[subprocess.Popen[bytes]] = []
        self.settings = config.Settings(database_url=url, timeouts=TIMEOUTS)  # type: ignore[arg-type]

    def start(self, release: str) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "CORRAL_DATABASE_URL": self.url,
            "BILLING_OUTBOX": str(self.outbox),
            "BILLING_REPORTS": str(self.reports),
            "BILLING_CUSTOMERS": str(self.customers),
            **{f"CORRAL_TIMEOUTS__{k.upper()}": v for k, v in TIMEOUTS.items()},
        }
        with (self.tmp / f"worker-{len(self.procs)}-{release}.log").open("wb") as log:
            proc = subprocess.Popen(
                [CORRAL, "worker", "billing:app", "--concurrency", "4"],
                cwd=EXAMPLE / release,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.procs.append(proc)
        return proc

    def lines(self, path: Path) -> list[dict[str, Any]]:
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def stop(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> int:
        proc.send_signal(sig)
        return proc.wait(timeout=120)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)


@pytest.fixture
def fleet(db_url: str, tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(db_url, tmp_path)
    try:
        yield f
    finally:
        f.close()


@pytest.fixture
async def c(fleet: Fleet) -> AsyncIterator[client.Client]:
    db = store.Store.connect(fleet.url)
    try:
        yield client.Client(
            store=db, executors={}, settings=fleet.settings, clock=clock.SystemClock()
        )
    finally:
        await db.close()


async def registered(c: client.Client, app_version: str, count: int = 1) -> None:
    async def there() -> bool:
        live = await c.store.workers.list(since=c.since())
        return sum(w.app_version == app_version for w in live) >= count

    await eventually(there, what=f"a worker of {app_version} registered")


def by(lines: list[dict[str, Any]], version: str) -> list[dict[str, Any]]:
    return [line for line in lines if line.get("by") == version]


async def test_a_rollout_and_a_rollback_lose_no_job_and_burn_no_attempt(
    fleet: Fleet, c: client.Client
) -> None:
    v1 = fleet.start("v1")
    await registered(c, "1.0.0")
    old = [
        (await c.submit(task="send-invoice", payload={"customer_id": 7, "amount": 1.5 + n}))[0]
        for n in range(3)
    ]
    await eventually(lambda: all_in(c, old, J.SUCCEEDED), what="release 1.0 sent its invoices")

    # Release 2.0's web tier enqueues version 2 while only 1.0's workers run: parked.
    new = [
        (
            await c.submit(
                task="send-invoice",
                task_version=2,
                payload={"customer_id": 7, "amount_cents": 100 + n},
            )
        )[0]
        for n in range(5)
    ]
    assert await all_in(c, new, J.PARKED)
    assert all([(await c.job(i)).attempts == [] for i in new])

    v2 = fleet.start("v2")  # the rollout: its registration queues them again at once
    await eventually(lambda: all_in(c, new, J.SUCCEEDED), what="the parked jobs drained")
    sent = by(fleet.lines(fleet.outbox), "2.0.0")
    assert sorted(s["cents"] for s in sent) == [100, 101, 102, 103, 104]  # each once
    assert {s["email"] for s in sent} == {"ann@example.com"}  # read at run time

    assert fleet.stop(v2) == 0  # the rollback: 2.0's workers go, 1.0's stay
    late = [
        (
            await c.submit(
                task="send-invoice",
                task_version=2,
                payload={"customer_id": 7, "amount_cents": 200 + n},
            )
        )[0]
        for n in range(2)
    ]
    assert await all_in(c, late, J.PARKED)
    parked = await c.store.workers.parked_list(task="send-invoice")
    assert [(p.job.id, p.needs_app_version) for p in parked] == [(i, "2.0.0") for i in late]

    fleet.start("v2")  # the fix rolls forward
    await eventually(lambda: all_in(c, late, J.SUCCEEDED), what="drained again")
    for job_id in [*old, *new, *late]:
        view = await c.job(job_id)
        assert [a.state for a in view.attempts] == [A.SUCCEEDED]
    assert fleet.stop(v1) == 0


async def test_a_worker_told_to_stop_mid_report_hands_it_back_and_another_resumes_it(
    fleet: Fleet, c: client.Client
) -> None:
    first = fleet.start("v2")
    await registered(c, "2.0.0")
    job_id, _ = await c.submit(
        task="export-report", payload={"name": "q4", "pages": 30, "seconds_a_page": 0.2}
    )
    await eventually(lambda: len(fleet.lines(fleet.reports)) >= 2, what="two pages written")
    fleet.start("v2")  # a rolling deploy: the new worker is up before the old one stops
    await registered(c, "2.0.0", count=2)
    assert fleet.stop(first) == 0  # SIGTERM: 1s to finish, then checkpoint and hand back
    await eventually(lambda: all_in(c, [job_id], J.SUCCEEDED), what="resumed and done")
    pages = fleet.lines(fleet.reports)
    assert sorted(p["page"] for p in pages) == list(range(30))  # each page once
    view = await c.job(job_id)
    assert (view.attempts[0].state, view.attempts[0].reason) == (A.SUPERSEDED, model.HANDED_BACK)
    assert view.attempts[1].state == A.SUCCEEDED
    assert view.job.charged_attempts == 1  # the rollout cost the job nothing
    assert {p["fence"] for p in pages} == {a.id for a in view.attempts}  # both wrote pages


async def test_a_killed_worker_s_job_parks_when_no_live_worker_reads_it_or_is_retried(
    fleet: Fleet, c: client.Client
) -> None:
    recovery = Reconciler(
        store=c.store, executors={}, clock=clock.SystemClock(), settings=fleet.settings
    )

    def after_recovery(job_id: int, state: model.JobState) -> Callable[[], Any]:
        async def look() -> bool:
            await recovery.run_once()
            return (await c.job(job_id)).job.state == state

        return look

    doomed = fleet.start("v2")
    fleet.start("v1")
    await registered(c, "2.0.0")
    await registered(c, "1.0.0")
    report = {"name": "yearly", "pages": 60, "seconds_a_page": 0.1}
    job_id, _ = await c.submit(task="export-report", payload=report)  # version 2: 2.0 only
    await eventually(lambda: fleet.lines(fleet.reports), what="a page written")
    assert fleet.stop(doomed, signal.SIGKILL) == -signal.SIGKILL
    # Its claim stays until the lease runs out; then no live worker reads version 2.
    await eventually(after_recovery(job_id, J.PARKED), every=0.5, what="parked")
    view = await c.job(job_id)
    assert [(a.state, a.reason) for a in view.attempts] == [
        (A.SUPERSEDED, model.NO_COMPATIBLE_WORKER)
    ]
    assert view.job.charged_attempts == 0

    again = fleet.start("v2")  # a worker that reads it takes it, from its checkpoint
    await eventually(lambda: all_in(c, [job_id], J.RUNNING), what="taken again")
    fleet.start("v2")  # and another that reads it, idle
    await registered(c, "2.0.0", count=2)
    assert fleet.stop(again, signal.SIGKILL) == -signal.SIGKILL
    # Now a live worker reads it: the attempt is lost (charged) and the job retried there.
    await eventually(after_recovery(job_id, J.SUCCEEDED), every=0.5, what="retried, done")
    view = await c.job(job_id)
    assert [a.state for a in view.attempts] == [A.SUPERSEDED, A.LOST, A.SUCCEEDED]
    assert view.job.charged_attempts == 2
    pages = [p["page"] for p in fleet.lines(fleet.reports)]
    assert sorted(set(pages)) == list(range(60))  # every page, resumed from checkpoints
    assert len(pages) - len(set(pages)) <= 2  # at most the page in flight at each kill twice
