"""Retry budgets: one token bucket per queue (the arithmetic is retry.Budget's)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, func, select, update

from corral import model, retry
from corral.store import dialects
from corral.store.tables import (
    attempts,
    jobs,
    retry_budgets,
)

A, J = model.AttemptState, model.JobState


def budget_take(
    conn: Connection, queue: str, n: int, now: datetime, budget: retry.Budget
) -> list[datetime | None]:
    """Take `n` tokens from `queue`'s bucket; for each, when it is paid for (None: at once)."""
    # A queue's budget starts full; from then on first attempts are counted by fence.
    newest = conn.execute(select(func.coalesce(func.max(attempts.c.id), 0))).scalar_one()
    conn.execute(
        dialects.insert_ignore_conflict(conn, retry_budgets, ["queue"]).values(
            queue=queue, tokens=budget.burst, updated_at=now, counted_fence=newest
        )
    )
    row = conn.execute(
        select(retry_budgets).where(retry_budgets.c.queue == queue).with_for_update()
    ).one()
    bucket = retry.Bucket(row.tokens, row.updated_at, row.counted_fence)
    counted = _firsts_since(conn, queue, bucket, newest, budget)
    tokens = budget.refill(bucket, now, counted)
    ready = []
    for _ in range(n):
        tokens, at = budget.reserve(tokens, now)
        ready.append(at)
    conn.execute(
        update(retry_budgets)
        .where(retry_budgets.c.queue == queue)
        .values(
            tokens=tokens,
            updated_at=max(now, bucket.updated_at),  # two hosts' clocks: never count time twice
            counted_fence=max(newest, bucket.counted_fence),
        )
    )
    return ready


def _firsts_since(
    conn: Connection, queue: str, bucket: retry.Bucket, newest: int, budget: retry.Budget
) -> int:
    """How many first attempts of `queue` started since the bucket's last count, up to
    `newest` (enough of them fill the bucket: it stops there). One started in a transaction
    that commits after this one is not counted: the budget errs on the side of fewer
    retries."""
    firsts = (
        select(attempts.c.id)
        .join(jobs, jobs.c.id == attempts.c.job_id)
        .where(
            attempts.c.id > bucket.counted_fence,
            attempts.c.id <= newest,
            attempts.c.attempt_no == 1,
            jobs.c.queue == queue,
        )
        .limit(budget.firsts_to_fill(bucket.tokens))
        .subquery()
    )
    return int(conn.execute(select(func.count()).select_from(firsts)).scalar_one())


def budget_list(conn: Connection) -> dict[str, retry.Bucket]:
    """Every queue's retry budget as stored (one row per queue that has retried)."""
    rows = conn.execute(select(retry_budgets)).all()
    return {r.queue: retry.Bucket(r.tokens, r.updated_at, r.counted_fence) for r in rows}
