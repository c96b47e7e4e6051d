"""The judge of monitors, in the scheduler's pass: each monitor whose check time came is
judged (corral.monitoring.judge) and its new state written, with its history and the
events the alerter reads (store/monitors.py).

What it needs besides the monitors is when monitors were last judged, for the gap rule: by
this process, its last pass (kept in memory); and when that is not recent (its first pass,
or after passes failed), by the others that run a scheduler, from the loops table: one
still beating is judging now, one stopped or silent judged last at its last beat.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta

from corral import loops, monitoring
from corral.clock import Clock
from corral.store import Store

log = logging.getLogger("corral.monitors")

BATCH = 500
"""Monitors judged in one transaction."""


def last_judged(
    own: datetime | None,
    others: Sequence[loops.Loop],
    *,
    now: datetime,
    heartbeat: timedelta,
) -> datetime | None:
    """When monitors were last judged, as far as anyone knows: this process's last pass
    (`own`), and each other scheduler's row: now while it beats (it judges as this one
    does), else its last beat. None: never."""
    found = [own] if own is not None else []
    for loop in others:
        if loops.SCHEDULER not in loop.runs:
            continue
        beating = loop.stopped_at is None and loop.beat_at + loops.STALE_BEATS * heartbeat >= now
        found.append(now if beating else loop.beat_at)
    return max(found, default=None)


class Judge:
    """Judges the monitors that are due, a pass at a time (`pass_once`)."""

    def __init__(
        self,
        *,
        store: Store,
        clock: Clock,
        loop_id: str | None = None,
        heartbeat: timedelta = timedelta(seconds=20),
    ) -> None:
        """`loop_id`: this process's row in the loops table (left out of the others')."""
        self.store = store
        self.clock = clock
        self.loop_id = loop_id
        self.heartbeat = heartbeat
        self._judged_at: datetime | None = None

    async def pass_once(self) -> int:
        """Judge every monitor due now: how many were judged."""
        now = self.clock.now()
        last = await self._last_judged(now)
        judged = 0
        while True:
            count, changed = await self.store.monitors.judge(now=now, last_judged=last, limit=BATCH)
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
        self._judged_at = now
        return judged

    async def _last_judged(self, now: datetime) -> datetime | None:
        """When monitors were last judged: this process's last pass when it is recent;
        else the loops table says whether another judged since."""
        own = self._judged_at
        if own is not None and now - own <= monitoring.GAP:
            return own
        others = [loop for loop in await self.store.loops.all() if loop.id != self.loop_id]
        return last_judged(own, others, now=now, heartbeat=self.heartbeat)
