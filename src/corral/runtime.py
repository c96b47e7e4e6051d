"""Wiring: turn Settings into a connected store and started executors, in a safe order.

Every command that touches jobs opens a Runtime: the store is reached and its schema
checked first, then the executors are started; closing undoes both. Running attempts are
not touched by closing: they belong to their platform.

A one-shot command fails at once when the database cannot be reached. The long-running
loops (`serve`, which `dispatcher` and `reconciler` are too) wait for it at start, as they
do mid-run: they try again with growing pauses (FIRST_PAUSE, doubling, at most
LONGEST_PAUSE), one log line a try, for up to timeouts.database_wait, then give up with
the last error. Only an unreachable server is waited for: a schema out of date or bad
settings fail at once, since waiting cannot mend them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from corral import client, clock, config, durations, errors, health, loops, store
from corral.executors import base, registry
from corral.executors.base import Executor

if TYPE_CHECKING:
    from corral import alerts, retry

log = logging.getLogger("corral.runtime")
FIRST_PAUSE, LONGEST_PAUSE = 0.5, 10.0
"""Seconds between two tries to reach the database at start: the first pause, the longest."""


def _signing_keys(db: store.Store, clk: clock.Clock) -> Callable[[str], Awaitable[list[str]]]:
    """A tenant's signing secrets that sign now, from the store."""

    async def keys(tenant: str) -> list[str]:
        found = await db.tokens.secrets_signing(tenants=[tenant], now=clk.now())
        return found.get(tenant, [])

    return keys


def executors_build(settings: config.Settings, clk: clock.Clock) -> dict[str, Executor]:
    """The executors `executors.enabled` names, not yet started."""
    return {kind: registry.get(kind).build(settings, clk) for kind in settings.executors.enabled}


@dataclass(frozen=True, slots=True)
class Runtime:
    """The running parts a command works with."""

    settings: config.Settings
    clock: clock.Clock
    store: store.Store
    executors: dict[str, Executor]

    def client(self) -> client.Client:
        """A client of these parts: its store, executors, settings and clock."""
        return client.Client(
            store=self.store, executors=self.executors, settings=self.settings, clock=self.clock
        )


def pause_after(tries: int) -> float:
    """Seconds to wait after the `tries`-th failed try to reach the database (from 1)."""
    return min(FIRST_PAUSE * 2.0 ** min(tries - 1, 32), LONGEST_PAUSE)


async def reach(
    settings: config.Settings, clk: clock.Clock, stop: asyncio.Event
) -> store.Store | None:
    """The store, its schema checked, once the database can be reached; None when `stop` is
    set while waiting for it. Raises the last error after timeouts.database_wait."""
    db = store.Store.connect(settings.database_url, timeouts=settings.timeouts)
    try:
        if await _schema_checked(db, settings.timeouts.database_wait, clk, stop):
            return db
    except BaseException:
        await db.close()
        raise
    await db.close()
    return None


async def _schema_checked(
    db: store.Store, patience: timedelta, clk: clock.Clock, stop: asyncio.Event
) -> bool:
    """Check the schema until it passes (True) or `stop` is set (False), trying again while
    the database cannot be reached, for up to `patience` of clock time."""
    began, tries = clk.monotonic(), 0
    while True:
        try:
            await db.database.check_schema()
            return True
        except errors.StoreUnavailable as exc:
            tries += 1
            waited = clk.monotonic() - began
            pause = min(pause_after(tries), patience.total_seconds() - waited)
            said = (
                f"database unreachable (try {tries}, waited {waited:.1f}s of"
                f" {durations.format_duration(patience)}): {exc}"
            )
            if pause <= 0:
                log.error("%s; giving up (timeouts.database_wait)", said)
                raise errors.StoreUnavailable(
                    f"{exc} (tried {tries} times in {durations.format_duration(patience)},"
                    " timeouts.database_wait)"
                ) from exc
            log.warning("%s; trying again in %.1fs", said, pause)
            if await clock.sleep_or_stop(clk, stop, pause):
                log.info("stopped while waiting for the database")
                return False


