"""Who is writing: the fence (and code version) a sink stamps on what an attempt writes."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from corral import config, errors, store
from corral.worker import current_attempt

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Writer:
    """The attempt a write comes from."""

    fence: int
    code_version: str | None = None


def writer(fence: int | None = None, code_version: str | None = None) -> Writer:
    """`fence` and `code_version` as given, else this process's attempt (CORRAL_FENCE,
    CORRAL_CODE_VERSION); ConfigError when neither says which attempt this is."""
    if fence is None:
        attempt = current_attempt()
        fence = attempt.fence
        code_version = code_version if code_version is not None else attempt.code_version
    if isinstance(fence, bool) or not isinstance(fence, int) or fence < 0:
        raise errors.InvalidInput(f"fence: must be a whole number >= 0, not {fence!r}")
    return Writer(fence, code_version)


def store_for(settings: config.Settings | None) -> store.Store:
    """corral's store, as these settings (default: corral.toml and CORRAL_*, which inside an
    attempt include CORRAL_DATABASE_URL) reach it."""
    settings = settings or config.Settings.load(check_chain=False)
    return store.Store.connect(settings.database_url, timeouts=settings.timeouts)


def run_blocking(work: Coroutine[Any, Any, T]) -> T:
    """Run `work` to its end for code that has no event loop; refuse inside one."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(work)
    work.close()
    raise errors.CorralError("this call blocks; in async code use its _async version")
