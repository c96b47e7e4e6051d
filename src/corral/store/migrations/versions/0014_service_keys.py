"""Service keys

`service_keys` holds the secrets corral's own processes share through the store, by name:
the first process that needs one makes it, every other reads it. `attempts` signs the
attempt tokens a job gets in place of the database URL when the API serves it.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "service_keys",
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("secret", sa.String(200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_service_keys"),
    )


def downgrade() -> None:
    op.drop_table("service_keys")
