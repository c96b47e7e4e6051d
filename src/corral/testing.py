"""Helpers for testing code that uses corral: clocks that only move when told to, and
the time-limit chain check for a deployment's own CI."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

from corral import config, timeouts


class FrozenClock:
    """A Clock for tests: `now` stands still until `advance`; `sleep` advances time at once."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._mono = 0.0

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        self._now += timedelta(seconds=seconds)
        self._mono += seconds

    async def sleep(self, seconds: float) -> None:
        self.advance(seconds)
        await asyncio.sleep(0)


class PausedClock(FrozenClock):
    """A FrozenClock whose `sleep` does not move time: it waits a moment of real time (at
    most `pause` seconds) and returns. For running corral's loops in a test: the loops'
    own sleeps (a poll every observe_interval, a tick every dispatch_interval) then cannot
    push time past a deadline or a grace however often they run on a slow machine, and only
    the test's `advance` moves it."""

    def __init__(self, start: datetime | None = None, *, pause: float = 0.01) -> None:
        super().__init__(start)
        self._pause = pause

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(min(max(seconds, 0.0), self._pause))


def assert_timeouts_nest(
    settings: config.Settings | None = None, *, config_file: Path | None = None
) -> None:
    """Fail (AssertionError, one line per broken link) unless every time limit nests inside
    the one around it with the margin. With no `settings`, reads `config_file` (default
    ./corral.toml) and the CORRAL_* environment, as corral itself would."""
    if settings is None:
        settings = config.Settings.load(config_file, check_chain=False)
    broken = timeouts.chain_violations(settings)
    assert not broken, "time limits do not nest:\n" + "\n".join(broken)
