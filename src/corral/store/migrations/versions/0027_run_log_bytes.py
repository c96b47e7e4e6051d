"""run_logs.tenant, .bytes and .trimmed_at: each tenant's run-log bytes, read in one place

A tenant keeps at most its `run_log_bytes` of run logs; the reconciler trims the oldest
finished jobs' logs past it. Each run log now says its job's tenant and its size (the UTF-8
bytes of its streams' text), so what a tenant keeps is one read of ix_run_logs_tenant, and
when it was trimmed (its streams emptied, its facts kept). Rows stored before this revision
are given both from their job and their streams here.

Run with corral's loops stopped. On PostgreSQL, given a connection outside a transaction
(`corral db upgrade` does that), the new index is built CONCURRENTLY; one a failed build
left invalid is built again.

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-08
"""

import contextlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_run_logs_tenant"
ON = "run_logs (tenant, bytes)"

FILLED = {
    "postgresql": (
        "UPDATE run_logs AS r SET tenant = j.tenant, bytes = (SELECT"
        " coalesce(sum(octet_length(s.value ->> 'text')), 0)"
        " FROM jsonb_array_elements(r.streams) AS s)"
        " FROM jobs AS j WHERE j.id = r.job_id"
    ),
    "sqlite": (
        "UPDATE run_logs SET tenant = coalesce((SELECT jobs.tenant FROM jobs"
        " WHERE jobs.id = run_logs.job_id), ''), bytes = (SELECT"
        " coalesce(sum(length(CAST(json_extract(value, '$.text') AS BLOB))), 0)"
        " FROM json_each(run_logs.streams))"
    ),
}
"""Each stored run log given its job's tenant and the UTF-8 bytes of its streams' text."""


def upgrade() -> None:
    with op.batch_alter_table("run_logs") as batch:
        batch.add_column(
            sa.Column("tenant", sa.String(200), nullable=False, server_default=sa.text("''"))
        )
        batch.add_column(
            sa.Column("bytes", sa.BigInteger(), nullable=False, server_default=sa.text("0"))
        )
        batch.add_column(sa.Column("trimmed_at", sa.DateTime(timezone=True)))
    bind = op.get_bind()
    op.execute(FILLED[bind.dialect.name])
    if bind.dialect.name != "postgresql":
        op.execute(f"CREATE INDEX IF NOT EXISTS {INDEX} ON {ON}")
        return
    concurrently = bool(context.config.attributes.get("concurrent_ddl"))
    how = " CONCURRENTLY" if concurrently else ""
    # Alembic's autocommit block: CONCURRENTLY cannot run inside a transaction.
    outside = op.get_context().autocommit_block() if concurrently else contextlib.nullcontext()
    with outside:
        valid = bind.execute(
            sa.text(
                "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                " WHERE c.relname = :name"
            ),
            {"name": INDEX},
        )
        if valid.scalar() is False:  # a concurrent build that failed half way
            op.execute(f"DROP INDEX{how} IF EXISTS {INDEX}")
        op.execute(f"CREATE INDEX{how} IF NOT EXISTS {INDEX} ON {ON}")


def downgrade() -> None:
    op.execute(f"DROP INDEX IF EXISTS {INDEX}")
    with op.batch_alter_table("run_logs") as batch:
        batch.drop_column("trimmed_at")
        batch.drop_column("bytes")
        batch.drop_column("tenant")
