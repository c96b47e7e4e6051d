"""How a worker calls a task's function: an async one on its event loop, a plain one in
one of its threads (at most its concurrency at once), each inside the task's context
(current_task(), current_attempt()). A plain function's thread cannot be stopped: a run
keeps it, and a worker holds its slot until it returns. Also the run's record, its
payload's data, and the on_shutdown hooks a stop calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from corral import errors, model
from corral.worker import context
from corral.worker.app import Task

log = logging.getLogger("corral.worker")
T = TypeVar("T")


@dataclass(slots=True)
class Run:
    """One claimed attempt a worker runs, and where its function runs."""

    claimed: model.Claimed
    ctx: context.TaskContext
    task: asyncio.Task[None] | None = None
    thread: Future[Any] | None = None  # a plain function's, while it runs
    started: float = 0.0  # clock.monotonic()
    ended: bool = False  # its end is recorded, or it was handed back


class Calls:
    """The worker's threads, and the call of each task's function."""

    def __init__(self, concurrency: int) -> None:
        self._threads = ThreadPoolExecutor(
            max_workers=concurrency, thread_name_prefix="corral-task"
        )

    def shutdown(self) -> None:
        """Let the threads go: what still runs is not waited for."""
        self._threads.shutdown(wait=False, cancel_futures=True)

    async def call(self, task: Task[Any], value: Any, ctx: context.TaskContext, run: Run) -> Any:
        """Call the task's function on `value` (and its context, if it takes one) inside
        the task's context: an async one on this loop, a plain one in a thread. Returns
        what the function returned."""
        args = (value, ctx) if takes_context(task.fn) else (value,)
        with context.inside(ctx):
            if task.is_async:
                return await task.fn(*args)
            return await self.in_thread(lambda: task.fn(*args), run)

    async def in_thread(self, fn: Callable[[], T], run: Run | None = None) -> T:
        """Run `fn` in one of the worker's threads, with this task's context (its
        current_task(), current_attempt()); `run`: the run whose function it is, which
        holds its slot while the thread runs."""
        copied = contextvars.copy_context()
        thread = self._threads.submit(copied.run, fn)
        if run is not None:
            run.thread = thread
        return await asyncio.wrap_future(thread)


def back_on(
    loop: asyncio.AbstractEventLoop, call: Callable[[Future[Any]], None], thread: Future[Any]
) -> None:
    """`call(thread)` on the worker's loop, from the thread's end; nothing once the loop has
    closed (the worker has stopped)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(call, thread)


def call_hook(hook: Callable[[], Any], run: Run | None) -> None:
    """Call an on_shutdown hook (of the app, or of `run`); what it raises is logged."""
    try:
        result = hook()
        if inspect.isawaitable(result):
            with contextlib.suppress(AttributeError):
                result.close()  # type: ignore[attr-defined]
            log.error("an on_shutdown hook must be a plain function, not async: %r", hook)
    except Exception:
        log.exception("an on_shutdown hook failed%s", f" ({run.ctx.task})" if run else "")


def data_of(payload: Any, task: str) -> Any:
    """The data of a task's payload envelope {task, version, data}; InvalidInput if not one."""
    if not isinstance(payload, Mapping) or "data" not in payload:
        raise errors.InvalidInput(
            f"payload of task {task}: not an envelope {{task, version, data}}"
        )
    return payload["data"]


@functools.cache
def takes_context(fn: Callable[..., Any]) -> bool:
    """Whether a task's function takes its TaskContext too (a second parameter): read once
    per function, not at every run."""
    return len(inspect.signature(fn).parameters) > 1
