"""Helpers for testing code that uses corral: a clock that only moves when told to."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta


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
