"""Alerts: the outbox of messages to people, the alerter's cursor, and muted rules

`alerts` has one row per message per channel, unique on its dedupe key (rule, subject,
cause and what it is about, and the channel): the alerter writes them in the transaction
that moves its cursor over the events they come from, so a crash neither loses one nor
makes one twice. A row is pending until delivered (or given up); `alert_tries` records
every try. `alert_cursors` holds how far each reader of the events has come;
`alert_streaks` how many jobs of a subject ended badly in a row (consecutive_failures);
`alert_mutes` the rules muted until a time; `job_slas` when each job with an SLA must have
succeeded by, until the reconciler has looked at it then.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
When = sa.DateTime(timezone=True)
Json = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "alerts",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("dedupe_key", sa.String(500), nullable=False),
        sa.Column("rule", sa.String(200), nullable=False),
        sa.Column("channel", sa.String(200), nullable=False),
        sa.Column("kind", sa.String(20), nullable=False),
        sa.Column("cause", sa.String(40), nullable=False),
        sa.Column("subject", sa.String(300), nullable=False),
        sa.Column("job_id", Id),
        sa.Column("details", Json, nullable=False),
        sa.Column("state", sa.String(20), nullable=False),
        sa.Column("created_at", When, nullable=False),
        sa.Column("due_at", When, nullable=False),
        sa.Column("tries", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.Text()),
        sa.Column("delivered_at", When),
        sa.PrimaryKeyConstraint("id", name="pk_alerts"),
        sa.UniqueConstraint("dedupe_key", name="uq_alerts_dedupe_key"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_alerts_subject", "alerts", ["rule", "subject", "id"])
    pending = sa.text("state = 'pending'")
    op.create_index(
        "ix_alerts_pending",
        "alerts",
        ["due_at"],
        sqlite_where=pending,
        postgresql_where=pending,
    )
    op.create_table(
        "alert_tries",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("alert_id", Id, nullable=False),
        sa.Column("at", When, nullable=False),
        sa.Column("ok", sa.Boolean(), nullable=False),
        sa.Column("error", sa.Text()),
        sa.PrimaryKeyConstraint("id", name="pk_alert_tries"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_alert_tries_alert", "alert_tries", ["alert_id", "id"])
    op.create_table(
        "alert_cursors",
        sa.Column("name", sa.String(50), nullable=False),
        sa.Column("event_id", Id, nullable=False),
        sa.Column("updated_at", When, nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_alert_cursors"),
    )
    op.create_table(
        "alert_streaks",
        sa.Column("rule", sa.String(200), nullable=False),
        sa.Column("subject", sa.String(300), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("rule", "subject", name="pk_alert_streaks"),
    )
    op.create_table(
        "job_slas",
        sa.Column("job_id", Id, autoincrement=False),
        sa.Column("due_at", When, nullable=False),
        sa.PrimaryKeyConstraint("job_id", name="pk_job_slas"),
    )
    op.create_index("ix_job_slas_due_at", "job_slas", ["due_at"])
    op.create_table(
        "alert_mutes",
        sa.Column("rule", sa.String(200), nullable=False),
        sa.Column("until", When, nullable=False),
        sa.Column("muted_at", When, nullable=False),
        sa.PrimaryKeyConstraint("rule", name="pk_alert_mutes"),
    )


def downgrade() -> None:
    op.drop_table("alert_mutes")
    op.drop_index("ix_job_slas_due_at", table_name="job_slas")
    op.drop_table("job_slas")
    op.drop_table("alert_streaks")
    op.drop_table("alert_cursors")
    op.drop_index("ix_alert_tries_alert", table_name="alert_tries")
    op.drop_table("alert_tries")
    op.drop_index("ix_alerts_pending", table_name="alerts")
    op.drop_index("ix_alerts_subject", table_name="alerts")
    op.drop_table("alerts")
