"""Schedules and their firings, and an index of jobs waiting for their time

`schedules` holds each schedule's rule and job template and its next nominal time;
`firings` one row per nominal time recorded, unique on (schedule, nominal time): the fence
that lets any number of schedulers run. ix_schedules_due holds only schedules that are
neither paused nor ended; ix_jobs_scheduled only jobs in `scheduled`.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
When = sa.DateTime(timezone=True)
Json = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.String(200), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("cron", sa.String(200)),
        sa.Column("tz", sa.String(64), nullable=False),
        sa.Column("every_seconds", sa.BigInteger()),
        sa.Column("anchor", When, nullable=False),
        sa.Column("template", Json, nullable=False),
        sa.Column("catchup", sa.String(10), nullable=False),
        sa.Column("catchup_window_seconds", sa.Float(), nullable=False),
        sa.Column("catchup_max", sa.Integer(), nullable=False),
        sa.Column("overlap", sa.String(10), nullable=False),
        sa.Column("jitter_seconds", sa.Float(), nullable=False),
        sa.Column("until", When),
        sa.Column("paused_at", When),
        sa.Column("next_due", When),
        sa.Column("last_nominal", When),
        sa.Column("last_job_id", Id),
        sa.Column("missed_total", sa.BigInteger(), nullable=False),
        sa.Column("created_at", When, nullable=False),
        sa.Column("updated_at", When, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_schedules"),
        sa.UniqueConstraint("tenant", "name", name="uq_schedules_tenant_name"),
        sqlite_autoincrement=True,
    )
    due = sa.text("paused_at IS NULL AND next_due IS NOT NULL")
    op.create_index(
        "ix_schedules_due", "schedules", ["next_due"], sqlite_where=due, postgresql_where=due
    )
    op.create_table(
        "firings",
        sa.Column("schedule_id", Id, nullable=False),
        sa.Column("nominal_at", When, nullable=False),
        sa.Column("outcome", sa.String(20), nullable=False),
        sa.Column("job_id", Id),
        sa.Column("recorded_at", When, nullable=False),
        sa.Column("lateness_seconds", sa.Float(), nullable=False),
        sa.Column("note", sa.Text()),
        sa.UniqueConstraint("schedule_id", "nominal_at", name="uq_firings_schedule_id_nominal_at"),
    )
    scheduled = sa.text("state = 'scheduled'")
    op.create_index(
        "ix_jobs_scheduled",
        "jobs",
        ["run_at"],
        sqlite_where=scheduled,
        postgresql_where=scheduled,
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_scheduled", table_name="jobs")
    op.drop_table("firings")
    op.drop_index("ix_schedules_due", table_name="schedules")
    op.drop_table("schedules")
