"""Every loop's pulse: each long-running corral process records itself in the store, so
corral can tell which of its loops run, and say so when work waits that none of them can do.

A process (serve, dispatcher, reconciler, scheduler, alerter, worker, api) runs one
`Pulse`: it writes the process's row in the loops table at start (kind, the loops it runs,
the executors it dispatches, host, pid and the pid's start time, version), beats it every
timeouts.heartbeat_interval, marks it stopped at a clean stop, and forgets rows silent for
FORGET_AFTER. After each beat it looks for work nobody can do:

    schedules due                  and no live scheduler   -> no_scheduler
    Python tasks parked            and no live worker      -> no_worker
    alert rules in its settings    and no live alerter     -> no_alerter

A condition that begins is said once (a WARNING log line and a row in loop_warnings),
however many processes see it; it is said again only after it ended and began anew.

Whether a loop is alive (`liveness`) is decided from its row alone, and on its own host
from its pid too: its beat is not older than STALE_BEATS x heartbeat_interval, it has not
stopped, and, where it ran on this host, its pid runs with the start time it recorded (a
pid the kernel gave to another process since is told apart by that time). Recovery reads
the same decision to end at once the blind attempts of a sender that is dead
(corral.reconciler).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import functools
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from corral import clock, config, durations, errors, store
from corral.store.loops import Loop, Waiting, Warning

__all__ = ["Here", "Liveness", "Loop", "Pulse", "Service", "Status", "Waiting", "Warning"]

log = logging.getLogger("corral.loops")

STALE_BEATS = 3
"""A loop whose last beat is older than this many heartbeat_intervals is not alive."""
FORGET_AFTER = timedelta(days=1)
"""A loop's row silent this long is forgotten."""
WARNINGS_KEPT = timedelta(days=7)
"""A warning that ended is kept this long (what `loop_warnings` says of the past week)."""

DISPATCHER, RECONCILER, SCHEDULER = "dispatcher", "reconciler", "scheduler"
ALERTER, OPERATIONS, WORKER, API = "alerter", "operations", "worker", "api"

NO_SCHEDULER, NO_WORKER, NO_ALERTER = "no_scheduler", "no_worker", "no_alerter"
CONDITIONS = (NO_SCHEDULER, NO_WORKER, NO_ALERTER)


class Liveness(enum.StrEnum):
    """What a loop's row says of it now."""

    LIVE = "live"
    STALE = "stale"  # silent past STALE_BEATS x heartbeat_interval
    GONE = "gone"  # on this host, its pid no longer runs (or runs another process)
    STOPPED = "stopped"  # it stopped cleanly


# --- this host -----------------------------------------------------------------------------


