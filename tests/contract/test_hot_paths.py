"""One claim / settle scenario through every path that writes it: PostgreSQL's hot path
(store/postgres/), SQLite's (store/sqlite/) and the general one (claims.job_claim,
completions.attempt_settle) on both databases. Each leaves its rows of jobs, attempts,
events and run logs, compared with those of the general path on SQLite, ids and their
order normalised: a path that drifts from the others (a column, a run-log line, an event
too many or in another order for its job) fails here."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, select

from corral import launching, model, python_tasks, store
from corral.store import claims, completions, tables, workers
from corral.testing import FrozenClock
from tests.conftest import sqlite_copy

A, J = model.AttemptState, model.JobState
LIMITS = store.DefaultLimits(timedelta(seconds=240), timedelta(seconds=60))
HEARTBEAT = {"heartbeat": True, "limits": {"lease_timeout": 30}}
OUTPUT = launching.RunLog(streams=(launching.Stream("stdout", "done\n", 5),), latency=0.5)


class Route:
    """How a scenario's claims and settles reach the store: the facade's hot path, or the
    general path's functions in a transaction of their own."""

    def __init__(self, db: store.Store, *, general: bool) -> None:
        self.db, self.general = db, general

    async def claim(self, clock: FrozenClock, limit: int) -> list[model.Claimed]:
        now, kinds = clock.now(), ["noop"]
        if self.general:
            return self._in_tx(
                claims.job_claim, now=now, limit=limit, executors=kinds, limits=LIMITS
            )
        return await self.db.jobs.claim(now=now, limit=limit, executors=kinds, limits=LIMITS)

    async def settle(
        self, clock: FrozenClock, launched: Sequence[int], won: Sequence[completions.Finish]
    ) -> tuple[list[int], list[completions.Outcome]]:
        if self.general:
            return self._in_tx(
                completions.attempt_settle, launched=launched, finishes=won, now=clock.now()
            )
        return await self.db.attempts.settle(launched=launched, finishes=won, now=clock.now())

    async def worker_claim(
        self, clock: FrozenClock, reads: Sequence[tuple[str, Sequence[int]]], limit: int
    ) -> list[model.Claimed]:
        args: dict[str, Any] = {
            "worker_id": "w1",
            "reads": reads,
            "queues": [],
            "now": clock.now(),
            "limit": limit,
            "limits": LIMITS,
        }
        if self.general:
            return self._in_tx(workers.worker_claim, **args)
        return await self.db.workers.claim(**args)

    def _in_tx(self, fn: Callable[..., Any], **kwargs: Any) -> Any:
        with self.db.database.engine.begin() as conn:
            return fn(conn, **kwargs)


def success(fence: int, code: int | None, reason: str | None, output: Any = None) -> Any:
    return completions.Finish(fence, A.SUCCEEDED, code, reason, output=output)


async def scenario(route: Route, clock: FrozenClock) -> list[Any]:
    """Queued and scheduled jobs, a claim that queues the scheduled one and takes the most
    urgent three, a settle of successes (one with a run log) and launches, a second claim
    and a settle where one fence is both launched and won, then that settle again (a no-op).
    What each call returned, ids normalised."""
    t0 = clock.now()
    new = [
        model.NewJob(executor="noop", spec={}, priority=5, labels={"k": "v"}),
        model.NewJob(executor="noop", spec={}, policy=HEARTBEAT),
        model.NewJob(executor="noop", spec={}, run_at=t0 + timedelta(seconds=10)),
        model.NewJob(executor="other", spec={}),
        model.NewJob(executor="noop", spec={"x": [1, 2]}, priority=1, payload={"p": 1}),
    ]
    await route.db.jobs.submit(new=new, now=t0)
    clock.advance(20)
    first = await route.claim(clock, 3)
    a, e, b = (c.attempt.id for c in first)
    clock.advance(5)
    settled = await route.settle(
        clock, [a, e, b], [success(a, 0, None, OUTPUT), success(e, None, "done")]
    )
    clock.advance(5)
    [c] = await route.claim(clock, 3)
    clock.advance(5)
    fence = c.attempt.id
    won = [success(b, 0, "ok"), success(fence, 3, None)]
    again = [await route.settle(clock, [fence], won) for _ in range(2)]
    fences = {x.attempt.id: (x.job.id, x.attempt.attempt_no) for x in [*first, c]}
    return [
        [(x.job, _attempt(x.attempt)) for x in [*first, c]],
        [_settled(s, fences) for s in [settled, *again]],
    ]


async def worker_scenario(route: Route, clock: FrozenClock) -> list[Any]:
    """A worker's claim of the tasks it reads (one of them scheduled, its time come), each
    attempt recorded running at once, then their successes settled."""
    t0 = clock.now()
    new = [
        model.NewJob(executor=python_tasks.PYTHON, spec={"task": "a", "version": 1}, priority=2),
        model.NewJob(executor=python_tasks.PYTHON, spec={"task": "a", "version": 2}),
        model.NewJob(
            executor=python_tasks.PYTHON,
            spec={"task": "a", "version": 1},
            run_at=t0 + timedelta(seconds=10),
            policy=HEARTBEAT,
        ),
        model.NewJob(executor=python_tasks.PYTHON, spec={"task": "b", "version": 1}, queue="q2"),
    ]
    await route.db.jobs.submit(new=new, now=t0)
    clock.advance(20)
    taken = await route.worker_claim(clock, [("a", [1]), ("b", [1])], 5)
    clock.advance(5)
    fences = {x.attempt.id: (x.job.id, x.attempt.attempt_no) for x in taken}
    won = [success(x.attempt.id, 0, None) for x in taken if x.job.id in (1, 3)]
    settled = await route.settle(clock, [], won)
    return [[(x.job, _attempt(x.attempt)) for x in taken], _settled(settled, fences)]


