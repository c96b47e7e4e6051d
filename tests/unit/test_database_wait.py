"""At start, the long-running loops wait for a database they cannot reach: growing pauses
of clock time, one log line a try, up to timeouts.database_wait; then the last error. A
schema out of date fails at once. (That one-shot commands do not wait is shown with the
real command, in tests/acceptance/test_database_wait.py.)"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from corral import config, errors, runtime, store, timeouts
from corral.store import database
from corral.testing import FrozenClock
from tests.support.noop import NoopExecutor

UNREACHABLE = "database postgresql+psycopg://corral@127.0.0.1:1/corral cannot be reached: refused"


@pytest.fixture
def settings(tmp_path: Path) -> config.Settings:
    url = f"sqlite:///{tmp_path / 'corral.db'}"
    db = store.Store.connect(url)
    asyncio.run(db.database.migrate())
    asyncio.run(db.close())
    return config.Settings(database_url=url, state_dir=tmp_path / "state")


class Schema:
    """Database.check_schema, replaced: raises each of `outcomes` in turn (None: passes), then
    passes; notes the clock time of each try in `tries`, and calls `on_try` with its number."""

    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        clk: FrozenClock,
        *outcomes: Exception | None,
        on_try: Callable[[int], None] | None = None,
    ) -> None:
        self.clock, self.left, self.on_try = clk, list(outcomes), on_try
        self.tries: list[float] = []
        monkeypatch.setattr(database.Database, "check_schema", self.check)

    async def check(self) -> None:
        self.tries.append(self.clock.monotonic())
        if self.on_try is not None:
            self.on_try(len(self.tries))
        if self.left and (outcome := self.left.pop(0)) is not None:
            raise outcome


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "corral.runtime"]


def expected_tries(patience: float) -> list[float]:
    """When the tries happen: at once, then after 0.5s, 1s, 2s, ... at most 10s, the last
    one exactly at `patience`."""
    at, tries, n = 0.0, [0.0], 1
    while at < patience:
        at = min(at + runtime.pause_after(n), patience)
        tries.append(at)
        n += 1
    return tries


def test_the_pause_grows_from_half_a_second_and_stops_at_ten() -> None:
    assert [runtime.pause_after(n) for n in range(1, 9)] == [0.5, 1, 2, 4, 8, 10, 10, 10]
    assert runtime.pause_after(10_000) == 10


async def test_serve_gives_up_after_database_wait_of_clock_time_with_a_line_a_try(
    settings: config.Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="corral")
    clk = FrozenClock()
    tries = Schema(monkeypatch, clk, *[errors.StoreUnavailable(UNREACHABLE)] * 1000).tries
    ready = []

    async def on_ready(rt: runtime.Runtime) -> None:
        ready.append(rt)

    with pytest.raises(errors.StoreUnavailable) as caught:
        await runtime.serve(
            settings,
            asyncio.Event(),
            executors={"noop": NoopExecutor()},
            clk=clk,
            on_ready=on_ready,
        )
    assert clk.monotonic() == 300  # timeouts.database_wait, 5m by default
    assert tries == expected_tries(300)
    assert len(tries) == 35
    said = lines(caplog)
    assert len(said) == len(tries)  # one line a try
    assert (
        said[0]
        == f"database unreachable (try 1, waited 0.0s of 5m): {UNREACHABLE}; trying again in 0.5s"
    )
    assert (
        said[1]
        == f"database unreachable (try 2, waited 0.5s of 5m): {UNREACHABLE}; trying again in 1.0s"
    )
    assert said[6].endswith("; trying again in 10.0s")
    assert said[-2].endswith(
        "(try 34, waited 295.5s of 5m): " + UNREACHABLE + "; trying again in 4.5s"
    )
    assert said[-1] == (
        f"database unreachable (try 35, waited 300.0s of 5m): {UNREACHABLE}; giving up"
        " (timeouts.database_wait)"
    )
    assert str(caught.value) == f"{UNREACHABLE} (tried 35 times in 5m, timeouts.database_wait)"
    assert not ready


async def test_serve_runs_once_the_database_answers(
    settings: config.Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="corral")
    clk = FrozenClock()
    tries = Schema(monkeypatch, clk, *[errors.StoreUnavailable(UNREACHABLE)] * 3).tries
    stop = asyncio.Event()

    async def on_ready(rt: runtime.Runtime) -> None:
        stop.set()

    settings = settings.model_copy(update={"timeouts": timeouts.Timeouts(database_wait="10s")})
    await asyncio.wait_for(
        runtime.serve(
            settings, stop, executors={"noop": NoopExecutor()}, clk=clk, on_ready=on_ready
        ),
        timeout=30,
    )
    assert stop.is_set()
    assert tries == [0, 0.5, 1.5, 3.5]
    assert [s.split(":")[0] for s in lines(caplog)] == [
        "database unreachable (try 1, waited 0.0s of 10s)",
        "database unreachable (try 2, waited 0.5s of 10s)",
        "database unreachable (try 3, waited 1.5s of 10s)",
    ]


async def test_a_stop_while_waiting_ends_the_wait_without_an_error(
    settings: config.Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="corral")
    stop = asyncio.Event()
    clk = FrozenClock()
    failing = [errors.StoreUnavailable(UNREACHABLE)] * 3
    tries = Schema(monkeypatch, clk, *failing, on_try=lambda n: n == 2 and stop.set()).tries
    ready: list[Any] = []

    async def on_ready(rt: runtime.Runtime) -> None:
        ready.append(rt)

    await runtime.serve(
        settings, stop, executors={"noop": NoopExecutor()}, clk=clk, on_ready=on_ready
    )
    assert (tries, ready) == ([0, 0.5], [])  # SIGTERM came during the second try
    assert lines(caplog)[-1] == "stopped while waiting for the database"


async def test_a_schema_out_of_date_ends_the_wait_at_once(
    settings: config.Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="corral")
    clk = FrozenClock()
    outcomes = (errors.StoreUnavailable(UNREACHABLE), errors.SchemaOutOfDate("run upgrade"))
    tries = Schema(monkeypatch, clk, *outcomes).tries
    with pytest.raises(errors.SchemaOutOfDate):
        await runtime.serve(settings, asyncio.Event(), executors={"noop": NoopExecutor()}, clk=clk)
    assert tries == [0, 0.5]  # waited for the server; not for an upgrade nobody is doing
    assert len(lines(caplog)) == 1
