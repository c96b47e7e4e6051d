"""schedules.pause_after, paused_reason and counted_from: a schedule that keeps failing pauses

A schedule with `pause_after` N (NULL: its tenant's default, `[tenants.NAME] pause_after`;
0: never) is paused by the scheduler once its last N counted firings' jobs ended failed or
quarantined; `paused_reason` says why a schedule is paused (NULL: paused by hand), and
`counted_from` is when it was last resumed: firings recorded before it never count again.
Every schedule stored before this revision takes its tenant's default, which is 0 unless
the operator sets one.

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0030"
down_revision: str | None = "0029"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("schedules") as batch:
        batch.add_column(sa.Column("pause_after", sa.Integer()))
        batch.add_column(sa.Column("paused_reason", sa.Text()))
        batch.add_column(sa.Column("counted_from", sa.DateTime(timezone=True)))


def downgrade() -> None:
    with op.batch_alter_table("schedules") as batch:
        batch.drop_column("counted_from")
        batch.drop_column("paused_reason")
        batch.drop_column("pause_after")
