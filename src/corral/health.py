"""The health file: how a running corral shows a probe that its loops are still moving.

corral has no HTTP endpoint to probe, so each loop of a process notes the end of every
tick (dispatcher) or pass (reconciler), and the process keeps the newest of those times in
a small JSON file that `corral health` reads (from a Kubernetes exec probe, say):

    {"pid": 7, "loops": {"dispatcher": "2026-01-01T12:00:03+00:00",
                         "reconciler": "2026-01-01T12:00:01+00:00"}}

- The file appears once every loop of the process has finished its first tick or pass,
  so "the file exists" means ready. A file left by an earlier run is removed at start.
- A tick or pass that failed (the database was unreachable, say) counts too: the loop is
  alive, and restarting the process would not bring the database back.
- A loop that stops moving leaves its time behind, and `corral health --max-age` fails,
  naming the loop.

Writing must never slow a loop down: a busy dispatcher ticks many times a second, so the
file is rewritten at most once every `WRITE_EVERY` seconds, in a worker thread, and a
write still in progress is never waited for by a loop. A write that hangs only makes the
file go stale, which is exactly what a probe should then see.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from types import TracebackType

from corral import clock, errors

log = logging.getLogger("corral.health")

DISPATCHER, RECONCILER, SCHEDULER = "dispatcher", "reconciler", "scheduler"
ALERTER = "alerter"
WRITE_EVERY = 1.0
"""Seconds between two rewrites of the file, at least."""
DEFAULT_MAX_AGE = timedelta(seconds=60)
_ROUND = {DISPATCHER: "tick", RECONCILER: "pass", SCHEDULER: "pass", ALERTER: "pass"}


class HealthFile:
    """Keeps `path` up to date with when each of `loops` last finished a tick or pass.

    With `path` None it records nothing, so callers need not check whether it is wanted.
    Use it as an async context manager around the loops."""

    def __init__(self, path: Path | None, clk: clock.Clock, loops: Sequence[str]) -> None:
        self.path = path
        self.clock = clk
        self._last: dict[str, datetime | None] = dict.fromkeys(loops)
        self._written_at: float | None = None  # monotonic
        self._writing: asyncio.Task[None] | None = None
        self._failing = False

    async def __aenter__(self) -> HealthFile:
        if self.path is not None:
            await asyncio.to_thread(self._prepare)
            log.info("health file %s: written after every tick and pass", self.path)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # The file stays: removing it would fail the liveness probe during a clean drain.
        if self._writing is not None:
            await self._writing

    def recorder(self, loop: str) -> Callable[[], None]:
        """The hook for one loop: call it after every tick or pass."""
        if loop not in self._last:
            raise ValueError(f"{loop!r} is not one of this health file's loops")
        return functools.partial(self.record, loop)

    def record(self, loop: str) -> None:
        """`loop` finished a tick or pass just now; rewrite the file unless it is too soon."""
        if self.path is None:
            return
        self._last[loop] = self.clock.now()
        if self._writing is not None and not self._writing.done():
            return
        if any(at is None for at in self._last.values()):
            return  # not every loop has finished its first round: not ready yet
        now = self.clock.monotonic()
        if self._written_at is not None and now - self._written_at < WRITE_EVERY:
            return
        self._written_at = now
        self._writing = asyncio.create_task(asyncio.to_thread(self._write, self._text()))

    def _text(self) -> str:
        loops = {name: at.isoformat() for name, at in self._last.items() if at is not None}
        return json.dumps({"pid": os.getpid(), "loops": loops})

    def _prepare(self) -> None:
        """Remove an earlier run's file; a path that cannot be used stops corral at start."""
        assert self.path is not None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.unlink(missing_ok=True)
        except OSError as exc:
            raise errors.ConfigError(
                f"health_file {str(self.path)!r}: cannot use it: {exc}"
            ) from None

    def _write(self, text: str) -> None:
        # Replaced whole, so a probe never reads half a file. No fsync: the file only
        # matters while this process runs, and a lost one fails the probe, as it should.
        assert self.path is not None
        part = self.path.with_name(f".{self.path.name}.{os.getpid()}.part")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            part.write_text(text, encoding="utf-8")
            os.replace(part, self.path)
        except OSError as exc:
            if not self._failing:
                log.warning("health file %s: cannot write it: %s", self.path, exc)
            self._failing = True
            return
        if self._failing:
            log.info("health file %s: written again", self.path)
        self._failing = False


# --- reading it -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Health:
    """What a health file says: the process, and when each loop last finished a round."""

    pid: int
    loops: Mapping[str, datetime]


def read(path: Path) -> Health:
    """The health file at `path`; Unhealthy when it is missing or not a health file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise errors.Unhealthy(
            f"{path}: no health file: corral has not finished its first tick or pass yet,"
            " or it runs without --health-file (the health_file setting)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise errors.Unhealthy(f"{path}: cannot read it: {exc}") from None
    try:
        data = json.loads(text)
        loops = {str(k): datetime.fromisoformat(v) for k, v in data["loops"].items()}
        return Health(pid=int(data["pid"]), loops=loops)
    except (ValueError, TypeError, KeyError, AttributeError):
        raise errors.Unhealthy(f"{path}: not a corral health file") from None


def check(path: Path, *, now: datetime, max_age: timedelta | None) -> str:
    """A one-line summary when every loop in the file finished a round within `max_age`
    of `now` (with `max_age` None: when the file is there, i.e. the process is ready);
    Unhealthy naming the stale loop otherwise."""
    found = read(path)
    if not found.loops:
        raise errors.Unhealthy(f"{path}: records no loop")
    ages = {name: now - at for name, at in found.loops.items()}
    if max_age is not None:
        for name, age in sorted(ages.items(), key=lambda item: item[1], reverse=True):
            if age > max_age:
                raise errors.Unhealthy(
                    f"the {name}'s last {_ROUND.get(name, 'round')} ended {_seconds(age)} ago"
                    f" (at {found.loops[name].isoformat(timespec='seconds')}), more than the"
                    f" {_seconds(max_age)} allowed: the loop is stuck, or process {found.pid}"
                    " has stopped"
                )
    said = ", ".join(
        f"{name} {_ROUND.get(name, 'round')} {_seconds(age)} ago" for name, age in ages.items()
    )
    return f"ok: {said} (process {found.pid})"


def _seconds(age: timedelta) -> str:
    return f"{max(age.total_seconds(), 0.0):.1f}s"
