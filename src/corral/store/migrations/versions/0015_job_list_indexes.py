"""Indexes for listing jobs, newest first, by state, by queue and state, and by label

A list of jobs (the API's GET /jobs, `corral jobs`) reads the newest jobs that match and
stops at its limit. Without these, a filter that few jobs match walked the primary key
back through the whole table: a state that a job in a hundred has, a queue in that state,
or a label that ten jobs have, read up to every job of a large table. ix_jobs_state
(state, id) and ix_jobs_queue_state (queue, state, id) hand over a state's (a queue's
state's) jobs already newest first; on PostgreSQL, ix_jobs_labels (GIN, jsonb_path_ops)
serves the label filter's containment (@>). SQLite's label filter reads json_extract,
which no index serves: it gets the two B-trees only.

Run with corral's loops stopped. On PostgreSQL, given a connection outside a transaction
(`corral db upgrade` does that), the indexes are built CONCURRENTLY, so a large jobs table
is not locked while they build; an index a failed build left invalid is built again.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05
"""

import contextlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

B_TREES = {
    "ix_jobs_state": "jobs (state, id)",
    "ix_jobs_queue_state": "jobs (queue, state, id)",
}
GIN = {"ix_jobs_labels": "jobs USING gin (labels jsonb_path_ops)"}


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        for name, what in B_TREES.items():
            op.execute(f"CREATE INDEX IF NOT EXISTS {name} ON {what}")
        return
    concurrently = bool(context.config.attributes.get("concurrent_ddl"))
    how = " CONCURRENTLY" if concurrently else ""
    # Alembic's autocommit block: CONCURRENTLY cannot run inside a transaction.
    outside = op.get_context().autocommit_block() if concurrently else contextlib.nullcontext()
    with outside:
        for name, what in {**B_TREES, **GIN}.items():
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


def downgrade() -> None:
    for name in (*B_TREES, *GIN):
        op.execute(f"DROP INDEX IF EXISTS {name}")
