"""fenced checkpoints (one per job, written only by its newest attempt), publish
pointers (one per dataset, swapped only to a newer fence), and jobs.code_version

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Json = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.add_column("jobs", sa.Column("code_version", sa.Text(), nullable=True))
    op.create_table(
        "checkpoints",
        sa.Column("job_id", Id, nullable=False),
        sa.Column("fence", Id, nullable=False),
        sa.Column("state", Json, nullable=False),
        sa.Column("saved_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_checkpoints_job_id_jobs"),
        sa.PrimaryKeyConstraint("job_id", name="pk_checkpoints"),
    )

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
    op.drop_table("publish_pointers")
    op.drop_table("checkpoints")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("code_version")
