"""Every loop's pulse: the loops table, its warnings, and who sent each blind attempt

`loops` holds one row a long-running corral process (serve, dispatcher, reconciler,
scheduler, alerter, worker, api): its kind, the loops it runs, the executors it
dispatches, its host, pid and that pid's mark (its pid namespace and the kernel's start
time of it, so a pid reused by another process is told apart), its version, when it
started, when it last beat (every timeouts.heartbeat_interval) and when it stopped
cleanly. A row silent for a day is forgotten.

`loop_warnings` holds one row each time a condition of work nobody can do begins
(schedules due and no scheduler beating, Python tasks waiting and no worker, alert rules
and no alerter), until it ends; at most one open row a condition (a partial unique index),
so many processes that see it begin write it once.

`attempts.sent_by` is the loop that recorded a blind attempt (an HTTP request, recorded
running before it is sent) and sent it: once that loop is known dead, recovery ends the
attempt lost at once instead of after recovery_grace. A partial index holds the running
ones that have a sender (few), which is how recovery finds a dead sender's attempts.

Run with corral's loops stopped. On PostgreSQL, given a connection outside a transaction
(`corral db upgrade` does that), the attempts index is built CONCURRENTLY.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-07
"""

import contextlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import postgresql

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Json = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
When = sa.DateTime(timezone=True)
SENT_BY = "attempts (sent_by) WHERE state = 'running' AND sent_by IS NOT NULL"


def upgrade() -> None:
    op.create_table(
        "loops",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("kind", sa.String(20), nullable=False),
        sa.Column("runs", Json, nullable=False),
        sa.Column("executors", Json, nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("pid_started", sa.String(40)),
        sa.Column("version", sa.String(50), nullable=False),
        sa.Column("started_at", When, nullable=False),
        sa.Column("beat_at", When, nullable=False),
        sa.Column("stopped_at", When),
        sa.PrimaryKeyConstraint("id", name="pk_loops"),
    )
    op.create_table(
        "loop_warnings",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("condition", sa.String(40), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("begun_at", When, nullable=False),
        sa.Column("checked_at", When, nullable=False),
        sa.Column("ended_at", When),
        sa.PrimaryKeyConstraint("id", name="pk_loop_warnings"),
    )
    op.create_index(
        "uq_loop_warnings_open",
        "loop_warnings",
        ["condition"],
        unique=True,
        sqlite_where=sa.text("ended_at IS NULL"),
        postgresql_where=sa.text("ended_at IS NULL"),
    )
    op.add_column("attempts", sa.Column("sent_by", sa.String(32)))
    if op.get_bind().dialect.name != "postgresql":
        op.execute(f"CREATE INDEX IF NOT EXISTS ix_attempts_sent_by ON {SENT_BY}")
        return
    concurrently = bool(context.config.attributes.get("concurrent_ddl"))
    how = " CONCURRENTLY" if concurrently else ""
    # Alembic's autocommit block: CONCURRENTLY cannot run inside a transaction.
    outside = op.get_context().autocommit_block() if concurrently else contextlib.nullcontext()
    with outside:
        valid = op.get_bind().execute(
            sa.text(
                "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                " WHERE c.relname = 'ix_attempts_sent_by'"
            )
        )
        if valid.scalar() is False:  # a concurrent build that failed half way
            op.execute(f"DROP INDEX{how} IF EXISTS ix_attempts_sent_by")
        op.execute(f"CREATE INDEX{how} IF NOT EXISTS ix_attempts_sent_by ON {SENT_BY}")


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS ix_attempts_sent_by")
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("sent_by")
    op.drop_index("uq_loop_warnings_open", table_name="loop_warnings")
    op.drop_table("loop_warnings")
    op.drop_table("loops")
