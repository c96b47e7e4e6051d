"""tenant_alert_channels and tenant_alert_rules: alert channels and rules a tenant owns

Each is named within its tenant (unique on tenant and name); a channel's fields and a
rule's are kept as JSON, checked where they are made (corral.client.tenant_alerts).

Revision ID: 0031
Revises: 0030
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0031"
down_revision: str | None = "0030"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Json = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
When = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "tenant_alert_channels",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.String(200), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("kind", sa.String(20), nullable=False),
        sa.Column("config", Json, nullable=False),
        sa.Column("created_at", When, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_tenant_alert_channels"),
        sa.UniqueConstraint("tenant", "name", name="uq_tenant_alert_channels_tenant_name"),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "tenant_alert_rules",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.String(200), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("rule", Json, nullable=False),
        sa.Column("created_at", When, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_tenant_alert_rules"),
        sa.UniqueConstraint("tenant", "name", name="uq_tenant_alert_rules_tenant_name"),
        sqlite_autoincrement=True,
    )


def downgrade() -> None:
    op.drop_table("tenant_alert_rules")
    op.drop_table("tenant_alert_channels")
