"""jobs.callback, failure_callback and callback_of: a job's result sent to a URL when it ends

A job may name `callback` (sent its result when it succeeds) and `failure_callback` (when
it fails or is quarantined); the job that sends it, made in the transaction that ends the
job, names that job in `callback_of`. Callback jobs are counted by no quota: the partial
index ix_jobs_callbacks_waiting holds the waiting ones only, by tenant, so a tenant's
waiting jobs less its waiting callbacks are two reads of an index each. Every job stored
before this revision has none.

Revision ID: 0032
Revises: 0031
Create Date: 2026-12-08
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0032"
down_revision: str | None = "0031"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
WAITING = "callback_of IS NOT NULL AND state IN ('queued', 'scheduled', 'parked')"


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("callback", sa.Text()))
        batch.add_column(sa.Column("failure_callback", sa.Text()))
        batch.add_column(sa.Column("callback_of", Id))
    op.execute(f"CREATE INDEX ix_jobs_callbacks_waiting ON jobs (tenant) WHERE {WAITING}")


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS ix_jobs_callbacks_waiting")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("callback_of")
        batch.drop_column("failure_callback")
        batch.drop_column("callback")
