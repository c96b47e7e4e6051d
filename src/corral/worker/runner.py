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
import collections
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
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from corral import clock, config, errors, loops, model, retry, store
from corral.store import DefaultLimits, Finish
from corral.worker.app import App, Task

log = logging.getLogger("corral.worker")
A, FC = model.AttemptState, model.FailureClass
T = TypeVar("T")


GATHER = 0.05
"""Seconds a claim waits for more slots to free while some are busy (see _claim_loop)."""


DEADLINE_SWEEP = 0.5
"""Seconds (of the worker's clock) between two looks for runs past their deadline."""

SHORT_RUN = 0.1
"""Seconds: while runs take less on average, a worker holds jobs ready (see Worker._room)."""


class StopReason(StrEnum):
    """Why a run was asked to stop (TaskContext.why)."""

    SHUTDOWN = "shutdown"  # the worker was told to stop: hand it back, not charged
    CANCELLED = "cancelled or replaced"  # the store no longer has its attempt running
    DEADLINE = "timed out"  # its attempt's deadline passed


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


@dataclass(slots=True)
class _Run:
    claimed: model.Claimed
    ctx: TaskContext
    task: asyncio.Task[None] | None = None
    thread: Future[Any] | None = None  # a plain function's, while it runs
    started: float = 0.0  # clock.monotonic()
    ended: bool = False  # its end is recorded, or it was handed back


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
        prefetch: int | None = None,
    ) -> None:
        if concurrency < 1:
            raise errors.ConfigError(f"--concurrency {concurrency}: must be at least 1")
        prefetch = 4 * concurrency if prefetch is None else prefetch
        if prefetch < 0:
            raise errors.ConfigError(f"--prefetch {prefetch}: must be at least 0")
        app.check()
        self.app = app
        self.db = db
        self.settings = settings
        self.t = settings.timeouts
        self.clock = clk
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.queues = queues
        host = socket.gethostname()
        self.id = worker_id or f"{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.host = host
        self.retry = retry.Retry.from_settings(settings)
        self.limits = DefaultLimits(self.t.attempt_deadline, self.t.lease_timeout)
        self._runs: dict[int, _Run] = {}  # running, by fence
        # Claimed ahead (while tasks are short, see _room), started as slots free: a slot
        # that frees takes the next at once, with no round trip to the store.
        self._ready: collections.deque[model.Claimed] = collections.deque()
        self._run_time = 0.0  # seconds a run takes, a moving average
        self._draining = False
        self._stop = asyncio.Event()  # run()'s
        self._back: list[_Run] = []  # stopped at shutdown, unfinished: to hand back
        # Threads of plain functions whose attempt ended (a deadline, a cancel) while they
        # run on: Python cannot stop a thread, so each keeps its slot until it returns.
        self._holding: set[Future[Any]] = set()
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
        self._stop = stop
        unparked = await self.db.workers.register(
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
        beats = asyncio.create_task(self._beat_loop())
        deadlines = asyncio.create_task(self._deadline_loop())
        flush = asyncio.create_task(self._flush_loop())
        pulse = loops.Service(self.db, self.settings, self.clock).pulse(
            kind="worker", runs=(loops.WORKER,), executors=(model.PYTHON,)
        )
        try:
            async with pulse.beating():
                async with self.db.database.woken() as woke:
                    await self._claim_loop(stop, woke)
                await self._drain()
        finally:
            for loop_task in (beats, deadlines):
                loop_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await loop_task
            await self._done.join()
            flush.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flush
            self._threads.shutdown(wait=False, cancel_futures=True)
        parked = await self.db.workers.stop(
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
        """Claim as slots free: a claim waits (at most GATHER) until half of what the worker
        takes at once (_capacity) is free when some still run, so that each of its round
        trips takes a batch, not the one job the first slot to free would take."""
        interval = self.t.dispatch_interval.total_seconds()
        gathering: float | None = None  # until when (clock.monotonic) to wait for slots
        while not stop.is_set():
            free = self._room()
            if 0 < free < max(1, self._capacity() // 2) and self._busy() > 0:
                now = self.clock.monotonic()
                gathering = now + GATHER if gathering is None else gathering
                if now < gathering:
                    self._freed.clear()
                    await _first(self.clock.sleep(gathering - now), stop.wait(), self._freed.wait())
                    continue
            gathering = None
            got = 0
            if free > 0:
                woke.clear()
                try:
                    claimed = await self.db.workers.claim(
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
                self._ready.extend(claimed)
                self._start_ready()
                got = len(claimed)
            if got and got == free:
                continue  # more may be due: claim again as soon as a slot frees
            self._freed.clear()
            waits = [stop.wait(), woke.wait()] if free > got else [stop.wait(), self._freed.wait()]
            await _first(self.clock.sleep(interval), *waits)

    def _busy(self) -> int:
        return len(self._runs) + len(self._holding) + len(self._ready)

    def _room(self) -> int:
        """How many jobs to claim now: the free slots, and while runs are short (a moving
        average under SHORT_RUN) as many again to hold ready, so that the next claim's round
        trip overlaps the runs instead of waiting behind them. Held long, a claimed job's
        deadline would run down before it starts: long runs get no jobs held ahead."""
        return max(self._capacity() - self._busy(), 0)

    def _capacity(self) -> int:
        """Jobs this worker takes at once: its slots, and those it holds ready (_room)."""
        return self.concurrency + (self.prefetch if self._run_time < SHORT_RUN else 0)

    def _start_ready(self) -> None:
        while (
            self._ready
            and not self._draining
            and not self._stop.is_set()  # told to stop: nothing more starts
            and len(self._runs) + len(self._holding) < self.concurrency
        ):
            self._start(self._ready.popleft())

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
        run = _Run(claimed, ctx, started=self.clock.monotonic())
        self._runs[attempt.id] = run
        run.task = asyncio.create_task(self._run_one(run), name=attempt.launch_name)

    # --- one run ---------------------------------------------------------------------------

    async def _run_one(self, run: _Run) -> None:
        """Run one claimed attempt's function to its end, and record that end."""
        attempt, ctx = run.claimed.attempt, run.ctx
        started = self.clock.monotonic()
        fresh: dict[str, Any] = {}
        try:
            task, value, fresh = await self._prepare(run)
            await self._call(task, value, ctx, run)
        except BaseException as exc:  # each is judged in _failure
            finish = self._failure(run, exc, started, fresh)
            if finish is None:
                self._forget(run)
                return
            if isinstance(finish, BaseException):
                self._forget(run)
                raise finish from None
            self._end(run, finish)
            return
        if run.ended or (ctx.stopping.is_set() and ctx.why is StopReason.CANCELLED):
            self._forget(run)  # ended already (its deadline), or cancelled or replaced
            return
        self._end(
            run,
            Finish(
                attempt.id, A.SUCCEEDED, None, "returned", output=_log(started, fresh, self.clock)
            ),
        )

    async def _prepare(self, run: _Run) -> tuple[Task[Any], Any, dict[str, Any]]:
        """The task, its payload read in its current version, and the Fresh values read
        now (noted in the run log)."""
        job, attempt, ctx = run.claimed.job, run.claimed.attempt, run.ctx
        task = self.app.get(ctx.task)
        value = task.read(ctx.version, _data_of(job.payload, ctx.task))
        value, fresh = await task.resolve(value, self._in_thread)
        if fresh:
            await self.db.events.note(
                job_id=job.id,
                attempt_id=attempt.id,
                state=A.RUNNING,
                reason=f"fresh values resolved: {', '.join(sorted(fresh))}",
                now=self.clock.now(),
                details={"fresh": model.redacted(_jsonable(fresh))},
            )
        return task, value, fresh

    def _failure(
        self,
        run: _Run,
        exc: BaseException,
        started: float,
        fresh: Mapping[str, Any],
    ) -> Finish | BaseException | None:
        """What a run that raised `exc` ends as: a Finish to record; None when nothing is
        to be recorded (stopped on request: at shutdown it is handed back; cancelled or
        replaced, the store says so already; a stale fence); or an exception to raise on
        (this worker's own cancellation)."""
        attempt, ctx = run.claimed.attempt, run.ctx
        fence = attempt.id
        if isinstance(exc, asyncio.CancelledError | Stopped) and ctx.stopping.is_set():
            if ctx.why is StopReason.SHUTDOWN:
                self._back.append(run)  # unfinished: _drain hands it back
            return None
        if isinstance(exc, asyncio.CancelledError):
            return exc  # this worker itself is being cancelled
        if isinstance(exc, errors.StaleFence):
            log.warning("%s: %s; its result is dropped", attempt.launch_name, exc)
            return None
        if isinstance(exc, errors.InvalidInput):  # the payload does not fit: no retry helps
            return _failed(fence, str(exc), FC.PERMANENT, started, fresh, self.clock)
        if isinstance(exc, PermanentError):
            return _failed(fence, _said(exc), FC.PERMANENT, started, fresh, self.clock, exc)
        if isinstance(exc, Stopped):  # raised though nothing asked it to stop
            why = "raised Stopped, but nothing had asked it to stop"
            return _failed(fence, why, None, started, fresh, self.clock, exc)
        if isinstance(exc, Exception):  # a task's own failure (its own timeouts included)
            return _failed(fence, _said(exc), None, started, fresh, self.clock, exc)
        return exc  # KeyboardInterrupt, SystemExit: not a task's to swallow

    async def _call(self, task: Task[Any], value: Any, ctx: TaskContext, run: _Run) -> None:
        args = (value, ctx) if _takes_context(task.fn) else (value,)
        token = _current.set(ctx)
        try:
            if task.is_async:
                await task.fn(*args)
            else:
                await self._in_thread(lambda: task.fn(*args), run)
        finally:
            _current.reset(token)

    async def _in_thread(self, fn: Callable[[], T], run: _Run | None = None) -> T:
        """Run `fn` in one of the worker's threads, with this task's context (its
        current_task(), current_attempt()); `run`: the run whose function it is, which
        holds its slot while the thread runs."""
        context = contextvars.copy_context()
        thread = self._threads.submit(context.run, fn)
        if run is not None:
            run.thread = thread
        return await asyncio.wrap_future(thread)

    def _end(self, run: _Run, finish: Finish) -> None:
        if run.ended:
            return  # its end is written already (its deadline came first), or handed back
        run.ended = True
        self._done.put_nowait(finish)
        self._forget(run)

    def _forget(self, run: _Run) -> None:
        if self._runs.pop(run.ctx.fence, None) is not None:
            took = self.clock.monotonic() - run.started
            self._run_time += (took - self._run_time) * 0.2
        thread = run.thread
        if thread is not None and not thread.done() and thread not in self._holding:
            self._holding.add(thread)
            loop = asyncio.get_running_loop()
            thread.add_done_callback(functools.partial(_back_on, loop, self._let_go))
        self._start_ready()
        self._freed.set()

    def _let_go(self, thread: Future[Any]) -> None:
        self._holding.discard(thread)
        self._start_ready()
        self._freed.set()

    async def _flush_loop(self) -> None:
        """Write ended attempts, as many at once as have ended meanwhile. It never dies:
        a batch that cannot be written within the lease is given up (logged), and recovery
        ends those attempts once their leases run out."""
        while True:
            batch = [await self._done.get()]
            while not self._done.empty():
                batch.append(self._done.get_nowait())
            try:
                written = await self._persist(
                    f"recording {len(batch)} ends",
                    functools.partial(self._finish, batch),
                )
                self.ran += len(batch) if written is not None else 0
            finally:
                for _ in batch:
                    self._done.task_done()

    async def _finish(self, batch: list[Finish]) -> Any:
        return await self.db.attempts.finish(finishes=batch, now=self.clock.now(), retry=self.retry)

    async def _persist(self, what: str, call: Callable[[], Awaitable[T]]) -> T | None:
        """`call()`, tried again on a store error with growing pauses for up to the lease
        (a lock, a deadlock, a server gone for a moment); None when it never got through."""
        pause, give_up = 0.2, self.clock.monotonic() + self.t.lease_timeout.total_seconds()
        while True:
            try:
                return await call()
            except errors.StoreError as exc:
                if self.clock.monotonic() + pause > give_up:
                    log.error("%s failed for good: %s; recovery settles it", what, exc)
                    return None
                log.warning("%s failed, again in %.1fs: %s", what, pause, exc)
                await self.clock.sleep(pause)
                pause = min(pause * 2, self.t.heartbeat_interval.total_seconds())

    # --- heartbeats -----------------------------------------------------------------------------

    async def _deadline_loop(self) -> None:
        """Every DEADLINE_SWEEP of the worker's clock, end the runs past their attempt's
        deadline: failed as timed out (transient; the job's policy retries), an async one
        cancelled, a plain one asked to stop (its thread keeps its slot until it returns)."""
        while True:
            await self.clock.sleep(DEADLINE_SWEEP)
            now = self.clock.now()
            for run in list(self._runs.values()):
                at = run.claimed.attempt.deadline_at
                if at is not None and at <= now and not run.ended:
                    self._expire(run)

    def _expire(self, run: _Run) -> None:
        why = "timed out: ran past its deadline"
        took = self.clock.monotonic() - run.started
        fence = run.claimed.attempt.id
        self._stop_run(run, StopReason.DEADLINE)
        self._end(run, _failed(fence, why, FC.TRANSIENT, run.started, {}, self.clock))
        log.info("%s: %s (after %.1fs)", run.claimed.attempt.launch_name, why, took)

    async def _beat_loop(self) -> None:
        every = self.t.heartbeat_interval.total_seconds()
        while True:
            await self.clock.sleep(every)
            await self.beat()

    async def beat(self) -> None:
        """One heartbeat: this worker is alive; its attempts' leases are renewed; runs the
        store no longer has running are stopped."""
        lease = self.t.lease_timeout.total_seconds()
        leases = {
            fence: run.claimed.attempt.lease_seconds or lease
            for fence, run in self._runs.items()
            if not run.ended
        }
        leases.update({c.attempt.id: c.attempt.lease_seconds or lease for c in self._ready})
        try:
            state, stale = await self.db.workers.beat(
                worker_id=self.id, leases=leases, now=self.clock.now(), since=self._since()
            )
            if state is None:  # forgotten (a long silence): say again who this worker is
                await self.db.workers.register(
                    worker=self.info(), now=self.clock.now(), since=self._since()
                )
        except errors.StoreError as exc:
            log.warning("heartbeat failed (again in %s): %s", self.t.heartbeat_interval, exc)
            return
        gone = set(stale)
        self._ready = collections.deque(c for c in self._ready if c.attempt.id not in gone)
        for fence in stale:
            run = self._runs.get(fence)
            if run is not None:
                log.info(
                    "%s: cancelled, or replaced by a newer attempt: stopping it",
                    run.claimed.attempt.launch_name,
                )
                self._stop_run(run, StopReason.CANCELLED)
                self._forget(run)

    def _stop_run(self, run: _Run, why: StopReason) -> None:
        run.ctx.why = why
        run.ctx.stopping.set()
        for hook in run.ctx._hooks:
            _call_hook(hook, run)
        if run.task is not None and self.app.get(run.ctx.task).is_async:
            run.task.cancel()

    # --- stopping ---------------------------------------------------------------------------

    async def _drain(self) -> None:
        self._draining = True
        with contextlib.suppress(errors.StoreError):
            await self.db.workers.drain(worker_id=self.id, now=self.clock.now())
        await self._hand_back_ready()
        if not self._runs:
            return
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
            self._stop_run(run, StopReason.SHUTDOWN)
        await self._until_done(self.t.margin.total_seconds())
        await self._done.join()  # what finished meanwhile is recorded before the rest goes back
        # Those that stopped when asked, and those still running (a plain function's thread
        # cannot be stopped: its writes are refused by its fence once a newer attempt runs).
        left = [*self._back, *self._runs.values()]
        for run in left:
            run.ended = True  # handed back: a late end of it would only be refused
            self._forget(run)
        back = await self._persist(
            f"handing back {len(left)} tasks",
            lambda: self.db.attempts.hand_back(
                fences=[r.ctx.fence for r in left], now=self.clock.now()
            ),
        )
        if back is not None:
            log.info("handed back %d of %d unfinished tasks, not charged", len(back), len(left))

    async def _hand_back_ready(self) -> None:
        """The jobs claimed ahead and never started go back at once, not charged."""
        ready = [c.attempt.id for c in self._ready]
        self._ready.clear()
        if not ready:
            return
        back = await self._persist(
            f"handing back {len(ready)} jobs not started",
            lambda: self.db.attempts.hand_back(fences=ready, now=self.clock.now()),
        )
        if back is not None:
            log.info("handed back %d jobs claimed ahead and not started, not charged", len(back))

    async def _until_done(self, seconds: float) -> None:
        deadline = self.clock.monotonic() + seconds
        while self._runs and self.clock.monotonic() < deadline:
            self._freed.clear()
            await _first(self.clock.sleep(deadline - self.clock.monotonic()), self._freed.wait())


def _back_on(
    loop: asyncio.AbstractEventLoop, call: Callable[[Future[Any]], None], thread: Future[Any]
) -> None:
    """`call(thread)` on the worker's loop, from the thread's end; nothing once the loop has
    closed (the worker has stopped)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(call, thread)


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
