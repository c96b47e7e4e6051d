"""flows, flow_starts and jobs.flow: flow control per destination

A flow is a tenant's object, named within its tenant (unique on tenant and name): a rate
(`rate` starts within any window of `per_seconds`), a parallelism, and the hold a
Retry-After puts on it. `flow_starts` keeps the starts its rate counts. A job names its flow
in `jobs.flow`; every job stored before this revision has none. The jobs of a flow have two
partial indexes of their own (queued, running), which no job of no flow is in; and the main
claim's ix_jobs_queued_tenant is made again without them (`AND flow IS NULL`), so a backlog
a flow holds is never walked by the claim of every other job.

Revision ID: 0034
Revises: 0033
Create Date: 2026-12-08
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0034"
down_revision: str | None = "0033"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
When = sa.DateTime(timezone=True)
QUEUED = "state = 'queued' AND flow IS NOT NULL"
RUNNING = "state = 'running' AND flow IS NOT NULL"
QUEUED_TENANT = "jobs (tenant, priority DESC, run_at, id) WHERE state = 'queued'"
"""ix_jobs_queued_tenant as 0026 made it; from here, of the jobs of no flow only."""


def upgrade() -> None:
    op.create_table(
        "flows",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.String(200), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("rate", sa.Integer()),
        sa.Column("per_seconds", sa.Float()),
        sa.Column("parallelism", sa.Integer()),
        sa.Column("held_until", When),
        sa.Column("held_reason", sa.Text()),
        sa.Column("created_at", When, nullable=False),
        sa.Column("updated_at", When, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_flows"),
        sa.UniqueConstraint("tenant", "name", name="uq_flows_tenant_name"),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "flow_starts",
        sa.Column("flow_id", Id, nullable=False),
        sa.Column("started_at", When, nullable=False),
    )
    op.create_index("ix_flow_starts_flow", "flow_starts", ["flow_id", "started_at"])
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("flow", sa.String(100)))
    op.create_index(
        "ix_jobs_flow_queued",
        "jobs",
        ["tenant", "flow", sa.text("priority DESC"), "run_at", "id"],
        sqlite_where=sa.text(QUEUED),
        postgresql_where=sa.text(QUEUED),
    )
    op.create_index(
        "ix_jobs_flow_running",
        "jobs",
        ["tenant", "flow"],
        sqlite_where=sa.text(RUNNING),
        postgresql_where=sa.text(RUNNING),
    )
    op.execute("DROP INDEX IF EXISTS ix_jobs_queued_tenant")
    op.execute(f"CREATE INDEX ix_jobs_queued_tenant ON {QUEUED_TENANT} AND flow IS NULL")


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS ix_jobs_queued_tenant")
    op.execute(f"CREATE INDEX ix_jobs_queued_tenant ON {QUEUED_TENANT}")
    op.drop_index("ix_jobs_flow_running", table_name="jobs")
    op.drop_index("ix_jobs_flow_queued", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("flow")
    op.drop_index("ix_flow_starts_flow", table_name="flow_starts")
    op.drop_table("flow_starts")
    op.drop_table("flows")
