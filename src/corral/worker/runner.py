"""`corral worker`: a long-running process that runs an App's Python tasks.

It registers itself (id, host, app version, and every task with the payload versions it
reads and their schemas), which queues again at once any parked job it reads; then it
claims due jobs of those tasks through the dispatcher's own fenced claim (pools, tenant
limits and events included) and runs each function, async ones on its event loop and
plain ones in its threads, at most `concurrency` at once. Every heartbeat_interval one
write says it is alive and renews the lease of each attempt it runs; an attempt the
store no longer has running (cancelled, or replaced by a newer one) is stopped.

Told to stop (SIGTERM, or `stop` set), it claims nothing more at once and no longer
counts as reading its tasks; it lets running functions finish for timeouts.drain_timeout;
then it calls the app's on_shutdown hooks and each run's, cancels what still runs (an
async function sees CancelledError, a plain one `ctx.stopping`), gives them the margin to
save a checkpoint, and hands each leftover back: its attempt superseded, "handed back at
shutdown", not charged, the job queued again with its checkpoint. A run that goes on
writing after that is refused by its fence once a newer attempt has started.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import json
import logging
import os
import socket
import threading
import traceback
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from corral import clock, config, errors, model, retry, store
from corral.store import DefaultLimits, Finish
from corral.worker.app import App, Task

log = logging.getLogger("corral.worker")
A, FC = model.AttemptState, model.FailureClass
T = TypeVar("T")


class PermanentError(Exception):
    """Raise it from a task when retrying cannot help: the job is quarantined at once."""


class Stopped(Exception):
    """Raise it from a task that saw `ctx.stopping` and saved its checkpoint: at shutdown
    its job is handed back, not charged, to resume elsewhere; after a cancel, nothing is
    recorded (the cancel was). Returning normally instead counts as done."""


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
    why: str = ""
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
            await self._db.checkpoint_save(
                job_id=self.job_id, fence=self.fence, state=state, now=self._clock.now()
            )

        await self._on_loop(save)

    async def load_checkpoint_async(self, default: Any = None) -> Any:
        """This job's newest checkpoint, whichever attempt saved it; `default` if none."""

        async def load() -> Any:
            assert self._db is not None
            found = await self._db.checkpoint_load(job_id=self.job_id)
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


@dataclass(slots=True)
class _Run:
    claimed: model.Claimed
    ctx: TaskContext
    task: asyncio.Task[None] | None = None
    handed_back: bool = False


