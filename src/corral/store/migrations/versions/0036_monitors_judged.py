"""monitors_judged: when monitors were last judged, and by which process

One row, written by every pass of the judge of monitors (corral.monitor_judge): the gap rule
reads it, so that a scheduler started after a crash knows when anything last judged
monitors, and whether that process still runs (its row in loops), however it ended. No row:
monitors were never judged (a database from before this revision too: its first pass gives
each monitor due a fresh period and grace, as a first start does).

Revision ID: 0036
Revises: 0035
Create Date: 2026-12-09
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0036"
down_revision: str | None = "0035"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "monitors_judged",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("judged_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("loop_id", sa.String(32)),
        sa.PrimaryKeyConstraint("id", name="pk_monitors_judged"),
    )


def downgrade() -> None:
    op.drop_table("monitors_judged")
