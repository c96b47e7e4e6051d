"""Bulk operations

A bulk action (retry, cancel or discard the jobs a filter matched) runs on the snapshot of
ids its preview showed, not on the filter read again: `operations` holds one row an action
(what, for which tenant, by whom, the filter as asked, how far it has come) and
`operation_items` one row a job of its snapshot, marked when done (applied, or skipped
because the job no longer fits the action), so an operation cut short by a restart goes on
where it stopped.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
When = sa.DateTime(timezone=True)
Json = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "operations",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.String(200)),
        sa.Column("action", sa.String(20), nullable=False),
        sa.Column("filter", Json, nullable=False),
        sa.Column("state", sa.String(20), nullable=False),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("applied", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("skipped", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("token_id", Id),
        sa.Column("made_by", sa.String(200), nullable=False),
        sa.Column("created_at", When, nullable=False),
        sa.Column("updated_at", When, nullable=False),
        sa.Column("finished_at", When),
        sa.PrimaryKeyConstraint("id", name="pk_operations"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_operations_state", "operations", ["state", "id"])
    op.create_table(
        "operation_items",
        sa.Column("operation_id", Id, nullable=False),
        sa.Column("job_id", Id, nullable=False),
        sa.Column("outcome", sa.String(20)),
        sa.Column("note", sa.String(300)),
        sa.Column("done_at", When),
        sa.PrimaryKeyConstraint("operation_id", "job_id", name="pk_operation_items"),
        sa.ForeignKeyConstraint(
            ["operation_id"],
            ["operations.id"],
            name="fk_operation_items_operation_id_operations",
            ondelete="CASCADE",
        ),
    )
    op.create_index(
        "ix_operation_items_todo",
        "operation_items",
        ["operation_id", "job_id"],
        postgresql_where=sa.text("done_at IS NULL"),
        sqlite_where=sa.text("done_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_operation_items_todo", table_name="operation_items")
    op.drop_table("operation_items")
    op.drop_index("ix_operations_state", table_name="operations")
    op.drop_table("operations")