@contextlib.asynccontextmanager
async def opened(
    settings: config.Settings,
    *,
    clk: clock.Clock | None = None,
    executors: dict[str, Executor] | None = None,
    db: store.Store | None = None,
) -> AsyncIterator[Runtime]:
    """Connect the store (checking its schema), then start the executors; undo on exit.

    `db` is a store already reached and checked (see `reach`); it is closed on exit too."""
    clk = clk or clock.SystemClock()
    checked = db is not None
    db = db or store.Store.connect(settings.database_url, timeouts=settings.timeouts)
    started: list[Executor] = []
    try:
        if not checked:
            await db.database.check_schema()
        if (settings.api_url or settings.local_api_url) and not settings.attempt_key:
            key = await client.tokens.attempt_key(settings, db, clk)
            settings = settings.model_copy(update={"attempt_key": key})
        built = executors if executors is not None else executors_build(settings, clk)
        installation = None
        for executor in built.values():
            if isinstance(executor, base.SharesPlatform):
                installation = installation or await db.database.installation()
                executor.use_installation(installation)
            if isinstance(executor, base.SignsRequests):
                executor.use_signing_keys(_signing_keys(db, clk))
            await executor.start()
            started.append(executor)
        yield Runtime(settings, clk, db, built)
    finally:
        for executor in reversed(started):
            await executor.close()
        await db.close()


@contextlib.asynccontextmanager
async def connect(
    settings: config.Settings | None = None,
    *,
    config_file: Path | None = None,
    platforms: bool = True,
) -> AsyncIterator[client.Client]:
    """A Client on the settings given, or on corral.toml and CORRAL_* variables. With
    `platforms` off, no executor is started: the client reads and stores jobs (their specs
    checked), but cannot stop a run on its platform (`cancel` only marks it)."""
    settings = settings or config.Settings.load(config_file)
    clk = clock.SystemClock()
    checkers = None if platforms else registry.Checkers(settings, clk)
    async with opened(settings, clk=clk, executors=None if platforms else {}) as rt:
        yield client.Client(
            store=rt.store,
            executors=rt.executors,
            settings=settings,
            clock=rt.clock,
            checkers=checkers,
        )


@dataclass(frozen=True, slots=True)
class _Asked:
    """The loops a process was asked to run (the alerter always, when asked: tenants make
    their own rules in the store, and it does next to nothing while no rule exists)."""

    dispatch: bool
    reconcile: bool
    schedule: bool
    alert: bool
    operate: bool

    def names(self) -> list[str]:
        """The loops' names in the health file, and in the loops table."""
        wanted = (
            (health.DISPATCHER, self.dispatch),
            (health.RECONCILER, self.reconcile),
            (health.SCHEDULER, self.schedule),
            (health.ALERTER, self.alert),
        )
        return [n for n, on in wanted if on]


async def serve(
    settings: config.Settings,
    stop: asyncio.Event,
    *,
    dispatch: bool = True,
    reconcile: bool = True,
    schedule: bool = True,
    alert: bool = True,
    operate: bool = True,
    executors: dict[str, Executor] | None = None,
    clk: clock.Clock | None = None,
    on_ready: Callable[[Runtime], Awaitable[None]] | None = None,
    kind: str = "serve",
    also_runs: Sequence[str] = (),
) -> None:
    """Open the runtime, then run the dispatcher, the reconciler, the scheduler and the
    alerter (those asked for; the alerter only when alert rules are set), and the runner
    of bulk operations (`operate`), until `stop` is set. The process is recorded in the
    loops table as `kind` (the command), running those loops and `also_runs` (the API,
    served beside them), and beats there while they run (corral.loops).

    The order is the point: the store is reached and every executor has started before
    `on_ready` and before either loop, so the first recovery pass never asks a platform
    that is not ready yet. A database that cannot be reached is waited for first (see
    `reach`); `stop` set meanwhile ends the wait, and this returns. With `health_file` set,
    a file left by an earlier run is removed first, and the file appears once every loop
    has finished its first round."""
    clk = clk or clock.SystemClock()
    asked = _Asked(dispatch, reconcile, schedule, alert, operate)
    async with health.HealthFile(settings.health_file, clk, asked.names()) as beats:
        db = await reach(settings, clk, stop)
        if db is None:
            return
        async with opened(settings, clk=clk, executors=executors, db=db) as rt:
            runs = [*asked.names(), *([loops.OPERATIONS] if operate else []), *also_runs]
            pulse = loops.Service(rt.store, settings, clk).pulse(
                kind=kind, runs=runs, executors=list(rt.executors) if dispatch else ()
            )
            async with pulse.beating():
                await _run_loops(rt, stop, beats, asked, on_ready=on_ready, pulse=pulse)


