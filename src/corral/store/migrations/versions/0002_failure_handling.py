"""job policies, attempt deadlines, leases and failure classes, retry budgets

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Json = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def at(name: str, nullable: bool = True) -> sa.Column:  # type: ignore[type-arg]
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.add_column("jobs", sa.Column("policy", Json, nullable=False, server_default=sa.text("'{}'")))
    op.add_column("attempts", at("deadline_at"))
    op.add_column("attempts", at("lease_until"))
    op.add_column("attempts", sa.Column("lease_seconds", sa.Float(), nullable=True))
    op.add_column("attempts", sa.Column("failure_class", sa.String(length=20), nullable=True))
    op.add_column("attempts", sa.Column("fingerprint", sa.String(length=64), nullable=True))
    op.create_table(
        "retry_budgets",
        sa.Column("queue", sa.String(length=200), nullable=False),
        sa.Column("tokens", sa.Float(), nullable=False),
        at("updated_at", nullable=False),
        sa.Column("counted_fence", Id, nullable=False),
        sa.PrimaryKeyConstraint("queue", name="pk_retry_budgets"),
    )


def downgrade() -> None:
    op.drop_table("retry_budgets")
    with op.batch_alter_table("attempts") as batch:
        for column in (
            "fingerprint",
            "failure_class",
            "lease_seconds",
            "lease_until",
            "deadline_at",
        ):
            batch.drop_column(column)
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("policy")
