"""schedules.tenant_made: a schedule a tenant made is checked against its grant at firing

A schedule made or changed through the API or the dashboard is its tenant's: each firing
checks that the tenant is still granted the executor its jobs run on, and one whose grant
was withdrawn is recorded as refused and runs nothing. The operator's schedules (the CLI
on the store) are checked by no grant. Every schedule stored before this revision counts
as the operator's: none was checked when it was made.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("schedules") as batch:
        batch.add_column(
            sa.Column("tenant_made", sa.Boolean(), nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    with op.batch_alter_table("schedules") as batch:
        batch.drop_column("tenant_made")