async def _run_loops(
    rt: Runtime,
    stop: asyncio.Event,
    beats: health.HealthFile,
    asked: _Asked,
    *,
    on_ready: Callable[[Runtime], Awaitable[None]] | None,
    pulse: loops.Pulse | None = None,
) -> None:
    """Run the loops asked for on an opened runtime until `stop` is set; `pulse`: this
    process's row in the loops table."""
    from corral import alerts, operations, retry

    if on_ready is not None:
        await on_ready(rt)
    running = []
    rules = retry.Retry.from_settings(rt.settings)  # one random source per process
    if asked.dispatch:
        running.append(_dispatching(rt, stop, beats, rules, pulse))
    if asked.reconcile:
        running.append(_reconciling(rt, stop, beats, rules, pulse))
    if asked.schedule:
        running.append(_scheduling(rt, stop, beats, pulse))
    if asked.alert:
        a = alerts.Alerter(store=rt.store, clock=rt.clock, settings=rt.settings)
        running.append(a.run(stop, on_pass=beats.recorder(health.ALERTER)))
    if asked.operate:
        o = operations.Runner(
            store=rt.store, clock=rt.clock, settings=rt.settings, executors=rt.executors
        )
        running.append(o.run(stop))
    await asyncio.gather(*running)


def _dispatching(
    rt: Runtime,
    stop: asyncio.Event,
    beats: health.HealthFile,
    rules: retry.Retry,
    pulse: loops.Pulse | None,
) -> Awaitable[None]:
    """The dispatcher's loop, its ticks recorded in the health file."""
    from corral import dispatcher

    d = dispatcher.Dispatcher(
        store=rt.store,
        executors=rt.executors,
        clock=rt.clock,
        settings=rt.settings,
        retry=rules,
        pulse=pulse,
    )
    return d.run(stop, on_tick=beats.recorder(health.DISPATCHER))


def _reconciling(
    rt: Runtime,
    stop: asyncio.Event,
    beats: health.HealthFile,
    rules: retry.Retry,
    pulse: loops.Pulse | None,
) -> Awaitable[None]:
    """The reconciler's loop, its passes recorded in the health file and, with
    alerts.heartbeat_url set, pinged there too."""
    from corral import alerts, reconciler

    r = reconciler.Reconciler(
        store=rt.store,
        executors=rt.executors,
        clock=rt.clock,
        settings=rt.settings,
        retry=rules,
        pulse=pulse,
    )
    passed = beats.recorder(health.RECONCILER)
    if not (url := rt.settings.alerts.heartbeat_url):
        return r.run(stop, on_pass=passed)
    ping = alerts.Heartbeat(url)

    def passed_and_pinged() -> None:
        passed()
        ping()

    return _closed_after(r.run(stop, on_pass=passed_and_pinged), ping)


def _scheduling(
    rt: Runtime, stop: asyncio.Event, beats: health.HealthFile, pulse: loops.Pulse | None
) -> Awaitable[None]:
    """The scheduler's loop, its passes recorded in the health file; a tenant's firings
    checked against its grant and its spec's references; monitors judged, each pass noted
    with this process's row (`pulse`), which the gap rule reads (corral.monitor_judge)."""
    from corral import scheduler
    from corral.executors import references  # jsonschema: only where schedules fire

    s = scheduler.Scheduler(
        store=rt.store,
        clock=rt.clock,
        executors=rt.executors,
        cancel_grace=rt.settings.timeouts.cancel_grace,
        tenants=rt.settings.tenants,
        refuse=references.firing_refusal(rt.settings),
        loop_id=None if pulse is None else pulse.id,
        heartbeat=rt.settings.timeouts.heartbeat_interval,
    )
    return s.run(stop, on_pass=beats.recorder(health.SCHEDULER))


async def _closed_after(loop: Awaitable[None], heartbeat: alerts.Heartbeat) -> None:
    try:
        await loop
    finally:
        await heartbeat.close()
