"""Signing secrets: the keys HTTP requests are signed with, per tenant

`signing_secrets` holds every secret a tenant has had. The newest has no `retires_at`;
making a new one (a rotation) sets the others' `retires_at` to the end of the overlap,
until which they sign alongside it, so receivers can move to the new key at their pace.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
When = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "signing_secrets",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.String(200), nullable=False),
        sa.Column("secret", sa.String(200), nullable=False),
        sa.Column("created_at", When, nullable=False),
        sa.Column("retires_at", When),
        sa.PrimaryKeyConstraint("id", name="pk_signing_secrets"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_signing_secrets_tenant", "signing_secrets", ["tenant", "id"])
    current = sa.text("retires_at IS NULL")
    op.create_index(  # one current secret per tenant, whatever two rotations at once do
        "uq_signing_secrets_current",
        "signing_secrets",
        ["tenant"],
        unique=True,
        sqlite_where=current,
        postgresql_where=current,
    )


def downgrade() -> None:
    op.drop_index("uq_signing_secrets_current", table_name="signing_secrets")
    op.drop_index("ix_signing_secrets_tenant", table_name="signing_secrets")
    op.drop_table("signing_secrets")
