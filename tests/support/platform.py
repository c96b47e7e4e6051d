"""Platform: an executor double whose launches stay where a test puts them.

Unlike NoopExecutor, nothing finishes by itself: a test finishes, removes, replaces or
hides launches, or takes the whole platform down, and then sees what recovery does.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import timedelta
from typing import Any

from corral import errors, launching

P = launching.Phase


class Platform:
    """An in-memory platform with Kubernetes-like launch semantics (names are unique)."""

    kind = "noop"

    def __init__(self, *, start_delay: float = 0.0) -> None:
        self.objects: dict[str, launching.Observation] = {}
        self.launches: Counter[str] = Counter()  # real creations by name
        self.asked: list[launching.Launch] = []  # every launch asked for, repeats included
        self.cancelled: list[str] = []
        self.down = False
        self.down_for_launch = False
        self.cancel_fails = False
        self.ready = False
        self.calls = 0  # every launch, observe, list and cancel asked of it
        self.calls_before_ready = 0
        self._start_delay = start_delay
        self._closed = asyncio.Event()

    def validate_spec(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        return dict(spec)

    async def start(self) -> None:
        await asyncio.sleep(self._start_delay)
        self.ready = True

    async def close(self) -> None:
        self._closed.set()

    def _check(self) -> None:
        self.calls += 1
        if not self.ready:
            self.calls_before_ready += 1
        if self.down:
            raise errors.ExecutorError("platform unreachable")

    async def launch(self, launch: launching.Launch) -> None:
        self._check()
        self.asked.append(launch)
        if self.down_for_launch:
            raise errors.ExecutorError("platform refuses new launches")
        existing = self.objects.get(launch.name)
        if existing is not None:
            if existing.identity != launch.identity:
                raise errors.LaunchConflict(f"{launch.name} exists as {existing.identity}")
            return
        self.launches[launch.name] += 1
        self.objects[launch.name] = launching.Observation(
            launch.name, P.RUNNING, dict(launch.labels)
        )

    async def observe(self, names: Sequence[str]) -> dict[str, launching.Observation]:
        self._check()
        return {n: self.objects.get(n, launching.Observation(n, P.ABSENT)) for n in names}

    async def list_managed(self, selector: Mapping[str, str]) -> list[launching.Observation]:
        self._check()
        return [
            o
            for o in self.objects.values()
            if all(o.labels.get(k) == v for k, v in selector.items())
        ]

    async def cancel(self, name: str, grace: timedelta) -> None:
        self._check()
        if self.cancel_fails:
            raise errors.ExecutorError("platform did not take the delete")
        if (obs := self.objects.get(name)) is not None and not obs.phase.finished:
            self.cancelled.append(name)
            self.objects[name] = launching.Observation(
                name, P.FAILED, obs.labels, exit_code=-15, reason="cancelled"
            )

    async def events(self) -> AsyncIterator[launching.Observation]:
        await self._closed.wait()
        return
        yield  # an async generator that pushes nothing: this platform is polled

    # --- what tests do to the platform ----------------------------------------------------

    def put(
        self,
        launch: launching.Launch,
        phase: launching.Phase = P.RUNNING,
        exit_code: int | None = None,
    ) -> None:
        """Create a launch as if it had been launched (labels and all)."""
        self.objects[launch.name] = launching.Observation(
            launch.name, phase, dict(launch.labels), exit_code=exit_code
        )

    def finish(self, name: str, exit_code: int = 0) -> None:
        obs = self.objects[name]
        phase = P.SUCCEEDED if exit_code == 0 else P.FAILED
        self.objects[name] = launching.Observation(name, phase, obs.labels, exit_code=exit_code)

    def remove(self, name: str) -> None:
        del self.objects[name]
