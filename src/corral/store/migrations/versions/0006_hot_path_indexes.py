"""Indexes fitted to the hot path: partial indexes for queued jobs, running jobs in pools, and for
idempotency keys; no unique launch name (it follows from the job and attempt number) and
no foreign keys (attempts, events and checkpoints are only written for a job the same
write checks); room on each page for updates that stay on it

Run with corral's loops stopped. On PostgreSQL, given a connection outside a transaction
(`corral db upgrade` does that), the new indexes are built CONCURRENTLY, so a large jobs
table is not locked while they build; an index a failed build left invalid is built again.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

import contextlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NEW_INDEXES = {
    "ix_jobs_queued": "jobs (priority DESC, run_at, id) WHERE state = 'queued'",
    "ix_jobs_pooled": "jobs (pool) WHERE state = 'running' AND pool IS NOT NULL",
    "uq_jobs_idempotency": "jobs (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL",
}


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        _postgresql()
    else:
        _sqlite()


def _postgresql() -> None:
    concurrently = bool(context.config.attributes.get("concurrent_ddl"))
    how = " CONCURRENTLY" if concurrently else ""
    # Alembic's autocommit block: CONCURRENTLY cannot run inside a transaction.
    outside = op.get_context().autocommit_block() if concurrently else contextlib.nullcontext()
    with outside:
        for name, what in NEW_INDEXES.items():
            valid = op.get_bind().execute(
                sa.text(
                    "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                    " WHERE c.relname = :name"
                ),
                {"name": name},
            )
            state = valid.scalar()
            if state is False:  # a concurrent build that failed half way
                op.execute(f"DROP INDEX{how} IF EXISTS {name}")
            unique = "UNIQUE " if name.startswith("uq_") else ""
            op.execute(f"CREATE {unique}INDEX{how} IF NOT EXISTS {name} ON {what}")
        op.execute(f"DROP INDEX{how} IF EXISTS ix_jobs_claim")
    op.execute("ALTER TABLE jobs DROP CONSTRAINT IF EXISTS uq_jobs_tenant_idempotency_key")
    op.execute("ALTER TABLE attempts DROP CONSTRAINT IF EXISTS uq_attempts_launch_name")
    op.execute("ALTER TABLE attempts DROP CONSTRAINT IF EXISTS fk_attempts_job_id_jobs")
    op.execute("ALTER TABLE events DROP CONSTRAINT IF EXISTS fk_events_job_id_jobs")
    op.execute("ALTER TABLE checkpoints DROP CONSTRAINT IF EXISTS fk_checkpoints_job_id_jobs")
    # Free room on each page, so an update that changes no indexed column (news of an
    # attempt, a heartbeat) stays on its page and writes no index entry (a HOT update);
    # statistics refreshed after every 2% of change, so a fresh queue gets a good plan.
    for table in ("jobs", "attempts"):
        op.execute(
            f"ALTER TABLE {table} SET (fillfactor = 80, autovacuum_analyze_scale_factor = 0.02)"
        )


def _sqlite() -> None:
    # SQLite changes constraints by copying the table (batch mode): with the loops stopped.
    # The tables that refer to jobs go first, so that jobs can be copied with nothing
    # referring to it.
    with op.batch_alter_table("attempts") as batch:
        batch.drop_constraint("uq_attempts_launch_name", type_="unique")
        batch.drop_constraint("fk_attempts_job_id_jobs", type_="foreignkey")
    with op.batch_alter_table("events") as batch:
        batch.drop_constraint("fk_events_job_id_jobs", type_="foreignkey")
    with op.batch_alter_table("checkpoints") as batch:
        batch.drop_constraint("fk_checkpoints_job_id_jobs", type_="foreignkey")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_constraint("uq_jobs_tenant_idempotency_key", type_="unique")
        batch.drop_index("ix_jobs_claim")
    for name, what in NEW_INDEXES.items():
        unique = "UNIQUE " if name.startswith("uq_") else ""
        op.execute(f"CREATE {unique}INDEX IF NOT EXISTS {name} ON {what}")


def downgrade() -> None:
    for name in NEW_INDEXES:
        op.execute(f"DROP INDEX IF EXISTS {name}")
    op.create_index("ix_jobs_claim", "jobs", ["state", sa.text("priority DESC"), "run_at", "id"])
    with op.batch_alter_table("jobs") as batch:
        batch.create_unique_constraint(
            "uq_jobs_tenant_idempotency_key", ["tenant", "idempotency_key"]
        )
    with op.batch_alter_table("attempts") as batch:
        batch.create_unique_constraint("uq_attempts_launch_name", ["launch_name"])
        batch.create_foreign_key("fk_attempts_job_id_jobs", "jobs", ["job_id"], ["id"])
    with op.batch_alter_table("events") as batch:
        batch.create_foreign_key("fk_events_job_id_jobs", "jobs", ["job_id"], ["id"])
    with op.batch_alter_table("checkpoints") as batch:
        batch.create_foreign_key("fk_checkpoints_job_id_jobs", "jobs", ["job_id"], ["id"])