class Worker:
    """One `corral worker` process's loop (see the module's doc)."""

    def __init__(
        self,
        app: App,
        *,
        db: store.Store,
        settings: config.Settings,
        clk: clock.Clock,
        concurrency: int = 16,
        queues: tuple[str, ...] = (),
        worker_id: str | None = None,
    ) -> None:
        if concurrency < 1:
            raise errors.ConfigError(f"--concurrency {concurrency}: must be at least 1")
        app.check()
        self.app = app
        self.db = db
        self.settings = settings
        self.t = settings.timeouts
        self.clock = clk
        self.concurrency = concurrency
        self.queues = queues
        host = socket.gethostname()
        self.id = worker_id or f"{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.host = host
        self.retry = retry.Retry.from_settings(settings)
        self.limits = DefaultLimits(self.t.attempt_deadline, self.t.lease_timeout)
        self._runs: dict[int, _Run] = {}  # running, by fence
        self._back: list[_Run] = []  # stopped at shutdown, unfinished: to hand back
        self._done: asyncio.Queue[Finish] = asyncio.Queue()
        self._freed = asyncio.Event()
        self._threads = ThreadPoolExecutor(
            max_workers=concurrency, thread_name_prefix="corral-task"
        )
        self.ran = 0  # attempts this worker ended, for its summary

    def info(self) -> model.Worker:
        now = self.clock.now()
        return model.Worker(
            id=self.id,
            app=self.app.name,
            app_version=self.app.version,
            host=self.host,
            pid=os.getpid(),
            queues=self.queues,
            concurrency=self.concurrency,
            state=model.WorkerState.RUNNING,
            started_at=now,
            last_seen_at=now,
            stopped_at=None,
            reads=tuple(self.app.reads()),
        )

    def _since(self) -> Any:
        return self.clock.now() - self.t.lease_timeout

    async def run(self, stop: asyncio.Event) -> None:
        """Register, claim and run until `stop` is set; then drain and hand back."""
        unparked = await self.db.worker_register(
            worker=self.info(), now=self.clock.now(), since=self._since()
        )
        reads = ", ".join(f"{r.task} v{r.version}" for r in self.app.reads())
        log.info(
            "worker %s (%s %s) registered: reads %s; concurrency %d%s; %d parked jobs released",
            self.id,
            self.app.name,
            self.app.version,
            reads or "nothing",
            self.concurrency,
            f"; queues {', '.join(self.queues)}" if self.queues else "",
            unparked,
        )
        beats = asyncio.create_task(self._beat_loop(stop))
        flush = asyncio.create_task(self._flush_loop())
        try:
            async with self.db.woken() as woke:
                await self._claim_loop(stop, woke)
            await self._drain()
        finally:
            beats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beats
            await self._done.join()
            flush.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flush
            self._threads.shutdown(wait=False, cancel_futures=True)
        parked = await self.db.worker_stop(
            worker_id=self.id, now=self.clock.now(), since=self._since()
        )
        log.info(
            "worker %s stopped: %d attempts ended here; %d jobs parked (no live worker reads them)",
            self.id,
            self.ran,
            parked,
        )

    # --- claiming ---------------------------------------------------------------------------

    def _reads(self) -> list[tuple[str, list[int]]]:
        return [(task.name, task.reads()) for task in self.app]

    async def _claim_loop(self, stop: asyncio.Event, woke: asyncio.Event) -> None:
        interval = self.t.dispatch_interval.total_seconds()
        while not stop.is_set():
            free = self.concurrency - len(self._runs)
            got = 0
            if free > 0:
                woke.clear()
                try:
                    claimed = await self.db.worker_claim(
                        worker_id=self.id,
                        reads=self._reads(),
                        queues=self.queues,
                        now=self.clock.now(),
                        limit=free,
                        limits=self.limits,
                        pools=self.settings.pools,
                        tenants=self.settings.tenant_caps,
                    )
                except errors.StoreError as exc:
                    log.warning("claim failed, trying again in %.1fs: %s", interval, exc)
                    claimed = []
                for c in claimed:
                    self._start(c)
                got = len(claimed)
            if got and got == free:
                continue  # more may be due: claim again as soon as a slot frees
            self._freed.clear()
            waits = [stop.wait(), woke.wait()] if free > got else [stop.wait(), self._freed.wait()]
            await _first(self.clock.sleep(interval), *waits)

    def _start(self, claimed: model.Claimed) -> None:
        job, attempt = claimed.job, claimed.attempt
        name, version = model.task_of(job.spec)
        ctx = TaskContext(
            job_id=job.id,
            attempt_no=attempt.attempt_no,
            fence=attempt.id,
            task=name,
            version=version,
            tenant=job.tenant,
            _db=self.db,
            _clock=self.clock,
            _loop=asyncio.get_running_loop(),
        )
        run = _Run(claimed, ctx)
        self._runs[attempt.id] = run
        run.task = asyncio.create_task(self._run_one(run), name=attempt.launch_name)

    # --- one run ---------------------------------------------------------------------------

    async def _run_one(self, run: _Run) -> None:
        job, attempt, ctx = run.claimed.job, run.claimed.attempt, run.ctx
        started = self.clock.monotonic()
        fresh: dict[str, Any] = {}
        try:
            task = self.app.get(ctx.task)
            value = task.read(ctx.version, _data_of(job.payload, ctx.task))
            value, fresh = await task.resolve(value, self._in_thread)
            if fresh:
                await self.db.event_note(
                    job_id=job.id,
                    attempt_id=attempt.id,
                    state=A.RUNNING,
                    reason=f"fresh values resolved: {', '.join(sorted(fresh))}",
                    now=self.clock.now(),
                    details={"fresh": model.redacted(_jsonable(fresh))},
                )
            left = _seconds_until(attempt.deadline_at, self.clock)
            async with asyncio.timeout(left):
                await self._call(task, value, ctx)
        except (asyncio.CancelledError, Stopped):
            if not ctx.stopping.is_set():
                raise
            if ctx.why == "shutdown":
                self._back.append(run)  # unfinished: _drain hands it back
            self._forget(run)  # (cancelled or replaced: the store already says so)
            return
        except TimeoutError:
            ctx.why = "timed out"
            ctx.stopping.set()
            self._end(
                run,
                _failed(
                    attempt.id,
                    "timed out: ran past its deadline",
                    FC.TRANSIENT,
                    started,
                    fresh,
                    self.clock,
                ),
            )
        except errors.StaleFence as exc:
            log.warning("%s: %s; its result is dropped", attempt.launch_name, exc)
            self._forget(run)
        except errors.InvalidInput as exc:  # the payload does not fit: no retry can help
            self._end(run, _failed(attempt.id, str(exc), FC.PERMANENT, started, fresh, self.clock))
        except PermanentError as exc:
            self._end(
                run, _failed(attempt.id, _said(exc), FC.PERMANENT, started, fresh, self.clock, exc)
            )
        except Exception as exc:  # a task's own failure: the job's retry policy decides
            self._end(run, _failed(attempt.id, _said(exc), None, started, fresh, self.clock, exc))
        else:
            if ctx.stopping.is_set() and ctx.why != "shutdown":
                self._forget(run)  # cancelled or replaced meanwhile: its end is not ours
                return
            self._end(
                run,
                Finish(
                    attempt.id,
                    A.SUCCEEDED,
                    None,
                    "returned",
                    output=_log(started, fresh, self.clock),
                ),
            )

    async def _call(self, task: Task[Any], value: Any, ctx: TaskContext) -> None:
        args = (value, ctx) if _takes_context(task.fn) else (value,)
        token = _current.set(ctx)
        try:
            if task.is_async:
                await task.fn(*args)
            else:
                await self._in_thread(lambda: task.fn(*args))
        finally:
            _current.reset(token)

    async def _in_thread(self, fn: Callable[[], T]) -> T:
        """Run `fn` in one of the worker's threads, with this task's context (its
        current_task(), current_attempt())."""
        context = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(self._threads, context.run, fn)

    def _end(self, run: _Run, finish: Finish) -> None:
        if not run.handed_back:  # else its attempt is over: a late end would be refused
            self._done.put_nowait(finish)
        self._forget(run)

    def _forget(self, run: _Run) -> None:
        self._runs.pop(run.ctx.fence, None)
        self._freed.set()

    async def _flush_loop(self) -> None:
        """Write ended attempts, as many at once as have ended meanwhile."""
        while True:
            batch = [await self._done.get()]
            while not self._done.empty():
                batch.append(self._done.get_nowait())
            try:
                await self._write(batch)
            finally:
                for _ in batch:
                    self._done.task_done()

    async def _write(self, batch: list[Finish]) -> None:
        pause = 0.5
        while True:
            try:
                await self.db.attempt_finish(finishes=batch, now=self.clock.now(), retry=self.retry)
                self.ran += len(batch)
                return
            except errors.StoreUnavailable as exc:
                # The leases of these attempts run on: recovery ends them if this never can.
                log.warning("recording %d ends failed, again in %.1fs: %s", len(batch), pause, exc)
                await self.clock.sleep(pause)
                pause = min(pause * 2, self.t.heartbeat_interval.total_seconds())

    # --- heartbeats -----------------------------------------------------------------------------

    async def _beat_loop(self, stop: asyncio.Event) -> None:
        every = self.t.heartbeat_interval.total_seconds()
        while True:
            await self.clock.sleep(every)
            await self.beat()

    async def beat(self) -> None:
        """One heartbeat: this worker is alive; its attempts' leases are renewed; runs the
        store no longer has running are stopped."""
        leases = {
            fence: run.claimed.attempt.lease_seconds or self.t.lease_timeout.total_seconds()
            for fence, run in self._runs.items()
            if not run.handed_back
        }
        try:
            state, stale = await self.db.worker_beat(
                worker_id=self.id, leases=leases, now=self.clock.now()
            )
        except errors.StoreError as exc:
            log.warning("heartbeat failed: %s", exc)
            return
        if state is None:  # forgotten (a long silence): say again who this worker is
            await self.db.worker_register(
                worker=self.info(), now=self.clock.now(), since=self._since()
            )
        for fence in stale:
            run = self._runs.get(fence)
            if run is not None:
                log.info(
                    "%s: cancelled, or replaced by a newer attempt: stopping it",
                    run.claimed.attempt.launch_name,
                )
                self._stop_run(run, "cancelled or replaced")
                self._forget(run)

    def _stop_run(self, run: _Run, why: str) -> None:
        run.ctx.why = why
        run.ctx.stopping.set()
        for hook in run.ctx._hooks:
            _call_hook(hook, run)
        if run.task is not None and self.app.get(run.ctx.task).is_async:
            run.task.cancel()

    # --- stopping ---------------------------------------------------------------------------

    async def _drain(self) -> None:
        if not self._runs:
            with contextlib.suppress(errors.StoreError):
                await self.db.worker_drain(worker_id=self.id, now=self.clock.now())
            return
        with contextlib.suppress(errors.StoreError):
            await self.db.worker_drain(worker_id=self.id, now=self.clock.now())
        drain = self.t.drain_timeout.total_seconds()
        log.info("draining: %d tasks running; they have %gs to finish", len(self._runs), drain)
        await self._until_done(drain)
        if not self._runs:
            return
        left = list(self._runs.values())
        log.info("%d tasks still running: asking them to checkpoint", len(left))
        for hook in self.app.shutdown_hooks:
            _call_hook(hook, None)
        for run in left:
            self._stop_run(run, "shutdown")
        await self._until_done(self.t.margin.total_seconds())
        await self._done.join()  # what finished meanwhile is recorded before the rest goes back
        # Those that stopped when asked, and those still running (a plain function's thread
        # cannot be stopped: its writes are refused by its fence once a newer attempt runs).
        left = [*self._back, *self._runs.values()]
        for run in left:
            run.handed_back = True
            self._forget(run)
        back = await self.db.attempt_hand_back(
            fences=[r.ctx.fence for r in left], now=self.clock.now()
        )
        log.info("handed back %d of %d unfinished tasks, not charged", len(back), len(left))

    async def _until_done(self, seconds: float) -> None:
        deadline = self.clock.monotonic() + seconds
        while self._runs and self.clock.monotonic() < deadline:
            self._freed.clear()
            await _first(self.clock.sleep(deadline - self.clock.monotonic()), self._freed.wait())


