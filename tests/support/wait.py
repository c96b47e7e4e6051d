"""Waiting in tests without fixed sleeps: poll a condition until it holds, with a deadline
long enough for a shared machine at load 8 (a test that fails under load is a broken test).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

PATIENCE = 60.0
"""Seconds a test waits for something that takes milliseconds on an idle machine."""


async def eventually(
    check: Callable[[], Any | Awaitable[Any]],
    *,
    within: float = PATIENCE,
    every: float = 0.02,
    what: str = "the condition",
) -> Any:
    """Call `check` (plain or async) until it returns something truthy; return that.
    AssertionError naming `what` and the last value after `within` seconds."""
    ends = time.monotonic() + within
    while True:
        got = check()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return got
        if time.monotonic() > ends:
            raise AssertionError(f"{what} did not hold within {within:g}s (last: {got!r})")
        await asyncio.sleep(every)


def eventually_sync(
    check: Callable[[], Any],
    *,
    within: float = PATIENCE,
    every: float = 0.05,
    what: str = "the condition",
) -> Any:
    """`eventually` for code that is not async."""
    ends = time.monotonic() + within
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > ends:
            raise AssertionError(f"{what} did not hold within {within:g}s (last: {got!r})")
        time.sleep(every)
