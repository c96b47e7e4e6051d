"""The installation: one id for everything this database's corral makes

`installation` holds one row, made here: a random id that every object corral creates
on a cluster carries as the label `corral.dev/installation`, and that every selector it
lists or watches with names. Two corral installations sharing a namespace then never
read, adopt or cancel each other's Jobs and Workflows. The id is made once, by the
database, so every process of one installation reads the same one.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-06
"""

import secrets
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    installation = op.create_table(
        "installation",
        sa.Column("id", sa.String(63), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_installation"),
    )
    op.bulk_insert(installation, [{"id": secrets.token_hex(8)}])


def downgrade() -> None:
    op.drop_table("installation")
