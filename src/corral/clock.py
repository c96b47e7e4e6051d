"""The one place corral reads time: a Clock is passed to everything that needs `now`.

Tests pass a FrozenClock (corral.testing) and move time by hand; nothing else in corral
calls datetime.now() or time.time().
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    """A source of wall time (for the store) and monotonic time (for intervals)."""

    def now(self) -> datetime:
        """The current UTC time, timezone-aware."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back, for measuring intervals."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait for `seconds` of this clock's time."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


async def sleep_or_stop(clock: Clock, stop: asyncio.Event, seconds: float) -> bool:
    """Sleep `seconds` of clock time, waking early when `stop` is set. True if stopped."""
    sleeper = asyncio.ensure_future(clock.sleep(seconds))
    waiter = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({sleeper, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        sleeper.cancel()
        waiter.cancel()
    return stop.is_set()
