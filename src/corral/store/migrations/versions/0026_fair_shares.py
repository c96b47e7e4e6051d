"""Fair shares and quotas per tenant: claims by tenant (ix_jobs_queued_tenant and
ix_jobs_scheduled_tenant in place of ix_jobs_queued), each tenant's place in the shares
(tenant_shares) and its submit_rate bucket (tenant_buckets)

Run with corral's loops stopped. On PostgreSQL, given a connection outside a transaction
(`corral db upgrade` does that), the new indexes are built CONCURRENTLY, so a large jobs
table is not locked while they build; an index a failed build left invalid is built again.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-07
"""

import contextlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NEW_INDEXES = {
    "ix_jobs_queued_tenant": "jobs (tenant, priority DESC, run_at, id) WHERE state = 'queued'",
    "ix_jobs_scheduled_tenant": "jobs (tenant, run_at, id) WHERE state = 'scheduled'",
}


def upgrade() -> None:
    op.create_table(
        "tenant_shares",
        sa.Column("tenant", sa.String(200), primary_key=True),
        sa.Column("turn", sa.Float(), nullable=False),
        sa.Column("clock", sa.Float(), nullable=False),
    )
    op.create_table(
        "tenant_buckets",
        sa.Column("tenant", sa.String(200), primary_key=True),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.Column("filled_at", sa.DateTime(timezone=True), nullable=False),
    )
    if op.get_bind().dialect.name == "postgresql":
        _postgresql()
    else:
        for name, what in NEW_INDEXES.items():
            op.execute(f"CREATE INDEX IF NOT EXISTS {name} ON {what}")
        op.execute("DROP INDEX IF EXISTS ix_jobs_queued")


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
            if valid.scalar() is False:  # a concurrent build that failed half way
                op.execute(f"DROP INDEX{how} IF EXISTS {name}")
            op.execute(f"CREATE INDEX{how} IF NOT EXISTS {name} ON {what}")
        op.execute(f"DROP INDEX{how} IF EXISTS ix_jobs_queued")


def downgrade() -> None:
    op.execute(
        "CREATE INDEX IF NOT EXISTS ix_jobs_queued ON jobs (priority DESC, run_at, id)"
        " WHERE state = 'queued'"
    )
    for name in NEW_INDEXES:
        op.execute(f"DROP INDEX IF EXISTS {name}")
    op.drop_table("tenant_buckets")
    op.drop_table("tenant_shares")
