"""The loops table: every long-running corral process's pulse, the warnings of work nobody
can do, and the blind attempts a loop sent.

A process writes its row at start (`loop_register`), beats it every heartbeat_interval
(`loop_beat`), and marks it stopped at a clean stop; a row silent for a day is forgotten
(`loops_forget`). What is alive is decided from these rows elsewhere (corral.loops); here
are only the reads and writes, and `Loops`, the store's handle for them (`store.loops`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, delete, exists, func, insert, select, update

from corral import model
from corral.store import attempt_ends, dialects
from corral.store.rows import attempt_from_row, state_is
from corral.store.tables import DUE as SCHEDULE_DUE
from corral.store.tables import SENT, attempts, jobs, loop_warnings, loops, schedules

if TYPE_CHECKING:
    from corral.store.database import Database

J = model.JobState


@dataclass(frozen=True, slots=True)
class Loop:
    """One long-running corral process, as its row says."""

    id: str
    kind: str  # the command: serve, dispatcher, reconciler, scheduler, alerter, worker, api
    runs: tuple[str, ...]  # the loops it runs (dispatcher, reconciler, scheduler, ...)
    executors: tuple[str, ...]  # the executors it dispatches (empty: none)
    host: str
    pid: int
    pid_started: str | None  # the kernel's start time of `pid`, where it is known
    version: str
    started_at: datetime
    beat_at: datetime
    stopped_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Warning:
    """One time a condition of work nobody can do began (and, once over, ended)."""

    id: int
    condition: str
    message: str
    begun_at: datetime
    checked_at: datetime
    ended_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Waiting:
    """Work waiting that only some loop can do, as the store shows it now."""

    schedules_due: int  # schedules (not paused, not ended) whose next time has come
    tasks_parked: int  # Python tasks' jobs parked: no live worker reads them


def _loop(row: Any) -> Loop:
    values = dict(row._mapping)
    values["runs"], values["executors"] = tuple(values["runs"]), tuple(values["executors"])
    return Loop(**values)


def _warning(row: Any) -> Warning:
    return Warning(**row._mapping)


def _values(loop: Loop) -> dict[str, Any]:
    return {
        "id": loop.id,
        "kind": loop.kind,
        "runs": list(loop.runs),
        "executors": list(loop.executors),
        "host": loop.host,
        "pid": loop.pid,
        "pid_started": loop.pid_started,
        "version": loop.version,
        "started_at": loop.started_at,
        "beat_at": loop.beat_at,
        "stopped_at": loop.stopped_at,
    }


def loop_register(conn: Connection, *, loop: Loop) -> None:
    """Write `loop`'s row (again, whole, when it was forgotten while the process ran)."""
    conn.execute(delete(loops).where(loops.c.id == loop.id))
    conn.execute(insert(loops).values(**_values(loop)))


def loop_beat(conn: Connection, *, loop_id: str, now: datetime) -> bool:
    """The loop is alive now; False when its row is gone (forgotten: register again)."""
    done = conn.execute(
        update(loops).where(loops.c.id == loop_id).values(beat_at=now, stopped_at=None)
    )
    return bool(done.rowcount)


def loop_stop(conn: Connection, *, loop_id: str, now: datetime) -> None:
    """The loop stopped cleanly: its row stays (until forgotten), marked stopped."""
    conn.execute(update(loops).where(loops.c.id == loop_id).values(beat_at=now, stopped_at=now))


def loops_forget(conn: Connection, *, before: datetime, warnings_before: datetime) -> int:
    """Forget the rows of loops silent since `before`, and the warnings that ended before
    `warnings_before`; how many loops."""
    conn.execute(delete(loop_warnings).where(loop_warnings.c.ended_at < warnings_before))
    return int(conn.execute(delete(loops).where(loops.c.beat_at < before)).rowcount)


def loop_list(conn: Connection) -> list[Loop]:
    """Every loop the table holds, the newest beat first."""
    rows = conn.execute(select(loops).order_by(loops.c.beat_at.desc(), loops.c.id))
    return [_loop(r) for r in rows]


def work_waiting(conn: Connection, *, now: datetime, most: int = 100) -> Waiting:
    """What is waiting for a scheduler or a worker now: each counted up to `most` (a
    count of a large backlog would cost more than whether there is one), from an index."""
    due = (
        select(schedules.c.id).where(SCHEDULE_DUE, schedules.c.next_due <= now).limit(most)
    ).subquery()
    # Parked jobs are Python tasks' only: a task no live worker reads is parked at submit
    # and by recovery, so with no worker at all, every waiting task is here.
    tasks = (select(jobs.c.id).where(jobs.c.state == state_is(J.PARKED)).limit(most)).subquery()
    return Waiting(
        schedules_due=int(conn.execute(select(func.count()).select_from(due)).scalar_one()),
        tasks_parked=int(conn.execute(select(func.count()).select_from(tasks)).scalar_one()),
    )


