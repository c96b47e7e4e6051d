"""ix_jobs_schedule and ix_jobs_http_url: the job list by schedule, and its URL search

The job list filters by schedule (the name in a firing's payload) and searches HTTP jobs'
URLs (a contains, in any case). ix_jobs_schedule, on both databases, holds the jobs of
firings by their schedule's name and id, so a schedule's newest jobs are read newest
first; on PostgreSQL ix_jobs_http_url holds HTTP jobs' URLs by their trigrams (the pg_trgm
extension, made here if the database has it not), so a search reads the jobs it matches
rather than every job. Each index's expression is the one the list's query says
(store/job_lists.py).

A search's plan depends on how many jobs its text matches: few are read through the
trigrams, many are found sooner walking the newest ids. The planner can only tell with
statistics of the URLs, which it reads from no partial index: st_jobs_http_url (extended
statistics of the URL expression, at the default statistics target; ANALYZE makes them,
run here once) gives it them.

Run with corral's loops stopped. On PostgreSQL, given a connection outside a transaction
(`corral db upgrade` does that), the indexes are built CONCURRENTLY; one a failed build
left invalid is built again. pg_trgm is left in place by the downgrade: something else may
use it.

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-09
"""

import contextlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0028"
down_revision: str | None = "0027"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PG_SCHEDULE = "jsonb_extract_path_text(payload, 'corral', 'schedule')"
SQLITE_SCHEDULE = """json_extract(payload, '$."corral"."schedule"')"""

INDEXES = {
    "postgresql": {
        "ix_jobs_schedule": f"jobs ({PG_SCHEDULE}, id) WHERE {PG_SCHEDULE} IS NOT NULL",
        "ix_jobs_http_url": (
            "jobs USING gin ((spec ->> 'url') gin_trgm_ops) WHERE executor = 'http'"
        ),
    },
    "sqlite": {
        "ix_jobs_schedule": f"jobs ({SQLITE_SCHEDULE}, id) WHERE {SQLITE_SCHEDULE} IS NOT NULL",
    },
}
"""Each database's new indexes: name, and what follows ON."""
STATISTICS = "st_jobs_http_url"
"""The URLs' statistics (PostgreSQL), by which a search is planned."""


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        for name, on in INDEXES["sqlite"].items():
            op.execute(f"CREATE INDEX IF NOT EXISTS {name} ON {on}")
        return
    op.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    concurrently = bool(context.config.attributes.get("concurrent_ddl"))
    how = " CONCURRENTLY" if concurrently else ""
    # Alembic's autocommit block: CONCURRENTLY cannot run inside a transaction.
    outside = op.get_context().autocommit_block() if concurrently else contextlib.nullcontext()
    with outside:
        for name, on in INDEXES["postgresql"].items():
            valid = bind.execute(
                sa.text(
                    "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                    " WHERE c.relname = :name"
                ),
                {"name": name},
            )
            if valid.scalar() is False:  # a concurrent build that failed half way
                op.execute(f"DROP INDEX{how} IF EXISTS {name}")
            op.execute(f"CREATE INDEX{how} IF NOT EXISTS {name} ON {on}")
        op.execute(f"CREATE STATISTICS IF NOT EXISTS {STATISTICS} ON ((spec ->> 'url')) FROM jobs")
        op.execute("ANALYZE jobs")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"DROP STATISTICS IF EXISTS {STATISTICS}")
    for name in ("ix_jobs_http_url", "ix_jobs_schedule"):
        op.execute(f"DROP INDEX IF EXISTS {name}")
