"""Inside a job: which attempt this is, and heartbeats that keep its lease; and Python
tasks run by `corral worker` (corral.worker.app, corral.worker.runner; a running task's
context in corral.worker.context).

corral gives every attempt its identity in the environment (CORRAL_JOB_ID, CORRAL_ATTEMPT,
CORRAL_FENCE, ...). A job whose policy says `heartbeat: true` must send a heartbeat at
least every lease_timeout (CORRAL_HEARTBEAT_INTERVAL says how often to aim for); if it
goes quiet, corral treats the attempt as unknown and applies the job's policy. A heartbeat
from an attempt that a newer one has replaced is refused with StaleFence: stop then.

    from corral.worker import keep_alive

    with keep_alive():          # a heartbeat every CORRAL_HEARTBEAT_INTERVAL, in a thread
        do_the_work()           # (over one store, opened once for the block)
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from corral import client, config, errors, runtime, store
from corral.worker.api import ApiReach, AttemptApi, api_reach
from corral.worker.app import App, Fresh, Pinned, Task, load_app
from corral.worker.context import TaskContext, current_task, in_task
from corral.worker.runner import Worker

log = logging.getLogger("corral.worker")
T = TypeVar("T")


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
    """This process's attempt (inside a task a `corral worker` runs: that task's attempt);
    ConfigError when it was not launched by corral."""
    if env is None and (task := in_task()) is not None:
        found: CurrentAttempt = task.attempt
        return found
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
    if (reach := own_api(attempt.fence)) is not None:
        async with AttemptApi(reach) as api:
            return await api.heartbeat()
    if os.environ.get(IN_A_POD) and not os.environ.get("CORRAL_DATABASE_URL"):
        raise errors.ConfigError(
            "this job runs on Kubernetes and corral gave it no way to reach it (no"
            " CORRAL_API_URL): a pod reaches corral only through its API; set api_url in"
            " corral's settings, and its jobs get CORRAL_API_URL and an attempt token"
        )
    settings = settings or config.Settings.load(check_chain=False)
    # No revision check: the corral that launched this job runs on this schema, and the
    # heartbeat's one statement is all a job should pay for each beat.
    db = store.Store.connect(settings.database_url, timeouts=settings.timeouts)
    await db.database.check_schema(revision=False)
    async with runtime.opened(settings, executors={}, db=db) as rt:
        c = client.Client(store=rt.store, executors={}, settings=settings, clock=rt.clock)
        return await c.heartbeat(attempt.job_id, attempt.fence)


IN_A_POD = "KUBERNETES_SERVICE_HOST"
"""Set by the kubelet in every container: this process runs in a pod."""


def own_api(fence: int | None = None) -> ApiReach | None:
    """corral's API and this process's attempt token, when corral gave it both and the
    call is for this process's own attempt (`fence`, or no fence named): a token is good
    for its own attempt only. None: reach the store instead."""
    reach = api_reach()
    if reach is None or fence is None:
        return reach
    try:
        return reach if current_attempt().fence == fence else None
    except errors.ConfigError:
        return None


def heartbeat(
    attempt: CurrentAttempt | None = None, settings: config.Settings | None = None
) -> datetime | None:
    """heartbeat_async, for code that is not async. Called from inside a running event
    loop (a plain function of an async program), it runs on a private loop in a thread of
    its own, since asyncio.run refuses to nest; the caller's loop waits meanwhile, as it
    does for any blocking call."""
    return _run_apart(lambda: heartbeat_async(attempt, settings))


def _run_apart(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run the coroutine `make()` to its end on a fresh event loop: in this thread, or in
    a thread of its own when this one already runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="corral-heartbeat") as apart:
        return apart.submit(lambda: asyncio.run(make())).result()


def _stop_this_process() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


CLOSE_WAIT = 10.0
"""Seconds the end of a keep_alive block waits for a heartbeat in flight and the store's
close before it goes on (the heartbeat thread is a daemon: it never holds up an exit)."""


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
    A heartbeat that fails for another reason is logged and tried again next interval.

    The store is opened once for the whole block (one schema check, one connection pool)
    on the thread's own event loop, every heartbeat goes over it, and it is closed when
    the block ends."""
    attempt = current_attempt()
    beats = _Heartbeats(
        attempt,
        settings or config.Settings.load(check_chain=False),
        every=interval or attempt.heartbeat_interval or 10.0,
        on_stale=on_stale,
    )
    thread = threading.Thread(target=beats.run, name="corral-heartbeat", daemon=True)
    thread.start()
    try:
        yield beats.stale
    finally:
        beats.stopping.set()
        thread.join(timeout=CLOSE_WAIT)


class _Heartbeats:
    """keep_alive's thread: an event loop and a store for the life of the block."""

    def __init__(
        self,
        attempt: CurrentAttempt,
        settings: config.Settings,
        *,
        every: float,
        on_stale: Callable[[], None],
    ) -> None:
        self.attempt = attempt
        self.settings = settings
        self.every = every
        self.on_stale = on_stale
        self.stale = threading.Event()
        self.stopping = threading.Event()

    def run(self) -> None:
        asyncio.run(self._keep())

    async def _keep(self) -> None:
        """Open the API or the store and beat over it until stopped or stale. A store that
        cannot be opened (the database is down) is tried again next interval, as a failed
        beat is."""
        if (reach := own_api(self.attempt.fence)) is not None:
            async with AttemptApi(reach) as api:
                await self._beat(api.heartbeat)
            return
        while True:
            try:
                async with runtime.opened(self.settings, executors={}) as rt:
                    c = client.Client(
                        store=rt.store, executors={}, settings=self.settings, clock=rt.clock
                    )
                    await self._beat(
                        functools.partial(c.heartbeat, self.attempt.job_id, self.attempt.fence)
                    )
                    return
            except errors.CorralError as exc:
                log.warning("heartbeat failed, trying again in %gs: %s", self.every, exc)
            if self.stale.is_set() or await self._wait():
                return

    async def _beat(self, beat: Callable[[], Awaitable[object]]) -> None:
        while True:
            try:
                await beat()
            except errors.StaleFence as exc:
                log.error("%s", exc)
                self.stale.set()
                self.on_stale()
                return
            except errors.CorralError as exc:
                log.warning("heartbeat failed, trying again in %gs: %s", self.every, exc)
            if await self._wait():
                return

    async def _wait(self) -> bool:
        """Wait one interval, or less when the block ends; True when it has ended."""
        return await asyncio.to_thread(self.stopping.wait, self.every)


__all__ = [
    "App",
    "CurrentAttempt",
    "Fresh",
    "Pinned",
    "Task",
    "TaskContext",
    "Worker",
    "current_attempt",
    "current_task",
    "heartbeat",
    "heartbeat_async",
    "in_task",
    "keep_alive",
    "load_app",
    "own_api",
]
