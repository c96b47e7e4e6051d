"""managed on schedules, monitors, tenants' alert channels and rules, flows: made by apply

An object made or changed by `corral apply` (or POST /api/v1/apply) is marked managed, and
`apply --prune` deletes only managed objects that the files no longer hold: one made by
hand is never pruned. None of these objects has labels to carry the mark, hence a column.
Every object stored before this revision was made by hand.

Revision ID: 0035
Revises: 0034
Create Date: 2026-12-08
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0035"
down_revision: str | None = "0034"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("schedules", "monitors", "tenant_alert_channels", "tenant_alert_rules", "flows")


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(
                sa.Column("managed", sa.Boolean(), nullable=False, server_default=sa.false())
            )


def downgrade() -> None:
    for table in reversed(TABLES):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("managed")
