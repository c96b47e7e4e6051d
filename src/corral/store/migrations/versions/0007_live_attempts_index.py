"""Live attempts indexed apart: ix_attempts_live on (id) holds only attempts that are
launching or running, in place of ix_attempts_active, which held every attempt by state

An index led by state kept an entry for every attempt that ever lived, the ended ones
(most of them) and, until vacuum, the dead versions of the live ones: the settle's lookups
by fence could be planned through it, and then read every launching attempt there ever
was. The partial index holds what its readers ask for (the dispatcher's poll of live
attempts and recovery's scan, both by fence; there are few live attempts, so the poll
filters by executor as it reads) and nothing a lookup by fence would use.

Run with corral's loops stopped. On PostgreSQL, given a connection outside a transaction
(`corral db upgrade` does that), the index is built CONCURRENTLY, so a large attempts table
is not locked while it builds; an index a failed build left invalid is built again.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

import contextlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LIVE = "attempts (id) WHERE state IN ('launching', 'running')"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        op.execute(f"CREATE INDEX IF NOT EXISTS ix_attempts_live ON {LIVE}")
        op.execute("DROP INDEX IF EXISTS ix_attempts_active")
        return
    concurrently = bool(context.config.attributes.get("concurrent_ddl"))
    how = " CONCURRENTLY" if concurrently else ""
    # Alembic's autocommit block: CONCURRENTLY cannot run inside a transaction.
    outside = op.get_context().autocommit_block() if concurrently else contextlib.nullcontext()
    with outside:
        valid = op.get_bind().execute(
            sa.text(
                "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                " WHERE c.relname = 'ix_attempts_live'"
            )
        )
        if valid.scalar() is False:  # a concurrent build that failed half way
            op.execute(f"DROP INDEX{how} IF EXISTS ix_attempts_live")
        op.execute(f"CREATE INDEX{how} IF NOT EXISTS ix_attempts_live ON {LIVE}")
        op.execute(f"DROP INDEX{how} IF EXISTS ix_attempts_active")


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS ix_attempts_live")
    op.create_index("ix_attempts_active", "attempts", ["state", "executor", "id"])
