"""firing_hours and firing_rollups: what each closed hour of a schedule's firings came to

A schedule's page shows its success rate and response times over the last 24 hours and 30
days. Counting them from the firings, their jobs, attempts and run logs at each view costs
as much as the schedule has firings; these two tables keep what each closed hour came to
(one row a schedule and hour that had firings) and how far the hours are closed, so a view
counts only the open hours. Both start empty: a schedule's hours are counted when its stats
are first read.

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-09
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0029"
down_revision: str | None = "0028"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
When = sa.DateTime(timezone=True)
COUNTS = (
    "fired",
    "missed",
    "skipped",
    "overlap",
    "refused",
    "backfilled",
    "succeeded",
    "failed",
    "cancelled",
    "latency_count",
)


def upgrade() -> None:
    op.create_table(
        "firing_hours",
        sa.Column("schedule_id", Id, primary_key=True, autoincrement=False),
        sa.Column("hour", When, primary_key=True),
        *(sa.Column(name, sa.Integer(), nullable=False) for name in COUNTS),
        sa.Column("latency_sum", sa.Float(), nullable=False),
        sa.Column("latency_max", sa.Float()),
    )
    op.create_table(
        "firing_rollups",
        sa.Column("schedule_id", Id, primary_key=True, autoincrement=False),
        sa.Column("counted_until", When),
        sa.Column("version", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("firing_rollups")
    op.drop_table("firing_hours")
