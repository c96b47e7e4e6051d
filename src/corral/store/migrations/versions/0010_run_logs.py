"""Run logs: what each attempt left to read, kept as long as its job

`run_logs` has one row per attempt that ended with output to keep: a process's stdout
and stderr tails, an HTTP attempt's request and response (status, latency, the address it
reached). It is written in the transaction that ends the attempt, and removed with the
job when the job's retention is over.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
When = sa.DateTime(timezone=True)
Json = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "run_logs",
        sa.Column("attempt_id", Id, autoincrement=False),
        sa.Column("job_id", Id, nullable=False),
        sa.Column("recorded_at", When, nullable=False),
        sa.Column("latency", sa.Float()),
        sa.Column("status", sa.Integer()),
        sa.Column("address", sa.String(100)),
        sa.Column("streams", Json, nullable=False),
        sa.PrimaryKeyConstraint("attempt_id", name="pk_run_logs"),
    )
    op.create_index("ix_run_logs_job", "run_logs", ["job_id", "attempt_id"])


def downgrade() -> None:
    op.drop_index("ix_run_logs_job", table_name="run_logs")
    op.drop_table("run_logs")
