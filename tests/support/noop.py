"""NoopExecutor: an executor double whose launches finish the moment they are launched.

For tests and benchmarks that exercise the dispatcher and the store without running
anything: every launch is recorded (idempotent by name) and its finish is pushed on
`events()` at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import timedelta
from typing import Any

from corral import clock, launching


class NoopExecutor:
    """Completes every launch at once: SUCCEEDED, or FAILED with `fail_exit_code`."""

    kind = "noop"

    def __init__(
        self, *, fail_exit_code: int | None = None, clock: clock.Clock | None = None
    ) -> None:
        self.fail_exit_code = fail_exit_code
        self.launches: dict[str, launching.Launch] = {}
        """Every distinct launch, by name."""
        self.launch_calls = 0
        """How many times `launch` was called, repeats included."""
        self.cancelled: list[str] = []
        self._clock = clock
        self._seen: dict[str, launching.Observation] = {}
        self._queue: asyncio.Queue[launching.Observation | None] = asyncio.Queue()

    @property
    def launched(self) -> int:
        """How many distinct names were launched."""
        return len(self.launches)

    def validate_spec(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """Any spec is fine."""
        return dict(spec)

    async def start(self) -> None:
        """Nothing to get ready."""

    async def close(self) -> None:
        """End `events`."""
        self._queue.put_nowait(None)

    async def launch(self, launch: launching.Launch) -> None:
        """Record the launch and finish it at once (only the first time for a name)."""
        self.launch_calls += 1
        if launch.name in self.launches:
            return
        self.launches[launch.name] = launch
        now = self._clock.now() if self._clock else None
        failed = self.fail_exit_code is not None
        obs = launching.Observation(
            name=launch.name,
            phase=launching.Phase.FAILED if failed else launching.Phase.SUCCEEDED,
            labels=launch.labels,
            exit_code=self.fail_exit_code if failed else 0,
            reason=f"exited with code {self.fail_exit_code}" if failed else None,
            started_at=now,
            finished_at=now,
        )
        self._seen[launch.name] = obs
        self._queue.put_nowait(obs)

    async def observe(self, names: Sequence[str]) -> dict[str, launching.Observation]:
        """What was launched; ABSENT for names never launched."""
        return {
            n: self._seen.get(n, launching.Observation(n, launching.Phase.ABSENT)) for n in names
        }

    async def list_managed(self, selector: Mapping[str, str]) -> list[launching.Observation]:
        """Launches whose labels include all of `selector`."""
        return [
            obs
            for obs in self._seen.values()
            if all(obs.labels.get(k) == v for k, v in selector.items())
        ]

    async def cancel(self, name: str, grace: timedelta) -> None:
        """Mark a known launch FAILED with reason `cancelled`; unknown names are fine."""
        obs = self._seen.get(name)
        if obs is None:
            return
        self.cancelled.append(name)
        self._seen[name] = launching.Observation(
            name=name,
            phase=launching.Phase.FAILED,
            labels=obs.labels,
            reason="cancelled",
            started_at=obs.started_at,
            finished_at=obs.finished_at,
        )

    async def events(self) -> AsyncIterator[launching.Observation]:
        """The finish of every launch, in launch order, until `close`."""
        while (obs := await self._queue.get()) is not None:
            yield obs
