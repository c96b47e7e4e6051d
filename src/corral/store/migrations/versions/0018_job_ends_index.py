"""Job ends by time: ix_events_job_ends on events (at, to_state, job_id), holding only the
events that moved a job to succeeded, failed or quarantined

The dashboard's overview charts throughput and failures per minute over the last hour and
per hour over the last day, by counting those events since the window's start. The events
table had no index on `at`: each chart read every event there ever was. The partial index
holds only job ends (a fraction of the events) in time order, with what the count needs
(the state it moved to, and the job, for a tenant's), so a window reads its own rows only.

Run with corral's loops stopped. On PostgreSQL, given a connection outside a transaction
(`corral db upgrade` does that), the index is built CONCURRENTLY, so a large events table
is not locked while it builds; an index a failed build left invalid is built again.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06
"""

import contextlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ENDS = (
    "events (at, to_state, job_id)"
    " WHERE entity = 'job' AND to_state IN ('succeeded', 'failed', 'quarantined')"
)


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        op.execute(f"CREATE INDEX IF NOT EXISTS ix_events_job_ends ON {ENDS}")
        return
    concurrently = bool(context.config.attributes.get("concurrent_ddl"))
    how = " CONCURRENTLY" if concurrently else ""
    # Alembic's autocommit block: CONCURRENTLY cannot run inside a transaction.
    outside = op.get_context().autocommit_block() if concurrently else contextlib.nullcontext()
    with outside:
        valid = op.get_bind().execute(
            sa.text(
                "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                " WHERE c.relname = 'ix_events_job_ends'"
            )
        )
        if valid.scalar() is False:  # a concurrent build that failed half way
            op.execute(f"DROP INDEX{how} IF EXISTS ix_events_job_ends")
        op.execute(f"CREATE INDEX{how} IF NOT EXISTS ix_events_job_ends ON {ENDS}")


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS ix_events_job_ends")
