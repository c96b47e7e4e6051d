"""An index of jobs by tenant and state, newest first

The dashboard's overview counts a tenant's jobs in each state up to a cap (never a full
count): with ix_jobs_tenant_state (tenant, state, id) that is the tenant's newest jobs in
the state, read from the index alone and stopped at the cap. Without it, the count read
the newest jobs of every tenant in that state and kept the tenant's, which both read
rows and missed a tenant's older jobs.

Run with corral's loops stopped. On PostgreSQL, given a connection outside a transaction
(`corral db upgrade` does that), the index is built CONCURRENTLY, so a large jobs table
is not locked while it builds; one a failed build left invalid is built again.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06
"""

import contextlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = "ix_jobs_tenant_state"
WHAT = "jobs (tenant, state, id)"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        op.execute(f"CREATE INDEX IF NOT EXISTS {NAME} ON {WHAT}")
        return
    concurrently = bool(context.config.attributes.get("concurrent_ddl"))
    how = " CONCURRENTLY" if concurrently else ""
    # Alembic's autocommit block: CONCURRENTLY cannot run inside a transaction.
    outside = op.get_context().autocommit_block() if concurrently else contextlib.nullcontext()
    with outside:
        valid = op.get_bind().execute(
            sa.text(
                "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                " WHERE c.relname = :name"
            ),
            {"name": NAME},
        )
        if valid.scalar() is False:  # a concurrent build that failed half way
            op.execute(f"DROP INDEX{how} IF EXISTS {NAME}")
        op.execute(f"CREATE INDEX{how} IF NOT EXISTS {NAME} ON {WHAT}")


def downgrade() -> None:
    op.execute(f"DROP INDEX IF EXISTS {NAME}")
