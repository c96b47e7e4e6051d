"""monitors, monitor_pings and monitor_changes: the dead man's switch for crons that run
elsewhere

A monitor of a tenant (unique on tenant and name, its ping URL's key unique), the pings it
recorded (the last 1,000 kept) and the changes of its state; the judge reads the monitors
whose check time came (ix_monitors_check_at).

Revision ID: 0033
Revises: 0032
Create Date: 2026-12-08
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0033"
down_revision: str | None = "0032"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Json = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
When = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "monitors",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.String(200), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("ping_key", sa.String(36), nullable=False),
        sa.Column("period_seconds", sa.Integer()),
        sa.Column("cron", sa.String(200)),
        sa.Column("tz", sa.String(64), nullable=False),
        sa.Column("grace_seconds", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(10), nullable=False),
        sa.Column("state_at", When, nullable=False),
        sa.Column("basis_at", When, nullable=False),
        sa.Column("expected_at", When),
        sa.Column("check_at", When),
        sa.Column("last_ping_at", When),
        sa.Column("run_started_at", When),
        sa.Column("ping_window_at", When),
        sa.Column("ping_window_count", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("ping_count", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        sa.Column("rule", sa.String(100)),
        sa.Column("created_at", When, nullable=False),
        sa.Column("updated_at", When, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_monitors"),
        sa.UniqueConstraint("ping_key", name="uq_monitors_ping_key"),
        sa.UniqueConstraint("tenant", "name", name="uq_monitors_tenant_name"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_monitors_check_at", "monitors", ["check_at"])
    op.create_table(
        "monitor_pings",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("monitor_id", Id, nullable=False),
        sa.Column("at", When, nullable=False),
        sa.Column("kind", sa.String(10), nullable=False),
        sa.Column("exit_code", sa.Integer()),
        sa.Column("source", sa.String(100), nullable=False),
        sa.Column("user_agent", sa.String(300), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("duration_seconds", sa.Float()),
        sa.PrimaryKeyConstraint("id", name="pk_monitor_pings"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_monitor_pings_monitor_id", "monitor_pings", ["monitor_id", "id"])
    op.create_table(
        "monitor_changes",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("monitor_id", Id, nullable=False),
        sa.Column("at", When, nullable=False),
        sa.Column("from_state", sa.String(10), nullable=False),
        sa.Column("to_state", sa.String(10), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("details", Json, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_monitor_changes"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_monitor_changes_monitor_id", "monitor_changes", ["monitor_id", "id"])


def downgrade() -> None:
    op.drop_table("monitor_changes")
    op.drop_table("monitor_pings")
    op.drop_table("monitors")
