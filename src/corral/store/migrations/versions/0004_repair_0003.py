"""repair databases migrated by an earlier 0003: add publish_pointers and
jobs.code_version where they are missing

Migration 0003 changed after it had landed: its first version made only the checkpoints
table. A database upgraded then is stamped 0003 and lacks what the later text of 0003
adds. This revision adds whatever of it is missing, and does nothing where it exists.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    if "code_version" not in {c["name"] for c in inspector.get_columns("jobs")}:
        op.add_column("jobs", sa.Column("code_version", sa.Text(), nullable=True))
    if not inspector.has_table("publish_pointers"):
        op.create_table(
            "publish_pointers",
            sa.Column("dataset", sa.String(length=500), nullable=False),
            sa.Column("fence", Id, nullable=False),
            sa.Column("location", sa.Text(), nullable=False),
            sa.Column("code_version", sa.Text(), nullable=True),
            sa.Column("published_at", sa.DateTime(timezone=True), nullable=False),
            sa.PrimaryKeyConstraint("dataset", name="pk_publish_pointers"),
        )


def downgrade() -> None:
    """Nothing: what this revision adds belongs to 0003, whose downgrade removes it."""
