"""Inside a job: which attempt this is, and heartbeats that keep its lease.

corral gives every attempt its identity in the environment (CORRAL_JOB_ID, CORRAL_ATTEMPT,
CORRAL_FENCE, ...). A job whose policy says `heartbeat: true` must send a heartbeat at
least every lease_timeout (CORRAL_HEARTBEAT_INTERVAL says how often to aim for); if it
goes quiet, corral treats the attempt as unknown and applies the job's policy. A heartbeat
from an attempt that a newer one has replaced is refused with StaleFence: stop then.

    from corral.worker import keep_alive

    with keep_alive():          # a heartbeat every CORRAL_HEARTBEAT_INTERVAL, in a thread
        do_the_work()
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

from corral import client, config, errors, runtime

log = logging.getLogger("corral.worker")


@dataclass(frozen=True, slots=True)
class CurrentAttempt:
    """The attempt this process runs as, read from its CORRAL_* environment."""

    job_id: int
    attempt_no: int
    fence: int
    launch_name: str | None
    tenant: str | None
    heartbeat_interval: float | None
    code_version: str | None = None  # CORRAL_CODE_VERSION: what the sinks stamp on writes


def current_attempt(env: Mapping[str, str] | None = None) -> CurrentAttempt:
    """This process's attempt; ConfigError when it was not launched by corral."""
    env = os.environ if env is None else env
    try:
        interval = env.get("CORRAL_HEARTBEAT_INTERVAL")
        return CurrentAttempt(
            job_id=int(env["CORRAL_JOB_ID"]),
            attempt_no=int(env["CORRAL_ATTEMPT"]),
            fence=int(env["CORRAL_FENCE"]),
            launch_name=env.get("CORRAL_LAUNCH_NAME"),
            tenant=env.get("CORRAL_TENANT"),
            heartbeat_interval=float(interval) if interval else None,
            code_version=env.get("CORRAL_CODE_VERSION") or None,
        )
    except KeyError as exc:
        raise errors.ConfigError(
            f"{exc.args[0]} is not set: this is not running as a corral attempt"
        ) from None
    except ValueError as exc:
        raise errors.ConfigError(f"a CORRAL_* variable is not a number: {exc}") from None


async def heartbeat_async(
    attempt: CurrentAttempt | None = None, settings: config.Settings | None = None
) -> datetime | None:
    """Send one heartbeat; returns when the lease now ends (None: the job has no lease).
    Raises StaleFence when a newer attempt replaced this one."""
    attempt = attempt or current_attempt()
    settings = settings or config.Settings.load(check_chain=False)
    async with runtime.opened(settings, executors={}) as rt:
        c = client.Client(store=rt.store, executors={}, settings=settings, clock=rt.clock)
        return await c.heartbeat(attempt.job_id, attempt.fence)


def heartbeat(
    attempt: CurrentAttempt | None = None, settings: config.Settings | None = None
) -> datetime | None:
    """heartbeat_async, for code that is not async."""
    return asyncio.run(heartbeat_async(attempt, settings))


def _stop_this_process() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


@contextmanager
def keep_alive(
    interval: float | None = None,
    *,
    on_stale: Callable[[], None] = _stop_this_process,
    settings: config.Settings | None = None,
) -> Iterator[threading.Event]:
    """Send heartbeats from a thread while the block runs: one at once, then every
    `interval` seconds (default CORRAL_HEARTBEAT_INTERVAL, else 10). When corral refuses
    one because a newer attempt replaced this one, `on_stale` runs (default: SIGTERM to
    this process) and the heartbeats stop. Yields an Event set once this attempt is stale.
    A heartbeat that fails for another reason is logged and tried again next interval."""
    attempt = current_attempt()
    every = interval or attempt.heartbeat_interval or 10.0
    stop, stale = threading.Event(), threading.Event()

    def beat() -> None:
        while True:
            try:
                heartbeat(attempt, settings)
            except errors.StaleFence as exc:
                log.error("%s", exc)
                stale.set()
                on_stale()
                return
            except errors.CorralError as exc:
                log.warning("heartbeat failed, trying again in %gs: %s", every, exc)
            if stop.wait(every):
                return

    thread = threading.Thread(target=beat, name="corral-heartbeat", daemon=True)
    thread.start()
    try:
        yield stale
    finally:
        stop.set()
        thread.join(timeout=every)


__all__ = ["CurrentAttempt", "current_attempt", "heartbeat", "heartbeat_async", "keep_alive"]