def process_mark(pid: int) -> str | None:
    """What tells the process `pid` apart on this host (Linux's /proc): its pid namespace
    and the kernel's start time of it, "<namespace>:<start>". None when it does not run or
    this system does not say."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        namespace = os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    # After the command: the state is field 3 of proc(5), the start time field 22.
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return f"{namespace.strip('pid:[]')}:{fields[19]}"


@dataclass(frozen=True, slots=True)
class Here:
    """This host, as a loop's row is judged from it: its name, its pid namespace, and the
    mark of a pid in it now (process_mark)."""

    host: str
    namespace: str | None
    mark: Callable[[int], str | None]

    @classmethod
    def this_host(cls) -> Here:
        own = process_mark(os.getpid())
        return cls(socket.gethostname(), _namespace(own), process_mark)


def _namespace(mark: str | None) -> str | None:
    return None if mark is None else mark.partition(":")[0]


# --- decisions (pure) ----------------------------------------------------------------------


def liveness(loop: Loop, *, now: datetime, heartbeat: timedelta, here: Here) -> Liveness:
    """Whether `loop` is alive now, from its row, and from its pid where it ran on this host
    (this name and this pid namespace: a container's pids are not the host's)."""
    if loop.stopped_at is not None:
        return Liveness.STOPPED
    if (
        loop.host == here.host
        and loop.pid_started is not None
        and _namespace(loop.pid_started) == here.namespace
        and here.mark(loop.pid) != loop.pid_started
    ):
        return Liveness.GONE
    if loop.beat_at + STALE_BEATS * heartbeat < now:
        return Liveness.STALE
    return Liveness.LIVE


_DEAD_BECAUSE = {
    Liveness.GONE: "gone (its process no longer runs)",
    Liveness.STALE: f"silent past {STALE_BEATS} heartbeats",
    Liveness.STOPPED: "stopped",
}


def dead(
    loops: Sequence[Loop],
    *,
    now: datetime,
    heartbeat: timedelta,
    here: Here,
    me: str | None,
    silence_counts: bool,
) -> dict[str, str]:
    """The loops (by id) that will never record another outcome, each with why, as a
    sentence: gone, stopped, or silent (only where `silence_counts`: after the database
    was away every loop is silent, and none of them is dead for it). `me` is never dead.
    Pure."""
    out = {}
    for loop in loops:
        state = liveness(loop, now=now, heartbeat=heartbeat, here=here)
        if loop.id == me or state is Liveness.LIVE:
            continue
        if state is Liveness.STALE and not silence_counts:
            continue
        out[loop.id] = f"{loop.kind} pid {loop.pid} on {loop.host} is {_DEAD_BECAUSE[state]}"
    return out


def conditions(
    *, live: Sequence[Loop], waiting: Waiting, alert_rules: bool
) -> tuple[dict[str, str], list[str]]:
    """The conditions of work nobody can do that hold (by name, what to say) and those
    judged, given the live loops and what waits. Without an alert rule (in its own settings
    or a tenant's) a process does not judge the alerter's condition (another's settings may
    have them)."""
    runs = {name for loop in live for name in loop.runs}
    holding: dict[str, str] = {}
    if waiting.schedules_due and SCHEDULER not in runs:
        holding[NO_SCHEDULER] = (
            f"{_count(waiting.schedules_due)} schedule(s) due and no scheduler is running:"
            " they fire nothing until one runs (`corral scheduler`, or `corral serve`)"
        )
    if waiting.tasks_parked and WORKER not in runs:
        holding[NO_WORKER] = (
            f"{_count(waiting.tasks_parked)} Python task job(s) waiting and no worker is"
            " running: start a `corral worker` whose app reads them"
        )
    if alert_rules and ALERTER not in runs:
        holding[NO_ALERTER] = (
            "alert rules are set and no alerter is running: nothing is sent until one runs"
            " (`corral alerter`, or `corral serve`)"
        )
    judged = [NO_SCHEDULER, NO_WORKER, *([NO_ALERTER] if alert_rules else [])]
    return holding, judged


def _count(n: int) -> str:
    return f"{n}+" if n >= 100 else str(n)


# --- the pulse -----------------------------------------------------------------------------


async def alert_rules_exist(db: store.Store, settings: config.Settings) -> bool:
    """Whether any alert rule is set: the settings' (the operator's), or a tenant's in the
    store; without one, nobody is told that no alerter runs."""
    return bool(settings.alerts.rules) or await db.tenant_alerts.any_rule()


@dataclass(frozen=True, slots=True)
class Status:
    """The loops the store knows, each with its liveness, and the conditions that hold."""

    loops: Sequence[tuple[Loop, Liveness]]
    warnings: Mapping[str, str]
    heartbeat: timedelta
    now: datetime


class Pulse:
    """This process's row in the loops table, beaten every heartbeat_interval.

    Use it as an async context manager around the process's loops: the row is written on
    entry, beaten while inside, and marked stopped on a clean exit."""

    def __init__(
        self,
        *,
        db: store.Store,
        clk: clock.Clock,
        settings: config.Settings,
        kind: str,
        runs: Sequence[str],
        executors: Sequence[str] = (),
        here: Here | None = None,
    ) -> None:
        self.db = db
        self.clock = clk
        self.settings = settings
        self.heartbeat = settings.timeouts.heartbeat_interval
        self.here = here or Here.this_host()
        pid = os.getpid()
        now = clk.now()
        self.loop = Loop(
            id=uuid.uuid4().hex,
            kind=kind,
            runs=tuple(runs),
            executors=tuple(executors),
            host=self.here.host,
            pid=pid,
            pid_started=process_mark(pid),
            version=_version(),
            started_at=now,
            beat_at=now,
        )
        self._failing = False
        self._steady_since: float | None = None  # clock.monotonic() of the first beat of a run

    @property
    def id(self) -> str:
        return self.loop.id

    @contextlib.asynccontextmanager
    async def beating(self) -> AsyncIterator[Pulse]:
        """Write the row, beat it until the block ends, then mark it stopped."""
        await self.start()
        stop = asyncio.Event()
        beats = asyncio.create_task(self._run(stop))
        try:
            yield self
        finally:
            stop.set()
            await beats
            await self.stop()

    def sees_silence(self) -> bool:
        """Whether this process may take another loop's silence for its death: only once it
        has itself beaten without a miss for STALE_BEATS + 1 heartbeats. After the database
        was away, every loop's beats are old; the others get those beats to come back in."""
        if self._steady_since is None:
            return False
        steady = self.clock.monotonic() - self._steady_since
        return steady >= (STALE_BEATS + 1) * self.heartbeat.total_seconds()

    async def start(self) -> None:
        """Write this process's row: it is alive from now."""
        await self.db.loops.register(loop=self.loop)
        self._steady_since = self.clock.monotonic()
        log.info(
            "%s %s on %s (pid %d) recorded in the loops table; a beat every %s",
            self.loop.kind,
            self.loop.id,
            self.loop.host,
            self.loop.pid,
            durations.format_duration(self.heartbeat),
        )

    async def stop(self) -> None:
        """Mark this process's row stopped (a clean stop); a store that fails is let be:
        the row goes stale instead."""
        with contextlib.suppress(errors.StoreError):
            await self.db.loops.stop(loop_id=self.loop.id, now=self.clock.now())

    async def _run(self, stop: asyncio.Event) -> None:
        while not await clock.sleep_or_stop(self.clock, stop, self.heartbeat.total_seconds()):
            await self.beat_once()

    async def beat_once(self) -> list[Warning]:
        """One beat: the row is alive now (written again if it was forgotten), rows silent
        for FORGET_AFTER are forgotten, and the conditions of work nobody can do judged;
        returns the warnings that began here. A store that fails is noted, not raised."""
        now = self.clock.now()
        try:
            if not await self.db.loops.beat(loop_id=self.loop.id, now=now):
                await self.db.loops.register(loop=self._again(now))
            await self.db.loops.forget(
                before=now - FORGET_AFTER, warnings_before=now - WARNINGS_KEPT
            )
            begun = await self._judge(now)
        except errors.StoreError as exc:
            if not self._failing:
                log.warning("loops table: could not beat (again in %s): %s", self.heartbeat, exc)
            self._failing, self._steady_since = True, None
            return []
        if self._failing:
            log.info("loops table: beating again")
        if self._steady_since is None:
            self._steady_since = self.clock.monotonic()
        self._failing = False
        for warning in begun:
            log.warning("%s", warning.message)
        return begun

    def _again(self, now: datetime) -> Loop:
        return dataclasses.replace(self.loop, beat_at=now)

    async def _judge(self, now: datetime) -> list[Warning]:
        live = [
            loop
            for loop in await self.db.loops.all()
            if liveness(loop, now=now, heartbeat=self.heartbeat, here=self.here) is Liveness.LIVE
        ]
        waiting = await self.db.loops.waiting(now=now)
        holding, judged = conditions(
            live=live, waiting=waiting, alert_rules=await alert_rules_exist(self.db, self.settings)
        )
        return await self.db.loops.warnings_update(
            holding=holding,
            judged=judged,
            now=now,
            unchecked_before=now - STALE_BEATS * self.heartbeat,
        )


