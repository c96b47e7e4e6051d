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
import functools
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Future
from typing import Any, TypeVar

from corral import (
    clock,
    config,
    errors,
    loops,
    model,
    python_tasks,
    redaction,
    retry,
    store,
)
from corral.store import DefaultLimits, Finish
from corral.worker import calls, context, ends
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
        app.check()
        self.app = app
        self.db = db
        self.settings = settings
        self.t = settings.timeouts
        self.clock = clk
        self.concurrency = concurrency
        self.prefetch = _prefetch(concurrency, prefetch)
        self.queues = queues
        self.host = socket.gethostname()
        self.id = worker_id or f"{self.host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.retry = retry.Retry.from_settings(settings)
        self.limits = DefaultLimits(self.t.attempt_deadline, self.t.lease_timeout)
        self._runs: dict[int, calls.Run] = {}  # running, by fence
        # Claimed ahead (while tasks are short, see _room), started as slots free: a slot
        # that frees takes the next at once, with no round trip to the store.
        self._ready: collections.deque[model.Claimed] = collections.deque()
        self._run_time = 0.0  # seconds a run takes, a moving average
        self._draining = False
        self._stop = asyncio.Event()  # run()'s
        self._back: list[calls.Run] = []  # stopped at shutdown, unfinished: to hand back
        # Threads of plain functions whose attempt ended (a deadline, a cancel) while they
        # run on: Python cannot stop a thread, so each keeps its slot until it returns.
        self._holding: set[Future[Any]] = set()
        self._done: asyncio.Queue[Finish] = asyncio.Queue()
        self._freed = asyncio.Event()
        self.calls = calls.Calls(concurrency)
        self.ran = 0  # attempts this worker ended, for its summary

    def info(self) -> python_tasks.Worker:
        now = self.clock.now()
        return python_tasks.Worker(
            id=self.id,
            app=self.app.name,
            app_version=self.app.version,
            host=self.host,
            pid=os.getpid(),
            queues=self.queues,
            concurrency=self.concurrency,
            state=python_tasks.WorkerState.RUNNING,
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
        self._log_registered(unparked)
        beats = asyncio.create_task(self._beat_loop())
        deadlines = asyncio.create_task(self._deadline_loop())
        flush = asyncio.create_task(self._flush_loop())
        pulse = loops.Service(self.db, self.settings, self.clock).pulse(
            kind="worker", runs=(loops.WORKER,), executors=(python_tasks.PYTHON,)
        )
        try:
            async with pulse.beating():
                async with self.db.database.woken() as woke:
                    await self._claim_loop(stop, woke)
                await self._drain()
        finally:
            await self._end_loops(beats, deadlines, flush)
        parked = await self.db.workers.stop(
            worker_id=self.id, now=self.clock.now(), since=self._since()
        )
        log.info(
            "worker %s stopped: %d attempts ended here; %d jobs parked (no live worker reads them)",
            self.id,
            self.ran,
            parked,
        )

    def _log_registered(self, unparked: int) -> None:
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

    async def _end_loops(
        self, beats: asyncio.Task[None], deadlines: asyncio.Task[None], flush: asyncio.Task[None]
    ) -> None:
        """Stop the heartbeats and the deadline sweep; let the writer record every end
        queued, then stop it too; let the threads go."""
        for loop_task in (beats, deadlines):
            loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop_task
        await self._done.join()
        flush.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await flush
        self.calls.shutdown()

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
                got = await self._claim(free, interval)
            if got and got == free:
                continue  # more may be due: claim again as soon as a slot frees
            self._freed.clear()
            waits = [stop.wait(), woke.wait()] if free > got else [stop.wait(), self._freed.wait()]
            await _first(self.clock.sleep(interval), *waits)

    async def _claim(self, free: int, interval: float) -> int:
        """Claim up to `free` jobs and start what slots allow; how many it claimed."""
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
                weights=self.settings.tenant_weights,
            )
        except errors.StoreError as exc:
            log.warning("claim failed, trying again in %.1fs: %s", interval, exc)
            claimed = []
        self._ready.extend(claimed)
        self._start_ready()
        return len(claimed)

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
        name, version = python_tasks.task_of(job.spec)
        ctx = context.TaskContext(
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
        run = calls.Run(claimed, ctx, started=self.clock.monotonic())
        self._runs[attempt.id] = run
        run.task = asyncio.create_task(self._run_one(run), name=attempt.launch_name)

    # --- one run ---------------------------------------------------------------------------

    async def _run_one(self, run: calls.Run) -> None:
        """Run one claimed attempt's function to its end, and record that end."""
        attempt, ctx = run.claimed.attempt, run.ctx
        started = self.clock.monotonic()
        fresh: dict[str, Any] = {}
        try:
            task, value, fresh = await self._prepare(run)
            returned = await self.calls.call(task, value, ctx, run)
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
        if run.ended or (ctx.stopping.is_set() and ctx.why is context.StopReason.CANCELLED):
            self._forget(run)  # ended already (its deadline), or cancelled or replaced
            return
        self._end(
            run,
            Finish(
                attempt.id,
                A.SUCCEEDED,
                None,
                "returned",
                output=ends.run_log(started, fresh, self.clock, returned=returned),
            ),
        )

    async def _prepare(self, run: calls.Run) -> tuple[Task[Any], Any, dict[str, Any]]:
        """The task, its payload read in its current version, and the Fresh values read
        now (noted in the run log)."""
        job, attempt, ctx = run.claimed.job, run.claimed.attempt, run.ctx
        task = self.app.get(ctx.task)
        value = task.read(ctx.version, calls.data_of(job.payload, ctx.task))
        value, fresh = await task.resolve(value, self.calls.in_thread)
        if fresh:
            await self.db.events.note(
                job_id=job.id,
                attempt_id=attempt.id,
                state=A.RUNNING,
                reason=f"fresh values resolved: {', '.join(sorted(fresh))}",
                now=self.clock.now(),
                details={"fresh": redaction.redacted(ends.jsonable(fresh))},
            )
        return task, value, fresh

    def _failure(
        self,
        run: calls.Run,
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
        if isinstance(exc, asyncio.CancelledError | errors.Stopped) and ctx.stopping.is_set():
            if ctx.why is context.StopReason.SHUTDOWN:
                self._back.append(run)  # unfinished: _drain hands it back
            return None
        if isinstance(exc, asyncio.CancelledError):
            return exc  # this worker itself is being cancelled
        if isinstance(exc, errors.StaleFence):
            log.warning("%s: %s; its result is dropped", attempt.launch_name, exc)
            return None
        if isinstance(exc, errors.InvalidInput):  # the payload does not fit: no retry helps
            return ends.failed(fence, str(exc), FC.PERMANENT, started, fresh, self.clock)
        if isinstance(exc, errors.PermanentError):
            return ends.failed(fence, ends.said(exc), FC.PERMANENT, started, fresh, self.clock, exc)
        if isinstance(exc, errors.Stopped):  # raised though nothing asked it to stop
            why = "raised Stopped, but nothing had asked it to stop"
            return ends.failed(fence, why, None, started, fresh, self.clock, exc)
        if isinstance(exc, Exception):  # a task's own failure (its own timeouts included)
            return ends.failed(fence, ends.said(exc), None, started, fresh, self.clock, exc)
        return exc  # KeyboardInterrupt, SystemExit: not a task's to swallow

    def _end(self, run: calls.Run, finish: Finish) -> None:
        if run.ended:
            return  # its end is written already (its deadline came first), or handed back
        run.ended = True
        self._done.put_nowait(finish)
        self._forget(run)

    def _forget(self, run: calls.Run) -> None:
        if self._runs.pop(run.ctx.fence, None) is not None:
            took = self.clock.monotonic() - run.started
            self._run_time += (took - self._run_time) * 0.2
        thread = run.thread
        if thread is not None and not thread.done() and thread not in self._holding:
            self._holding.add(thread)
            loop = asyncio.get_running_loop()
            thread.add_done_callback(functools.partial(calls.back_on, loop, self._let_go))
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

    def _expire(self, run: calls.Run) -> None:
        why = "timed out: ran past its deadline"
        took = self.clock.monotonic() - run.started
        fence = run.claimed.attempt.id
        self._stop_run(run, context.StopReason.DEADLINE)
        self._end(run, ends.failed(fence, why, FC.TRANSIENT, run.started, {}, self.clock))
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
                self._stop_run(run, context.StopReason.CANCELLED)
                self._forget(run)

    def _stop_run(self, run: calls.Run, why: context.StopReason) -> None:
        run.ctx.why = why
        run.ctx.stopping.set()
        for hook in run.ctx._hooks:
            calls.call_hook(hook, run)
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
            calls.call_hook(hook, None)
        for run in left:
            self._stop_run(run, context.StopReason.SHUTDOWN)
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


def _prefetch(concurrency: int, prefetch: int | None) -> int:
    """The jobs a worker holds ready, once its --concurrency and --prefetch are checked."""
    if concurrency < 1:
        raise errors.ConfigError(f"--concurrency {concurrency}: must be at least 1")
    prefetch = 4 * concurrency if prefetch is None else prefetch
    if prefetch < 0:
        raise errors.ConfigError(f"--prefetch {prefetch}: must be at least 0")
    return prefetch


async def _first(*waits: Awaitable[Any]) -> None:
    """Wait until the first of `waits` is done; cancel the rest."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()


__all__ = ["Worker"]
