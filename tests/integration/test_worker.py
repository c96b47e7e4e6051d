"""Heartbeats from inside a job, on both databases: `heartbeat` from code that already runs
an event loop, and `keep_alive`, which opens the store once for its whole block."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from corral import config, model, policy, store, worker
from corral.clock import SystemClock
from corral.store import attempts, database
from tests.support.wait import PATIENCE, eventually_sync

A = model.AttemptState
HEARTBEATS = 5


async def _running(url: str, *, superseded: bool = False) -> worker.CurrentAttempt:
    """A job that sends heartbeats, its attempt claimed and running (or already replaced by
    a newer one), as the attempt's own environment would describe it."""
    db = store.Store.connect(url)
    try:
        now = SystemClock().now()
        stored = policy.job_policy(config.Settings(), {"heartbeat": True}).stored()
        new = model.NewJob(executor="process", spec={"command": ["true"]}, policy=stored)
        await db.jobs.submit(new=[new], now=now)
        limits = store.DefaultLimits(timedelta(seconds=240), timedelta(seconds=60))
        [c] = await db.jobs.claim(now=now, limit=1, executors=["process"], limits=limits)
        await db.attempts.record_running(fences=[c.attempt.id], now=now)
        if superseded:
            await db.attempts.supersede(fences=[c.attempt.id], now=now, reason="a newer one")
    finally:
        await db.close()
    return worker.CurrentAttempt(c.job.id, 1, c.attempt.id, c.attempt.launch_name, None, None)


async def _attempt(url: str, attempt: worker.CurrentAttempt) -> model.Attempt:
    db = store.Store.connect(url)
    try:
        found = await db.attempts.list(job_id=attempt.job_id)
        return next(a for a in found if a.id == attempt.fence)
    finally:
        await db.close()


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts, by name, the Store connections made, schema checks, heartbeats and closes,
    from any thread; the real Store does the work."""
    counted: Counter[str] = Counter()
    lock = threading.Lock()

    def count(name: str) -> None:
        with lock:
            counted[name] += 1

    connect = store.Store.connect

    def counting_connect(cls: type[store.Store], *args: Any, **kwargs: Any) -> store.Store:
        count("connect")
        return connect.__func__(cls, *args, **kwargs)  # type: ignore[attr-defined,no-any-return]

    def spy(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        async def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
            count(name)
            return await method(self, *args, **kwargs)

        return counting

    monkeypatch.setattr(store.Store, "connect", classmethod(counting_connect))
    spied = (
        (database.Database, "check_schema", "check_schema"),
        (attempts.Attempts, "heartbeat", "attempt_heartbeat"),
        (store.Store, "close", "close"),
    )
    for owner, attribute, name in spied:
        monkeypatch.setattr(owner, attribute, spy(name, getattr(owner, attribute)))
    return counted


def _as_the_attempt(monkeypatch: pytest.MonkeyPatch, attempt: worker.CurrentAttempt) -> None:
    monkeypatch.setenv("CORRAL_JOB_ID", str(attempt.job_id))
    monkeypatch.setenv("CORRAL_ATTEMPT", str(attempt.attempt_no))
    monkeypatch.setenv("CORRAL_FENCE", str(attempt.fence))


async def test_heartbeat_works_when_called_from_inside_a_running_loop(db_url: str) -> None:
    attempt = await _running(db_url)
    settings = config.Settings(database_url=db_url)

    def plain_function_of_an_async_program() -> datetime | None:
        return worker.heartbeat(attempt, settings)

    asyncio.get_running_loop()  # this test's own loop runs, as in any async program
    lease = plain_function_of_an_async_program()
    assert lease is not None, "the job has a lease, and the heartbeat renewed it"
    renewed = await _attempt(db_url, attempt)
    assert (renewed.state, renewed.lease_until) == (A.RUNNING, lease)


def test_keep_alive_sends_every_heartbeat_over_one_store(
    db_url: str, calls: Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    attempt = asyncio.run(_running(db_url))
    _as_the_attempt(monkeypatch, attempt)
    told: list[str] = []
    settings = config.Settings(database_url=db_url)
    before = Counter(calls)
    with worker.keep_alive(0.05, on_stale=lambda: told.append("stale"), settings=settings) as stale:
        eventually_sync(
            lambda: calls["attempt_heartbeat"] - before["attempt_heartbeat"] >= HEARTBEATS,
            what=f"{HEARTBEATS} heartbeats",
        )
        assert not stale.is_set()
    sent = calls - before
    assert sent["attempt_heartbeat"] >= HEARTBEATS
    assert (sent["connect"], sent["check_schema"]) == (1, 1), "one store for the whole block"
    assert sent["close"] == 1, "closed when the block ended"
    assert told == []
    assert asyncio.run(_attempt(db_url, attempt)).state == A.RUNNING


def test_keep_alive_stops_an_attempt_a_newer_one_replaced(
    db_url: str, calls: Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    attempt = asyncio.run(_running(db_url, superseded=True))
    _as_the_attempt(monkeypatch, attempt)
    told: list[str] = []
    settings = config.Settings(database_url=db_url)
    before = Counter(calls)
    with worker.keep_alive(0.05, on_stale=lambda: told.append("stale"), settings=settings) as stale:
        assert stale.wait(PATIENCE), "told it is stale"
        # Heartbeats stopped at the refusal: none more however many intervals pass.
        eventually_sync(lambda: (calls - before)["close"] == 1, what="the store closed")
    sent = calls - before
    assert told == ["stale"]
    assert (sent["attempt_heartbeat"], sent["connect"], sent["close"]) == (1, 1, 1)


def test_keep_alive_tries_again_while_the_store_cannot_be_opened(
    tmp_path: Path, calls: Counter[str], monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    url = f"sqlite:///{tmp_path / 'corral.db'}"
    unmigrated = config.Settings(database_url=url)
    _as_the_attempt(monkeypatch, worker.CurrentAttempt(1, 1, 1, "corral-1-1", None, None))
    caplog.set_level(logging.WARNING, logger="corral.worker")
    with worker.keep_alive(0.05, on_stale=lambda: None, settings=unmigrated):
        eventually_sync(lambda: calls["check_schema"] >= 3, what="three tries to open the store")
    assert calls["attempt_heartbeat"] == 0, "no heartbeat without a usable store"
    assert calls["connect"] == calls["close"] >= 3, "each failed open is closed again"
    assert "heartbeat failed, trying again in 0.05s" in caplog.text
    assert "corral db upgrade" in caplog.text