@functools.cache
def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("corral")
    except metadata.PackageNotFoundError:
        return "unknown"


class Service:
    """What the dashboard, the API and the CLI ask of the loops table: they reach it through
    the client (`client.Client.loops`), never the store."""

    def __init__(self, db: store.Store, settings: config.Settings, clk: clock.Clock) -> None:
        self.db = db
        self.settings = settings
        self.clock = clk

    def pulse(self, *, kind: str, runs: Sequence[str], executors: Sequence[str] = ()) -> Pulse:
        """This process's pulse (use `async with pulse.beating()`)."""
        return Pulse(
            db=self.db,
            clk=self.clock,
            settings=self.settings,
            kind=kind,
            runs=runs,
            executors=executors,
        )

    async def status(self) -> Status:
        """Every loop the store knows and whether it is alive, and the conditions of work
        nobody can do, judged now (whether or not any loop runs to judge them)."""
        now, heartbeat = self.clock.now(), self.settings.timeouts.heartbeat_interval
        here = Here.this_host()
        known = [
            (loop, liveness(loop, now=now, heartbeat=heartbeat, here=here))
            for loop in await self.db.loops.all()
        ]
        live = [loop for loop, state in known if state is Liveness.LIVE]
        waiting = await self.db.loops.waiting(now=now)
        rules = await alert_rules_exist(self.db, self.settings)
        holding, _ = conditions(live=live, waiting=waiting, alert_rules=rules)
        return Status(known, holding, heartbeat, now)

    async def warnings(self, *, open_only: bool = False, limit: int = 50) -> list[Warning]:
        """The warnings recorded, the newest first (each time a condition began)."""
        return await self.db.loops.warnings(open_only=open_only, limit=limit)
