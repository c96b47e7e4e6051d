"""What the dispatcher and the reconciler are both built on: the store, the executors by
kind, the injected clock, the settings, the retry rules in force, and this process's row
in the loops table (its pulse).

Both loops take the same keyword arguments (`Needs`) and keep them the same way (`Core`),
so a part that one of them needs is added here once. The retry rules default to the
settings' own; a process that runs both loops passes one `Retry` to both, so they share
one random source.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NotRequired, TypedDict, Unpack

from corral import clock, config, loops, retry, store
from corral.executors.base import Executor


class Needs(TypedDict):
    """The keyword arguments of a loop built on `Core`."""

    store: store.Store
    executors: Mapping[str, Executor]
    clock: clock.Clock
    settings: config.Settings
    retry: NotRequired[retry.Retry | None]
    """The retry rules in force; by default, the settings'."""
    pulse: NotRequired[loops.Pulse | None]
    """This process's row in the loops table: its id is recorded on each attempt the loop
    sends blind (an HTTP request, recorded running before it is sent), so that recovery
    ends those at once if the process dies; and it says when another loop's silence may
    be taken for its death."""


class Core:
    """The parts a loop over the store and the executors' platforms runs on."""

    def __init__(self, **needs: Unpack[Needs]) -> None:
        settings = needs["settings"]
        pulse = needs.get("pulse")
        self.store = needs["store"]
        self.executors = dict(needs["executors"])
        self.clock = needs["clock"]
        self.settings = settings
        self.t = settings.timeouts
        self.retry = needs.get("retry") or retry.Retry.from_settings(settings)
        self.pulse = pulse
        self.sender = pulse.id if pulse is not None else None
