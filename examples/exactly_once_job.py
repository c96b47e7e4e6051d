"""A corral job whose effects are exactly-once, whatever corral relaunches.

It computes a day's sales totals, then:
- upserts them into a table of your database through FencedTable (a stale attempt's rows
  never overwrite a newer one's), and
- publishes the day's detail rows as a partition through Publisher (write-audit-publish:
  readers see one attempt's whole output).

Run it under corral (it reads CORRAL_FENCE and CORRAL_DATABASE_URL from its attempt):

    job="examples/exactly_once_job.py"
    .venv/bin/corral submit -- .venv/bin/python "$job" "$PWD/warehouse" 2026-11-30
    .venv/bin/corral serve
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import sqlalchemy as sa

from corral import current_attempt
from corral.sinks import FencedTable, MinRows, Publisher, UniqueKeys, fence_columns


def main() -> None:
    root, day = Path(sys.argv[1]), sys.argv[2]
    root.mkdir(parents=True, exist_ok=True)
    attempt = current_attempt()
    print(f"job {attempt.job_id} attempt {attempt.attempt_no}, fence {attempt.fence}")

    orders = [
        {"order_id": f"{day}-{i}", "store": f"s{i % 3}", "amount": random.randint(1, 100)}
        for i in range(30)
    ]

    # 1. Write-audit-publish the detail rows.
    partition = Publisher(f"orders/day={day}", root=root)
    partition.stage()
    partition.write_rows("part-0.jsonl", orders)
    pointer = partition.publish(audits=[MinRows(len(orders)), UniqueKeys(["order_id"])])
    print(f"published {pointer.location}")

    # 2. Fenced upserts of the totals into a table of "your" database.
    engine = sa.create_engine(f"sqlite:///{root / 'warehouse.db'}")
    table = sa.Table(
        "store_totals",
        sa.MetaData(),
        sa.Column("day", sa.Text, primary_key=True),
        sa.Column("store", sa.Text, primary_key=True),
        sa.Column("total", sa.Integer, nullable=False),
        *fence_columns(),
    )
    table.metadata.create_all(engine)
    totals: dict[str, int] = {}
    for order in orders:
        totals[order["store"]] = totals.get(order["store"], 0) + order["amount"]
    result = FencedTable(engine, table, key=["day", "store"]).upsert(
        [{"day": day, "store": s, "total": t} for s, t in sorted(totals.items())]
    )
    print(f"totals: {result.applied} applied, {result.refused} refused")
    engine.dispose()


if __name__ == "__main__":
    main()
