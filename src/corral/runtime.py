"""Wiring: turn Settings into a connected store and started executors, in a safe order.

Every command that touches jobs opens a Runtime: the store is reached and its schema
checked first, then the executors are started; closing undoes both. Running attempts are
not touched by closing: they belong to their platform.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from corral import client, clock, config, dispatcher, health, reconciler, retry, store
from corral.executors import registry
from corral.executors.base import Executor


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


@contextlib.asynccontextmanager
async def opened(
    settings: config.Settings,
    *,
    clk: clock.Clock | None = None,
    executors: dict[str, Executor] | None = None,
) -> AsyncIterator[Runtime]:
    """Connect the store (checking its schema), then start the executors; undo on exit."""
    clk = clk or clock.SystemClock()
    db = store.Store.connect(settings.database_url)
    started: list[Executor] = []
    try:
        await db.check_schema()
        built = executors if executors is not None else executors_build(settings, clk)
        for executor in built.values():
            await executor.start()
            started.append(executor)
        yield Runtime(settings, clk, db, built)
    finally:
        for executor in reversed(started):
            await executor.close()
        await db.close()


@contextlib.asynccontextmanager
async def connect(
    settings: config.Settings | None = None, *, config_file: Path | None = None
) -> AsyncIterator[client.Client]:
    """A Client on the settings given, or on corral.toml and CORRAL_* variables."""
    settings = settings or config.Settings.load(config_file)
    async with opened(settings) as rt:
        yield client.Client(
            store=rt.store, executors=rt.executors, settings=settings, clock=rt.clock
        )


async def serve(
    settings: config.Settings,
    stop: asyncio.Event,
    *,
    dispatch: bool = True,
    reconcile: bool = True,
    executors: dict[str, Executor] | None = None,
    clk: clock.Clock | None = None,
    on_ready: Callable[[Runtime], Awaitable[None]] | None = None,
) -> None:
    """Open the runtime, then run the dispatcher and/or the reconciler until `stop` is set.

    The order is the point: the store is reached and every executor has started before
    `on_ready` and before either loop, so the first recovery pass never asks a platform
    that is not ready yet. With `health_file` set, a file left by an earlier run is removed
    first, and the file appears once every loop has finished its first round.
    """
    clk = clk or clock.SystemClock()
    names = [n for n, on in ((health.DISPATCHER, dispatch), (health.RECONCILER, reconcile)) if on]
    async with (
        health.HealthFile(settings.health_file, clk, names) as beats,
        opened(settings, clk=clk, executors=executors) as rt,
    ):
        if on_ready is not None:
            await on_ready(rt)
        loops = []
        rules = retry.Retry.from_settings(rt.settings)  # one random source per process
        if dispatch:
            d = dispatcher.Dispatcher(
                store=rt.store,
                executors=rt.executors,
                clock=rt.clock,
                settings=rt.settings,
                retry=rules,
            )
            loops.append(d.run(stop, on_tick=beats.recorder(health.DISPATCHER)))
        if reconcile:
            r = reconciler.Reconciler(
                store=rt.store,
                executors=rt.executors,
                clock=rt.clock,
                settings=rt.settings,
                retry=rules,
            )
            loops.append(r.run(stop, on_pass=beats.recorder(health.RECONCILER)))
        await asyncio.gather(*loops)
