"""API tokens and the audit log

`tokens` holds one row per API credential: its name, the tenant it may act for (none:
every tenant, an admin's), its role (viewer, operator, admin), when it expires or was
revoked, and the SHA-256 of its secret (the secret itself is shown once, when made, and
never stored). `audit` records every change made through the API: when, by which token,
for which tenant, what, and to what.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
When = sa.DateTime(timezone=True)
Json = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "tokens",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("tenant", sa.String(200)),
        sa.Column("role", sa.String(20), nullable=False),
        sa.Column("secret_sha256", sa.String(64), nullable=False),
        sa.Column("created_at", When, nullable=False),
        sa.Column("expires_at", When),
        sa.Column("revoked_at", When),
        sa.PrimaryKeyConstraint("id", name="pk_tokens"),
        sa.UniqueConstraint("secret_sha256", name="uq_tokens_secret_sha256"),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "audit",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("at", When, nullable=False),
        sa.Column("token_id", Id),
        sa.Column("tenant", sa.String(200)),
        sa.Column("action", sa.String(100), nullable=False),
        sa.Column("target", sa.String(300), nullable=False),
        sa.Column("details", Json, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_audit"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_audit_tenant", "audit", ["tenant", "id"])


def downgrade() -> None:
    op.drop_index("ix_audit_tenant", table_name="audit")
    op.drop_table("audit")
    op.drop_table("tokens")
