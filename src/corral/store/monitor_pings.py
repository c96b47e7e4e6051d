"""A monitor's pings: recorded as they come (the ping route's one transaction), the last
PINGS_KEPT kept, and read for its page.

A ping is found by its monitor's key, held (FOR UPDATE on PostgreSQL; SQLite's one writer)
while its window of pings a second is counted, and recorded with its monitor's new place
(corral.monitoring.pinged) in the same transaction: past PINGS_A_SECOND in a second, nothing
is written. Every hundredth ping of a monitor removes its pings past the last PINGS_KEPT.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, delete, insert, select, update

from corral import monitoring
from corral.store import monitors as monitor_rows
from corral.store.tables import monitor_pings, monitors

if TYPE_CHECKING:
    from corral.store.database import Database

M, P = monitors.c, monitor_pings.c
PRUNE_EVERY = 100
"""A monitor's pings past PINGS_KEPT are removed at every this many of its pings."""


@dataclass(frozen=True, slots=True)
class Ping:
    """One ping a monitor recorded."""

    id: int
    at: datetime
    kind: str  # success, start, fail
    exit_code: int | None
    source: str
    user_agent: str
    body: str
    duration_seconds: float | None  # since the /start before it


@dataclass(frozen=True, slots=True)
class Recorded:
    """What became of a ping: no monitor has its key (`found` False), it was one too many
    this second (`limited`), or it was recorded."""

    found: bool
    limited: bool = False
    state: str | None = None  # the monitor's state after it


def _ping(row: Any) -> Ping:
    return Ping(
        row.id,
        row.at,
        row.kind,
        row.exit_code,
        row.source,
        row.user_agent,
        row.body,
        row.duration_seconds,
    )


def ping_record(
    conn: Connection,
    *,
    key: str,
    kind: str,
    exit_code: int | None,
    source: str,
    user_agent: str,
    body: str,
    now: datetime,
) -> Recorded:
    """Record a ping of the monitor whose key is `key`, and where it leaves the monitor."""
    row = conn.execute(select(monitors).where(M.ping_key == key).with_for_update()).first()
    if row is None:
        return Recorded(found=False)
    window = monitoring.rate(row.ping_window_at, row.ping_window_count, now)
    if window is None:
        return Recorded(found=True, limited=True)
    monitor = monitor_rows.monitor_of(row)
    verdict = monitoring.pinged(monitor, kind=kind, exit_code=exit_code, now=now)
    values = _moved(monitor, verdict, kind=kind, window=window, now=now)
    took = None
    if kind != monitoring.START and monitor.run_started_at is not None:
        took = (now - monitor.run_started_at).total_seconds()
    ping = {"at": now, "kind": kind, "exit_code": exit_code, "body": body}
    ping.update(source=source[:100], user_agent=user_agent[:300], duration_seconds=took)
    _written(conn, monitor.id, values, ping)
    if verdict is not None and verdict.change is not None:
        monitor_rows.history(conn, monitor, verdict.change, now)
    if (monitor.ping_count + 1) % PRUNE_EVERY == 0:
        _prune(conn, monitor.id)
    return Recorded(found=True, state=monitor.state if verdict is None else verdict.state)


def _written(
    conn: Connection, monitor_id: int, moved: dict[str, Any], ping: dict[str, Any]
) -> None:
    """The monitor moved and its ping recorded: one statement on PostgreSQL (the update a
    data-modifying CTE of the insert; a round trip less on the ping's path), two on SQLite,
    which has no such CTE."""
    moving = update(monitors).where(M.id == monitor_id).values(**moved)
    recording = insert(monitor_pings).values(monitor_id=monitor_id, **ping)
    if conn.dialect.name == "postgresql":
        conn.execute(recording.add_cte(moving.cte("moved")))
        return
    conn.execute(moving)
    conn.execute(recording)


def _moved(
    monitor: monitoring.Monitor,
    verdict: monitoring.Verdict | None,
    *,
    kind: str,
    window: tuple[datetime, int],
    now: datetime,
) -> dict[str, Any]:
    """What a ping changes of its monitor's row: its window of pings a second, its count,
    its last ping (or, a start, when its run began), and where the verdict leaves it."""
    values: dict[str, Any] = {
        "ping_window_at": window[0],
        "ping_window_count": window[1],
        "ping_count": M.ping_count + 1,
    }
    if kind == monitoring.START:
        values["run_started_at"] = now
    else:
        values.update(last_ping_at=now, run_started_at=None)
    if verdict is not None:
        values.update(
            state=verdict.state,
            basis_at=verdict.basis_at,
            expected_at=verdict.expected_at,
            check_at=verdict.check_at,
        )
        if verdict.state != monitor.state:
            values.update(state_at=now, updated_at=now)
    return values


def _prune(conn: Connection, monitor_id: int) -> None:
    """Remove the monitor's pings past its newest PINGS_KEPT."""
    oldest = (
        select(P.id)
        .where(P.monitor_id == monitor_id)
        .order_by(P.id.desc())
        .offset(monitoring.PINGS_KEPT)
        .limit(1)
        .scalar_subquery()
    )
    conn.execute(delete(monitor_pings).where(P.monitor_id == monitor_id, P.id <= oldest))


def pings_list(conn: Connection, *, monitor_id: int, limit: int) -> list[Ping]:
    """A monitor's pings, the newest first, at most `limit` (and PINGS_KEPT)."""
    most = min(limit, monitoring.PINGS_KEPT)
    rows = conn.execute(
        select(monitor_pings).where(P.monitor_id == monitor_id).order_by(P.id.desc()).limit(most)
    )
    return [_ping(r) for r in rows]


# --- the handle ----------------------------------------------------------------------------


class MonitorPings:
    """The store's handle on monitors' pings (`store.monitor_pings`).

    Each method runs the store function its name says, in one transaction; that
    function's docstring says what the call does.
    """

    def __init__(self, db: Database) -> None:
        self._db = db

    async def record(
        self,
        *,
        key: str,
        kind: str,
        exit_code: int | None,
        source: str,
        user_agent: str,
        body: str,
        now: datetime,
    ) -> Recorded:
        return await self._db.tx(
            functools.partial(
                ping_record,
                key=key,
                kind=kind,
                exit_code=exit_code,
                source=source,
                user_agent=user_agent,
                body=body,
                now=now,
            )
        )

    async def newest(self, *, monitor_id: int, limit: int) -> list[Ping]:
        return await self._db.read(
            functools.partial(pings_list, monitor_id=monitor_id, limit=limit)
        )