SCENARIOS = {"dispatcher": scenario, "worker": worker_scenario}


def _attempt(attempt: model.Attempt) -> model.Attempt:
    return dataclasses.replace(attempt, id=0)


def _settled(settled: Any, fences: dict[int, tuple[int, int]]) -> Any:
    ran, outcomes = settled
    return (
        sorted(fences[f] for f in ran),
        sorted(
            (o.job_id, fences[o.fence], o.attempt_no, o.attempt_state, o.job_state)
            for o in outcomes
        ),
    )


def rows(db: store.Store) -> dict[str, Any]:
    """Every row the scenario left, each attempt's id as (job id, attempt number), each
    event's and run log's likewise, the events of each job in the order written."""
    with db.database.engine.connect() as conn:
        fence = {r.id: (r.job_id, r.attempt_no) for r in conn.execute(select(tables.attempts))}
        return {
            "jobs": _all(conn, tables.jobs, "id"),
            "attempts": sorted(
                ({**r, "id": fence[r["id"]]} for r in _all(conn, tables.attempts, "id")),
                key=lambda r: r["id"],
            ),
            "events": _events(conn, fence),
            "run_logs": sorted(
                ({**r, "attempt_id": fence[r["attempt_id"]]} for r in _all(conn, tables.run_logs)),
                key=lambda r: r["attempt_id"],
            ),
        }


def _all(conn: Connection, table: Any, order: str | None = None) -> list[dict[str, Any]]:
    stmt = select(table)
    if order is not None:
        stmt = stmt.order_by(table.c[order])
    return [dict(r._mapping) for r in conn.execute(stmt)]


def _events(conn: Connection, fence: dict[int, tuple[int, int]]) -> dict[int, list[Any]]:
    by_job: dict[int, list[Any]] = defaultdict(list)
    for r in _all(conn, tables.events, "id"):
        attempt = fence.get(r["attempt_id"]) if r["attempt_id"] is not None else None
        by_job[r["job_id"]].append({**r, "id": None, "attempt_id": attempt})
    return dict(by_job)


async def run(url: str, *, general: bool, name: str) -> tuple[list[Any], dict[str, Any]]:
    """Scenario `name` on a store at `url`, by the general path or the hot one: what its
    calls returned and the rows it left."""
    db = store.Store.connect(url)
    try:
        returned = await SCENARIOS[name](Route(db, general=general), FrozenClock())
        return returned, rows(db)
    finally:
        await db.close()


@pytest.mark.parametrize("name", sorted(SCENARIOS))
@pytest.mark.parametrize("general", [False, True], ids=["hot", "general"])
async def test_every_path_leaves_the_same_rows(
    db_url: str, general: bool, name: str, sqlite_template: Path, tmp_path: Path
) -> None:
    """Each path's rows and returns against the general path's on SQLite."""
    reference = sqlite_copy(sqlite_template, tmp_path, "reference.db")
    expected_returned, expected = await run(reference, general=True, name=name)
    returned, left = await run(db_url, general=general, name=name)
    assert left["jobs"] == expected["jobs"]
    assert left["attempts"] == expected["attempts"]
    assert left["events"] == expected["events"]
    assert left["run_logs"] == expected["run_logs"]
    assert returned == expected_returned


def test_the_reference_rows_are_what_a_claim_and_settle_mean(
    sqlite_template: Path, tmp_path: Path
) -> None:
    """The reference itself, so that a drift in every path at once is caught too."""
    url = sqlite_copy(sqlite_template, tmp_path, "reference.db")
    _, left = asyncio.run(run(url, general=True, name="dispatcher"))
    states = {j["id"]: (j["state"], j["attempt_count"]) for j in left["jobs"]}
    assert states == {
        1: (J.SUCCEEDED, 1),
        2: (J.SUCCEEDED, 1),
        3: (J.SUCCEEDED, 1),
        4: (J.QUEUED, 0),
        5: (J.SUCCEEDED, 1),
    }
    lines = [(e["entity"], e["from_state"], e["to_state"], e["reason"]) for e in left["events"][3]]
    assert lines == [
        ("job", None, "scheduled", "submitted"),
        ("job", "scheduled", "queued", claims.TIME_CAME),
        ("job", "queued", "running", "claimed: attempt 1 launching"),
        ("attempt", "launching", "succeeded", "exit 3"),
        ("job", "running", "succeeded", "attempt 1 succeeded"),
    ]
    [log] = left["run_logs"]
    assert log["attempt_id"] == (1, 1)


def test_a_workers_claim_records_its_attempts_running(
    sqlite_template: Path, tmp_path: Path
) -> None:
    """The worker scenario's reference: the tasks read are taken and started, the others
    left queued."""
    url = sqlite_copy(sqlite_template, tmp_path, "reference.db")
    _, left = asyncio.run(run(url, general=True, name="worker"))
    states = {j["id"]: j["state"] for j in left["jobs"]}
    assert states == {1: J.SUCCEEDED, 2: J.QUEUED, 3: J.SUCCEEDED, 4: J.RUNNING}
    lines = [(e["entity"], e["from_state"], e["to_state"]) for e in left["events"][4]]
    assert lines == [
        ("job", None, "queued"),
        ("job", "queued", "running"),
        ("attempt", "launching", "running"),
    ]
