"""The time limits on corral's PostgreSQL connections, on the real server: what each
connection carries, what each limit does when it is hit, and how the error reads."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, create_engine, text

from corral import errors, model, store, timeouts
from corral.testing import FrozenClock
from tests.conftest import pg_empty
from tests.support.net import free_port

pytestmark = pytest.mark.postgres

LIMITS = {
    "database_connect_timeout": "2s",
    "database_tcp_timeout": "3s",
    "database_lock_timeout": "300ms",
    "database_statement_timeout": "1s",
    "database_idle_timeout": "1500ms",
    "database_transaction_timeout": "8s",
}


@pytest.fixture
def url(pg_url: str) -> str:
    pg_empty(pg_url)
    return pg_url


@pytest.fixture
async def db(url: str) -> AsyncIterator[store.Store]:
    s = store.Store.connect(url, timeouts=timeouts.Timeouts(**LIMITS))
    yield s
    await s.close()


@pytest.fixture
def row_lock(url: str) -> Iterator[Any]:
    """`hold(job_id)` locks a job's row from another connection until the test ends (or
    `release()`), as a client cut off in the middle of a transaction would."""
    engine = create_engine(url)
    conn = engine.connect()
    tx = conn.begin()

    class Hold:
        def __call__(self, job_id: int) -> None:
            conn.execute(text("SELECT id FROM jobs WHERE id = :id FOR UPDATE"), {"id": job_id})

        def release(self) -> None:
            if tx.is_active:
                tx.rollback()

    hold = Hold()
    yield hold
    hold.release()
    conn.close()
    engine.dispose()


async def submitted(db: store.Store) -> int:
    [(job_id, _)] = await db.jobs.submit(
        new=[model.NewJob(executor="noop", spec={})], now=FrozenClock().now()
    )
    return job_id


def show(conn: Connection) -> dict[str, str]:
    names = (
        "statement_timeout",
        "lock_timeout",
        "idle_in_transaction_session_timeout",
        "tcp_user_timeout",
        "tcp_keepalives_idle",
        "tcp_keepalives_interval",
        "tcp_keepalives_count",
    )
    return {n: conn.execute(text(f"SHOW {n}")).scalar_one() for n in names}


async def test_every_connection_carries_the_limits_on_both_ends(db: store.Store) -> None:
    assert await db.database.tx(show) == {
        "statement_timeout": "1s",
        "lock_timeout": "300ms",
        "idle_in_transaction_session_timeout": "1500ms",
        "tcp_user_timeout": "3000",  # ms; the server's end notices a silent client, too
        "tcp_keepalives_idle": "1",
        "tcp_keepalives_interval": "1",
        "tcp_keepalives_count": "2",
    }
    raw = db.database.engine.raw_connection()
    try:
        libpq = raw.dbapi_connection.info.get_parameters()  # type: ignore[union-attr]
    finally:
        raw.close()
    assert {k: libpq[k] for k in ("connect_timeout", "keepalives", "tcp_user_timeout")} == {
        "connect_timeout": "2",
        "keepalives": "1",
        "tcp_user_timeout": "3000",
    }


async def test_the_default_limits_are_on_when_none_are_given(url: str) -> None:
    db = store.Store.connect(url)
    try:
        found = await db.database.tx(show)
    finally:
        await db.close()
    assert (found["statement_timeout"], found["lock_timeout"]) == ("10s", "2s")


async def test_options_of_the_url_are_kept_and_its_own_timeouts_refused(url: str) -> None:
    db = store.Store.connect(url + "?options=-c%20search_path%3Dpublic%2Cpg_catalog")
    try:
        path = await db.database.tx(
            lambda conn: conn.execute(text("SHOW search_path")).scalar_one()
        )
        assert path == "public,pg_catalog"
        assert (await db.database.tx(show))["statement_timeout"] == "10s"
    finally:
        await db.close()
    with pytest.raises(errors.ConfigError, match="timeouts.database_connect_timeout"):
        store.Store.connect(url + "?connect_timeout=30")


async def test_a_lock_wait_longer_than_the_lock_timeout_fails_fast_naming_it(
    db: store.Store, row_lock: Any
) -> None:
    job_id = await submitted(db)
    row_lock(job_id)
    began = time.monotonic()
    with pytest.raises(errors.StoreError) as caught:
        await db.jobs.cancel(job_id=job_id, now=FrozenClock().now(), reason="test")
    assert time.monotonic() - began < 3
    assert not isinstance(caught.value, errors.StoreUnavailable)
    assert "job_cancel waited too long for a lock (timeouts.database_lock_timeout, 300ms)" in str(
        caught.value
    )
    row_lock.release()
    assert (await db.jobs.get(job_id=job_id)).state == model.JobState.QUEUED


async def test_a_hot_path_lock_wait_fails_fast_naming_it(db: store.Store, url: str) -> None:
    """The hot path's own connections carry the same limits, and their errors read alike:
    a settle that waits on a locked attempt longer than the lock timeout names it."""
    clock = FrozenClock()
    job_id = await submitted(db)
    [claimed] = await db.jobs.claim(now=clock.now(), limit=1, executors=["noop"])
    engine = create_engine(url)
    with engine.connect() as conn, conn.begin():
        conn.execute(
            text("SELECT id FROM attempts WHERE id = :id FOR UPDATE"), {"id": claimed.attempt.id}
        )
        began = time.monotonic()
        with pytest.raises(errors.StoreError) as caught:
            await db.attempts.settle(launched=[claimed.attempt.id], finishes=[], now=clock.now())
        assert time.monotonic() - began < 3
    engine.dispose()
    assert not isinstance(caught.value, errors.StoreUnavailable)
    assert "pg_settle waited too long for a lock (timeouts.database_lock_timeout, 300ms)" in str(
        caught.value
    )
    ran, _ = await db.attempts.settle(launched=[claimed.attempt.id], finishes=[], now=clock.now())
    assert ran == [claimed.attempt.id]
    assert (await db.jobs.get(job_id=job_id)).state == model.JobState.RUNNING


async def test_a_statement_longer_than_the_statement_timeout_is_stopped_naming_it(
    db: store.Store,
) -> None:
    def sleepy(conn: Connection) -> None:
        conn.execute(text("SELECT pg_sleep(10)"))

    began = time.monotonic()
    with pytest.raises(errors.StoreError, match=r"sleepy was cancelled \(timeouts.database_state"):
        await db.database.tx(sleepy)
    assert time.monotonic() - began < 5


async def test_a_client_idle_too_long_in_a_transaction_is_ended_by_the_server(
    db: store.Store,
) -> None:
    def dawdle(conn: Connection) -> None:
        conn.execute(text("SELECT 1"))
        time.sleep(3.5)  # past idle_in_transaction_session_timeout (1.5s): the server ends it
        conn.execute(text("SELECT 1"))

    with pytest.raises(errors.StoreError) as caught:
        await db.database.tx(dawdle)
    assert "dawdle stayed idle too long inside its transaction" in str(caught.value)
    assert "(timeouts.database_idle_timeout, 1.5s)" in str(caught.value)
    assert await db.database.tx(lambda conn: conn.execute(text("SELECT 2")).scalar_one()) == 2


async def test_a_connection_lost_mid_call_or_refused_is_unavailable(db: store.Store) -> None:
    def cut(conn: Connection) -> None:
        conn.execute(text("SELECT pg_terminate_backend(pg_backend_pid())"))

    with pytest.raises(errors.StoreUnavailable, match="cannot be reached"):
        await db.database.tx(cut)
    assert await db.database.tx(lambda conn: conn.execute(text("SELECT 3")).scalar_one()) == 3
    with pytest.raises(errors.StoreError) as caught:
        await db.database.tx(lambda conn: conn.execute(text("SELECT 1/0")))
    assert not isinstance(caught.value, errors.StoreUnavailable)  # a working server said no
    closed = store.Store.connect(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/test")
    try:
        with pytest.raises(errors.StoreUnavailable, match="Connection refused"):
            await closed.database.check_schema()
    finally:
        await closed.close()


async def test_a_call_past_the_backstop_is_given_up_with_one_line_and_rolled_back(
    url: str, row_lock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # Limits that do not nest (Timeouts alone is not checked): the lock wait outlasts the
    # backstop, as a silent network would, so that the backstop is what ends the call.
    db = store.Store.connect(
        url,
        timeouts=timeouts.Timeouts(
            database_transaction_timeout="500ms",
            database_statement_timeout="30s",
            database_lock_timeout="30s",
        ),
    )
    job_id = await submitted(db)
    row_lock(job_id)
    caplog.set_level(logging.INFO, logger="corral")
    began = time.monotonic()
    with pytest.raises(errors.StoreUnavailable) as caught:
        await db.jobs.cancel(job_id=job_id, now=FrozenClock().now(), reason="test")
    assert time.monotonic() - began < 3
    assert str(caught.value).endswith(
        "job_cancel got no answer in time (timeouts.database_transaction_timeout, 500ms); given up"
    )
    [line] = [r for r in caplog.records if r.name.startswith("corral")]
    assert (line.name, line.levelno) == ("corral.store", logging.WARNING)
    assert line.getMessage() == (
        "job_cancel: no answer from the database in time"
        " (timeouts.database_transaction_timeout, 500ms); given up"
    )
    # Its thread still waits for the lock. Once it gets it, the cancel it made is rolled
    # back rather than committed: nobody is waiting for its answer any more.
    threading.Timer(0.3, row_lock.release).start()
    await db.close()  # waits for the store's threads
    assert len([r for r in caplog.records if r.name.startswith("corral")]) == 1
    again = store.Store.connect(url)
    try:
        assert (await again.jobs.get(job_id=job_id)).state == model.JobState.QUEUED
    finally:
        await again.close()


async def test_calls_queued_behind_given_up_ones_are_given_up_too_then_work_again(
    url: str, row_lock: Any
) -> None:
    db = store.Store.connect(
        url,
        timeouts=timeouts.Timeouts(
            database_transaction_timeout="300ms",
            database_statement_timeout="30s",
            database_lock_timeout="30s",
        ),
    )
    try:
        job_id = await submitted(db)
        row_lock(job_id)
        now = FrozenClock().now()
        calls = [db.jobs.cancel(job_id=job_id, now=now, reason="test") for _ in range(7)]
        found = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(f, errors.StoreUnavailable) for f in found), found
        row_lock.release()
        # Five were running (the store's threads), two were still queued and never ran.
        assert await db.jobs.get(job_id=job_id) is not None  # the threads are free again
    finally:
        await db.close()
    again = store.Store.connect(url)
    try:
        assert (await again.jobs.get(job_id=job_id)).state == model.JobState.QUEUED
    finally:
        await again.close()
