"""jobs.tenant_made: a job a tenant made runs as a stranger to corral, whatever its grant

A job submitted (or re-run) through the API or the dashboard, or fired by a schedule a
tenant made, is its tenant's: a process job of it runs as a stranger to corral
(executors.process.uid_range or .sandbox), and never as corral's own user, even once the
tenant's `process` grant is withdrawn (it is then refused at launch). The operator's jobs
(the CLI on the store) are not. Every job stored before this revision counts as the
operator's: no tenant could submit a process job before then.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(
            sa.Column("tenant_made", sa.Boolean(), nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("tenant_made")
