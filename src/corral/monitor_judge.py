"""The judge of monitors, in the scheduler's pass: each monitor whose check time came is
judged (corral.monitoring.judge) and its new state written, with its history and the
events the alerter reads (store/monitors.py).

What it needs besides the monitors is whether a gap came before this pass: a time nothing
judged monitors, whose deadlines give a fresh period and grace, not a down. Every pass of
every scheduler notes in the store when it judged and which process it was (its row in
loops), so a scheduler that starts reads when monitors were last judged however the one
before it ended, SIGKILL included. `gap` decides from that:

    nothing ever judged monitors                                a gap since ever
    the last pass is older than loops.STALE_BEATS heartbeats    a gap since it
    this process has judged since it started                    none: its passes were slow
    the process that judged last no longer runs (loops says     a gap since its last pass,
    so: stopped, its pid gone from this host, or silent)        however short
    else (it runs: another scheduler judging beside this one)   none

A process killed on another host looks alive until its beat is STALE_BEATS heartbeats old:
a scheduler started elsewhere within that time sees no gap, and a deadline that passed while
nothing judged counts as missed.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from corral import loops, monitoring
from corral.clock import Clock
from corral.store import Store
from corral.store import monitors as monitor_store

log = logging.getLogger("corral.monitors")

BATCH = 500
"""Monitors judged in one transaction."""


def gap(
    last: monitor_store.Judged | None,
    *,
    own: datetime | None,
    writer: loops.Liveness | None,
    now: datetime,
    heartbeat: timedelta,
) -> monitoring.Gap | None:
    """The gap before a pass at `now` (None: none), from the last pass noted in the store
    (`last`), this process's own last pass (`own`; None: it has not judged yet) and what the
    loops table says of the process that made `last` (`writer`; None: not known). Pure:
    the table of the module's docstring."""
    if last is None:
        return monitoring.Gap(None)
    since = last.at if own is None else max(last.at, own)
    if now - since > loops.STALE_BEATS * heartbeat:
        return monitoring.Gap(since)
    if own is not None:
        return None
    if writer is not None and writer is not loops.Liveness.LIVE:
        return monitoring.Gap(since)
    return None


class Judge:
    """Judges the monitors that are due, a pass at a time (`pass_once`)."""

    def __init__(
        self,
        *,
        store: Store,
        clock: Clock,
        loop_id: str | None = None,
        heartbeat: timedelta = timedelta(seconds=20),
        here: loops.Here | None = None,
    ) -> None:
        """`loop_id`: this process's row in the loops table, noted with each pass;
        `heartbeat`, the loops' heartbeat_interval; `here`, this host, as the row of the
        process that judged last is judged from it (loops.liveness)."""
        self.store = store
        self.clock = clock
        self.loop_id = loop_id
        self.heartbeat = heartbeat
        self.here = here or loops.Here.this_host()
        self._judged_at: datetime | None = None

    async def pass_once(self) -> int:
        """Judge every monitor due now: how many were judged."""
        now = self.clock.now()
        before = await self._gap(now)
        judged = 0
        while True:
            count, changed = await self.store.monitors.judge(now=now, gap=before, limit=BATCH)
            judged += count
            for monitor, change in changed:
                log.info(
                    "monitor %s of tenant %s: %s -> %s: %s",
                    monitor.name,
                    monitor.tenant,
                    change.frm,
                    change.to,
                    change.reason,
                )
            if count < BATCH:
                break
        await self.store.monitors.judged_note(at=now, loop_id=self.loop_id)
        self._judged_at = now
        return judged

    async def _gap(self, now: datetime) -> monitoring.Gap | None:
        """The gap before this pass: the loops table is read only on this process's first
        pass, whose gap depends on whether the process that judged last still runs."""
        last = await self.store.monitors.judged_last()
        writer = None
        if self._judged_at is None and last is not None and last.loop_id is not None:
            row = [loop for loop in await self.store.loops.all() if loop.id == last.loop_id]
            writer = (
                loops.Liveness.STALE  # forgotten: silent for a day
                if not row
                else loops.liveness(row[0], now=now, heartbeat=self.heartbeat, here=self.here)
            )
        return gap(last, own=self._judged_at, writer=writer, now=now, heartbeat=self.heartbeat)
