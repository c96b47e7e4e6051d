"""jobs, attempts and events

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Json = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def at(name: str, nullable: bool = False) -> sa.Column:  # type: ignore[type-arg]
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("tenant", sa.String(length=200), nullable=False),
        sa.Column("queue", sa.String(length=200), nullable=False),
        sa.Column("pool", sa.String(length=200), nullable=True),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("executor", sa.String(length=50), nullable=False),
        sa.Column("spec", Json, nullable=False),
        sa.Column("payload", Json, nullable=True),
        sa.Column("state", sa.String(length=20), nullable=False),
        at("run_at"),
        sa.Column("idempotency_key", sa.String(length=500), nullable=True),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("attempt_count", sa.Integer(), nullable=False),
        sa.Column("labels", Json, nullable=False),
        at("created_at"),
        at("updated_at"),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
        sa.UniqueConstraint("tenant", "idempotency_key", name="uq_jobs_tenant_idempotency_key"),
    )
    op.create_index(
        "ix_jobs_claim", "jobs", ["state", sa.literal_column("priority DESC"), "run_at", "id"]
    )
    op.create_table(
        "attempts",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("job_id", Id, nullable=False),
        sa.Column("attempt_no", sa.Integer(), nullable=False),
        sa.Column("launch_name", sa.String(length=63), nullable=False),
        sa.Column("executor", sa.String(length=50), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        at("created_at"),
        at("updated_at"),
        at("started_at", nullable=True),
        at("finished_at", nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        at("last_seen_at", nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_attempts_job_id_jobs"),
        sa.PrimaryKeyConstraint("id", name="pk_attempts"),
        sa.UniqueConstraint("job_id", "attempt_no", name="uq_attempts_job_id_attempt_no"),
        sa.UniqueConstraint("launch_name", name="uq_attempts_launch_name"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_attempts_active", "attempts", ["state", "executor", "id"])
    op.create_table(
        "events",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("job_id", Id, nullable=False),
        sa.Column("attempt_id", Id, nullable=True),
        sa.Column("entity", sa.String(length=10), nullable=False),
        sa.Column("from_state", sa.String(length=20), nullable=True),
        sa.Column("to_state", sa.String(length=20), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        at("at"),
        sa.Column("details", Json, nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_events_job_id_jobs"),
        sa.PrimaryKeyConstraint("id", name="pk_events"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_events_job", "events", ["job_id", "id"])


def downgrade() -> None:
    op.drop_table("events")
    op.drop_table("attempts")
    op.drop_table("jobs")