async def _first(*waits: Awaitable[Any]) -> None:
    """Wait until the first of `waits` is done; cancel the rest."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()


def _call_hook(hook: Callable[[], Any], run: _Run | None) -> None:
    try:
        result = hook()
        if inspect.isawaitable(result):
            with contextlib.suppress(AttributeError):
                result.close()  # type: ignore[attr-defined]
            log.error("an on_shutdown hook must be a plain function, not async: %r", hook)
    except Exception:
        log.exception("an on_shutdown hook failed%s", f" ({run.ctx.task})" if run else "")


def _data_of(payload: Any, task: str) -> Any:
    if not isinstance(payload, Mapping) or "data" not in payload:
        raise errors.InvalidInput(
            f"payload of task {task}: not an envelope {{task, version, data}}"
        )
    return payload["data"]


@functools.cache
def _takes_context(fn: Callable[..., Any]) -> bool:
    """Whether a task's function takes its TaskContext too (a second parameter): read once
    per function, not at every run."""
    return len(inspect.signature(fn).parameters) > 1


def _seconds_until(at: Any, clk: clock.Clock) -> float | None:
    if at is None:
        return None
    left: float = (at - clk.now()).total_seconds()
    return max(left, 0.0)


def _said(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _jsonable(values: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(dict(values), default=str))
    return out


def _log(
    started: float,
    fresh: Mapping[str, Any],
    clk: clock.Clock,
    exc: BaseException | None = None,
) -> model.RunLog:
    streams = []
    if fresh:
        text = json.dumps(model.redacted(_jsonable(fresh)), sort_keys=True)
        streams.append(model.Stream("fresh", text, len(text.encode())))
    if exc is not None:
        whole = "".join(traceback.format_exception(exc))
        text = whole[-model.STREAM_BYTES :]
        streams.append(model.Stream("traceback", text, len(whole.encode()), cut=text != whole))
    return model.RunLog(streams=tuple(streams), latency=clk.monotonic() - started)


def _failed(
    fence: int,
    why: str,
    cls: model.FailureClass | None,
    started: float,
    fresh: Mapping[str, Any],
    clk: clock.Clock,
    exc: BaseException | None = None,
) -> Finish:
    return Finish(
        fence,
        A.FAILED,
        None,
        why,
        failure_class=cls,
        message=why,
        output=_log(started, fresh, clk, exc),
    )


__all__ = ["PermanentError", "Stopped", "TaskContext", "Worker", "current_task", "in_task"]
