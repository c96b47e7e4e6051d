"""A running task's context: which attempt it is, whether it is asked to stop and why, and
its job's fenced checkpoint. `current_task()` gives it inside a task a `corral worker`
runs (corral.worker.runner); a task whose function takes a second parameter gets it there
too. Its checkpoint calls run on the worker's event loop, where the store's connections
live, whichever loop or thread they are made from.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import threading
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from corral import clock, errors, model, store

T = TypeVar("T")


class StopReason(StrEnum):
    """Why a run was asked to stop (TaskContext.why)."""

    SHUTDOWN = "shutdown"  # the worker was told to stop: hand it back, not charged
    CANCELLED = "cancelled or replaced"  # the store no longer has its attempt running
    DEADLINE = "timed out"  # its attempt's deadline passed


@dataclass(slots=True)
class TaskContext:
    """What a running task may know and do: which attempt it is, whether it is asked to
    stop, and its job's fenced checkpoint. `current_task()` gives it inside a task; a task
    whose function takes a second parameter gets it there too."""

    job_id: int
    attempt_no: int
    fence: int
    task: str
    version: int
    tenant: str
    stopping: threading.Event = field(default_factory=threading.Event)
    """Set when the worker is stopping (or the attempt was cancelled or replaced): save a
    checkpoint and return, or raise."""
    why: StopReason | None = None
    _db: store.Store | None = None
    _clock: clock.Clock | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _hooks: list[Callable[[], Any]] = field(default_factory=list)

    @property
    def attempt(self) -> Any:
        from corral.worker import CurrentAttempt

        return CurrentAttempt(
            job_id=self.job_id,
            attempt_no=self.attempt_no,
            fence=self.fence,
            launch_name=model.launch_name(self.job_id, self.attempt_no),
            tenant=self.tenant,
            heartbeat_interval=None,
        )

    def on_shutdown(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        """Call `fn` (sync, from the worker's loop: keep it short) when this run is asked
        to stop, before it is cancelled."""
        self._hooks.append(fn)
        return fn

    async def save_checkpoint_async(self, state: Any) -> None:
        """Keep `state` (JSON) as this job's checkpoint; StaleFence once a newer attempt
        exists or has saved one: stop then."""
        try:
            json.dumps(state)
        except (TypeError, ValueError) as exc:
            raise errors.InvalidInput(f"checkpoint state: must be JSON: {exc}") from None

        async def save() -> None:
            assert self._db is not None
            assert self._clock is not None
            await self._db.sinks.checkpoint_save(
                job_id=self.job_id, fence=self.fence, state=state, now=self._clock.now()
            )

        await self._on_loop(save)

    async def load_checkpoint_async(self, default: Any = None) -> Any:
        """This job's newest checkpoint, whichever attempt saved it; `default` if none."""

        async def load() -> Any:
            assert self._db is not None
            found = await self._db.sinks.checkpoint_load(job_id=self.job_id)
            return default if found is None else found[1]

        return await self._on_loop(load)

    def save_checkpoint(self, state: Any) -> None:
        """save_checkpoint_async, from a plain (sync) task's thread."""
        self._from_thread(self.save_checkpoint_async(state))

    def load_checkpoint(self, default: Any = None) -> Any:
        """load_checkpoint_async, from a plain (sync) task's thread."""
        return self._from_thread(self.load_checkpoint_async(default))

    async def _on_loop(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run `make()` on the worker's loop (the store's connections live there), awaited
        from whichever loop calls."""
        assert self._loop is not None
        if asyncio.get_running_loop() is self._loop:
            return await make()
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(make(), self._loop))

    def _from_thread(self, work: Coroutine[Any, Any, T]) -> T:
        assert self._loop is not None
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run_coroutine_threadsafe(work, self._loop).result()
        work.close()
        raise errors.CorralError("this call blocks; in an async task use its _async version")


_current: contextvars.ContextVar[TaskContext | None] = contextvars.ContextVar(
    "corral_task", default=None
)


def current_task() -> TaskContext:
    """The running task's context; ConfigError outside a task a worker runs."""
    ctx = _current.get()
    if ctx is None:
        raise errors.ConfigError("current_task(): not inside a task that a corral worker runs")
    return ctx


def in_task() -> TaskContext | None:
    """The running task's context, or None outside one."""
    return _current.get()


@contextlib.contextmanager
def inside(ctx: TaskContext) -> Iterator[None]:
    """Make `ctx` the running task's context for the block: a task's call."""
    token = _current.set(ctx)
    try:
        yield
    finally:
        _current.reset(token)


__all__ = ["StopReason", "TaskContext", "current_task", "in_task", "inside"]
