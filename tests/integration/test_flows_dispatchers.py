"""Flows held across dispatcher processes on one PostgreSQL (and by one on SQLite): three
dispatchers never start more than a flow's rate of its jobs within any window (measured
from the attempts' starts: their claims, `created_at`), nor run more than its parallelism
at once, while a flow with no limit and jobs of no flow go through unthrottled."""

from __future__ import annotations

import asyncio
import multiprocessing
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from corral import flows, model, store
from corral.clock import SystemClock
from tests.conftest import pg_empty
from tests.support import dispatch_worker

DISPATCHERS = 3
RATED, SLOW, FREE, PLAIN = 30, 6, 20, 20
SLEEP = 0.2


@pytest.mark.postgres
@pytest.mark.slow
def test_three_dispatchers_keep_a_flow_s_rate_and_parallelism(pg_url: str, tmp_path: Path) -> None:
    pg_empty(pg_url)
    _check(_dispatched(pg_url, tmp_path, DISPATCHERS), tmp_path)


@pytest.mark.slow
def test_a_dispatcher_on_sqlite_keeps_them_too(sqlite_url: str, tmp_path: Path) -> None:
    _check(_dispatched(sqlite_url, tmp_path, 1), tmp_path)


def _dispatched(
    url: str, tmp_path: Path, dispatchers: int
) -> dict[str | None, list[tuple[datetime, datetime]]]:
    """The jobs submitted, run by `dispatchers` processes to their end: what each ran."""
    asyncio.run(_submit(url))
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(dispatchers)  # all import corral first, then all dispatch together
    procs = [
        ctx.Process(target=dispatch_worker.run, args=(url, str(tmp_path / f"d{i}.txt"), 50, start))
        for i in range(dispatchers)
    ]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(timeout=150)
            assert p.exitcode == 0, f"dispatcher process exited {p.exitcode}"
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join()
    return asyncio.run(_ran(url))


def _check(ran: dict[str | None, list[tuple[datetime, datetime]]], tmp_path: Path) -> None:
    slept = [
        (datetime.fromtimestamp(float(a), UTC), datetime.fromtimestamp(float(b), UTC))
        for ledger in tmp_path.glob("d*.slept")
        for a, b in (line.split() for line in ledger.read_text().splitlines())
    ]
    assert len(slept) == SLOW
    assert {flow: len(spans) for flow, spans in ran.items()} == {
        "rated": RATED, "slow": SLOW, "free": FREE, None: PLAIN,
    }  # fmt: skip
    starts = sorted(begun for begun, _ in ran["rated"])
    assert all(b - a >= timedelta(seconds=1) for a, b in zip(starts, starts[10:], strict=False))
    assert starts[-1] - starts[0] >= timedelta(seconds=2)  # 30 at 10 a second
    # How many of the flow with parallelism 2 ran at once: their work as it began and ended
    # (the executors' wall clock), which is inside what corral counts as running (from
    # before its launch to after its end is recorded); its recorded times come from each
    # dispatcher's tick, read before its statements run, so they may overlap by a tick.
    assert _most_at_once(slept) == 2
    # Unthrottled: every job of the flow with no limit, and of none, started before the rated
    # flow's window let its 11th start.
    assert max(begun for begun, _ in ran["free"] + ran[None]) < starts[10]


async def _submit(url: str) -> None:
    db = store.Store.connect(url)
    now = SystemClock().now()
    for name, rate, parallelism in (
        ("rated", "10/1s", None),
        ("slow", None, 2),
        ("free", None, None),
    ):
        limits = flows.Limits(
            rate=None if rate is None else flows.rate_of(rate), parallelism=parallelism
        )
        await db.flows.add(tenant="t", name=name, limits=limits, now=now, most=10)

    def job(flow: str | None, spec: dict[str, float]) -> model.NewJob:
        return model.NewJob(executor="noop", spec=spec, tenant="t", flow=flow)

    new = [job("rated", {}) for _ in range(RATED)] + [job("slow", {"sleep": SLEEP})] * SLOW
    new += [job("free", {}) for _ in range(FREE)] + [job(None, {}) for _ in range(PLAIN)]
    await db.jobs.submit(new=new, now=now)
    await db.close()


async def _ran(url: str) -> dict[str | None, list[tuple[datetime, datetime]]]:
    """Each succeeded job's attempt, by flow: its start (claim) and its end."""
    db = store.Store.connect(url)
    out: dict[str | None, list[tuple[datetime, datetime]]] = {}
    for job in await db.jobs.list(limit=1000):
        assert job.state == model.JobState.SUCCEEDED, job
        _, attempts, _, _ = await db.jobs.record(job_id=job.id)
        [one] = attempts
        assert one.finished_at is not None
        out.setdefault(job.flow, []).append((one.created_at, one.finished_at))
    await db.close()
    return out


def _most_at_once(spans: list[tuple[datetime, datetime]]) -> int:
    """The most of `spans` open at one time (one that ends as another begins: not both)."""
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most