def attempts_sent_by(
    conn: Connection, *, senders: Sequence[str], limit: int
) -> list[tuple[model.Attempt, str]]:
    """Running attempts sent by one of `senders`, each with its sender, the oldest first,
    at most `limit`."""
    if not senders:
        return []
    stmt = (
        select(attempts)
        .where(
            SENT,  # read from ix_attempts_sent_by
            attempts.c.sent_by.in_(list(senders)),
        )
        .order_by(attempts.c.id)
        .limit(limit)
    )
    return [(attempt_from_row(r._mapping), r.sent_by) for r in conn.execute(stmt)]


# --- warnings ------------------------------------------------------------------------------


def warnings_update(
    conn: Connection,
    *,
    holding: Mapping[str, str],
    judged: Sequence[str],
    now: datetime,
    unchecked_before: datetime,
) -> list[Warning]:
    """Record what the caller judged of the conditions in `judged`: those in `holding` (by
    condition, its message) hold now, the others do not. A condition that holds and has
    no open warning begins one; one that does not hold ends its open warning; an open
    warning nobody has judged since `unchecked_before` ends too (whoever judged it is
    gone). Returns the warnings begun here: each begins once, however many processes see
    it at once (the open one is unique per condition)."""
    conn.execute(
        update(loop_warnings)
        .where(
            loop_warnings.c.ended_at.is_(None),
            (loop_warnings.c.condition.in_([c for c in judged if c not in holding]))
            | (loop_warnings.c.checked_at < unchecked_before),
        )
        .values(ended_at=now)
    )
    if holding:
        conn.execute(
            update(loop_warnings)
            .where(loop_warnings.c.ended_at.is_(None), loop_warnings.c.condition.in_(holding))
            .values(checked_at=now)
        )
    begun = [_warning_begin(conn, c, message, now) for c, message in sorted(holding.items())]
    return [w for w in begun if w is not None]


def _warning_begin(conn: Connection, condition: str, message: str, now: datetime) -> Warning | None:
    """Begin a warning of `condition` unless one is open (None then, or when another
    process began it at the same moment)."""
    is_open = exists().where(
        loop_warnings.c.condition == condition, loop_warnings.c.ended_at.is_(None)
    )
    if conn.execute(select(is_open)).scalar():
        return None
    stmt = dialects.insert_ignore_conflict(
        conn, loop_warnings, ["condition"], where=loop_warnings.c.ended_at.is_(None)
    ).values(condition=condition, message=message, begun_at=now, checked_at=now)
    row = conn.execute(stmt.returning(*loop_warnings.c)).first()
    return None if row is None else _warning(row)


def warning_list(conn: Connection, *, open_only: bool = False, limit: int = 50) -> list[Warning]:
    """Warnings, the newest first: the open ones only, or every one kept."""
    stmt = select(loop_warnings).order_by(loop_warnings.c.id.desc()).limit(limit)
    if open_only:
        stmt = stmt.where(loop_warnings.c.ended_at.is_(None))
    return [_warning(r) for r in conn.execute(stmt)]


# --- the handle ----------------------------------------------------------------------------


class Loops:
    """The store's handle on the loops table (`store.loops`): each call one transaction."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def register(self, *, loop: Loop) -> None:
        await self._db.tx(functools.partial(loop_register, loop=loop))

    async def beat(self, *, loop_id: str, now: datetime) -> bool:
        return await self._db.tx(functools.partial(loop_beat, loop_id=loop_id, now=now))

    async def stop(self, *, loop_id: str, now: datetime) -> None:
        await self._db.tx(functools.partial(loop_stop, loop_id=loop_id, now=now))

    async def forget(self, *, before: datetime, warnings_before: datetime) -> int:
        return await self._db.tx(
            functools.partial(loops_forget, before=before, warnings_before=warnings_before)
        )

    async def all(self) -> list[Loop]:
        return await self._db.lookup(loop_list)

    async def waiting(self, *, now: datetime) -> Waiting:
        return await self._db.read(functools.partial(work_waiting, now=now))

    async def sent_by(
        self, *, senders: Sequence[str], limit: int
    ) -> list[tuple[model.Attempt, str]]:
        return await self._db.read(
            functools.partial(attempts_sent_by, senders=senders, limit=limit)
        )

    async def lost_with_sender(
        self, *, fences: Sequence[int], now: datetime, why: str
    ) -> list[int]:
        return await self._db.tx(
            functools.partial(
                attempt_ends.attempt_lost_with_sender, fences=fences, now=now, why=why
            )
        )

    async def warnings_update(
        self,
        *,
        holding: Mapping[str, str],
        judged: Sequence[str],
        now: datetime,
        unchecked_before: datetime,
    ) -> list[Warning]:
        return await self._db.tx(
            functools.partial(
                warnings_update,
                holding=holding,
                judged=judged,
                now=now,
                unchecked_before=unchecked_before,
            )
        )

    async def warnings(self, *, open_only: bool = False, limit: int = 50) -> list[Warning]:
        return await self._db.lookup(
            functools.partial(warning_list, open_only=open_only, limit=limit)
        )
