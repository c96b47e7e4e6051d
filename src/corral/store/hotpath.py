"""The dispatcher's hot path, a tick's claim and settle (and a Python worker's claim), as
one interface with one object per database: `POSTGRESQL` (store/postgres/: one statement
each, run on its own in autocommit on the hot path's own async connections, so a tick
costs two round trips) and `SQLITE` (store/sqlite/: a few prepared statements inside the
store's one writer's transaction).

Both keep every promise of the general path (claims.job_claim, completions.attempt_settle):
compare-and-set on every row, an attempt row whose id is the fence, one run-log event per
state change, and the settle's rows locked in fence order before anything is written. The
general path stays for what these do not cover: claims that count pools or tenants'
running jobs, and settles with failures (a failure's decision needs its job, its policy
and its history).
tests/contract/test_hot_paths.py runs the same scenarios through all three and compares
the rows they leave.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from sqlalchemy import Connection

from corral import launching, model, shares
from corral.store.claims import DefaultLimits
from corral.store.postgres.hot import PostgresHotPath
from corral.store.sqlite.hot import SqliteHotPath

if TYPE_CHECKING:
    import psycopg

C = TypeVar("C", contravariant=True)
Claims = TypeVar("Claims", covariant=True)
Settled = TypeVar("Settled", covariant=True)

Won = tuple[int, int | None, str | None]
"""A success to apply: its fence, exit code and reason."""

Ended = tuple[list[int], list[tuple[int, int, int]], list[int]]
"""What a settle did: the fences recorded running, (job id, fence, attempt number) of
each job that succeeded, and the fences of successes it left for the general settle (of
jobs with a callback: store/callbacks.py)."""


class HotPath(Protocol[C, Claims, Settled]):
    """The hot statements of one database, each run on a connection `C` of its own kind;
    PostgreSQL's return coroutines, SQLite's their results."""

    def claim(
        self,
        conn: C,
        /,
        *,
        now: datetime,
        limit: int,
        executors: Sequence[str],
        deadline: float | None,
        lease: float | None,
        weights: shares.Weights,
    ) -> Claims:
        """Claim up to `limit` due jobs of `executors`, shared across tenants by `weights`
        (see claims.job_claim); `deadline` and `lease`: the default limits in seconds,
        both None for none."""

    def worker_claim(
        self,
        conn: C,
        /,
        *,
        worker_id: str,
        reads: Sequence[tuple[str, Sequence[int]]],
        queues: Sequence[str],
        now: datetime,
        limit: int,
        limits: DefaultLimits,
        weights: shares.Weights,
    ) -> Claims:
        """A worker's claim (workers.worker_claim): each attempt recorded running."""

    def settle(
        self,
        conn: C,
        /,
        *,
        launched: Sequence[int],
        won: Sequence[Won],
        now: datetime,
        logs: Mapping[int, launching.RunLog] = ...,
        reason: str = ...,
    ) -> Settled:
        """Record `launched` attempts as running and apply successes `won` and their run
        logs (by fence); a fence in both only succeeds. A success of a job with a callback
        is left as it is, its fence returned."""


POSTGRESQL: HotPath[
    psycopg.AsyncConnection[Any], Awaitable[list[model.Claimed]], Awaitable[Ended]
] = PostgresHotPath()
SQLITE: HotPath[Connection, list[model.Claimed], Ended] = SqliteHotPath()
