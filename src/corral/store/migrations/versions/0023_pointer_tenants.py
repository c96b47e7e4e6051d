"""publish pointers per tenant: keyed by (tenant, dataset)

A dataset's name was one namespace for every tenant, so one tenant's job could read and
swap another's pointer. Each pointer now belongs to a tenant: an existing row takes the
tenant of the job whose attempt (its fence) published it last, or `default` where that
attempt is gone (forgotten by retention); the upgrade notes list it.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("publish_pointers") as batch:
        batch.add_column(sa.Column("tenant", sa.String(200), nullable=True))
    op.execute(
        "UPDATE publish_pointers SET tenant = (SELECT jobs.tenant FROM attempts"
        " JOIN jobs ON jobs.id = attempts.job_id WHERE attempts.id = publish_pointers.fence)"
    )
    op.execute("UPDATE publish_pointers SET tenant = 'default' WHERE tenant IS NULL")
    with op.batch_alter_table("publish_pointers", recreate="always") as batch:
        batch.alter_column("tenant", existing_type=sa.String(200), nullable=False)
        batch.drop_constraint("pk_publish_pointers", type_="primary")
        batch.create_primary_key("pk_publish_pointers", ["tenant", "dataset"])


def downgrade() -> None:
    # Two tenants' pointers of one name cannot both stay: the newest publish keeps it.
    op.execute(
        "DELETE FROM publish_pointers WHERE EXISTS (SELECT 1 FROM publish_pointers AS p"
        " WHERE p.dataset = publish_pointers.dataset AND p.fence > publish_pointers.fence)"
    )
    with op.batch_alter_table("publish_pointers", recreate="always") as batch:
        batch.drop_constraint("pk_publish_pointers", type_="primary")
        batch.drop_column("tenant")
        batch.create_primary_key("pk_publish_pointers", ["dataset"])
