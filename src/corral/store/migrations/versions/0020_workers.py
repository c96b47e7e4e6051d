"""Python workers and the tasks they read

`workers` holds one row a `corral worker` process: who it is (app, app version, host,
pid), what it takes (queues, concurrency), whether it runs, drains or has stopped, and
when it last said it was alive. A worker is live while it has not stopped and its last
word is younger than the lease. Rows of stopped workers are kept: they say which app
version read which payload version, which a parked job records.

`worker_tasks` holds, for each worker, every (task, payload version) it reads and that
version's JSON Schema; `newest` marks the version the worker writes. A submit is checked
against the newest schema a live worker registered; a job no live worker reads parks.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Json = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
When = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "workers",
        sa.Column("id", sa.String(100), nullable=False),
        sa.Column("app", sa.String(200), nullable=False),
        sa.Column("app_version", sa.String(100), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("queues", Json, nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(20), nullable=False),
        sa.Column("started_at", When, nullable=False),
        sa.Column("last_seen_at", When, nullable=False),
        sa.Column("stopped_at", When),
        sa.PrimaryKeyConstraint("id", name="pk_workers"),
    )
    op.create_table(
        "worker_tasks",
        sa.Column("worker_id", sa.String(100), nullable=False),
        sa.Column("task", sa.String(200), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("newest", sa.Boolean(), nullable=False),
        sa.Column("schema", Json, nullable=False),
        sa.PrimaryKeyConstraint("worker_id", "task", "version", name="pk_worker_tasks"),
    )
    op.create_index("ix_worker_tasks_task_version", "worker_tasks", ["task", "version"])


def downgrade() -> None:
    op.drop_index("ix_worker_tasks_task_version", table_name="worker_tasks")
    op.drop_table("worker_tasks")
    op.drop_table("workers")
