"""Users and dashboard sessions

`users` holds the people who sign in to the dashboard with a name and a password (its
argon2 hash, never the password), each for one tenant (or every tenant) in one role, as
tokens are. `web_sessions` holds one row a signed-in browser: the SHA-256 of its cookie's
secret, who it is (a user, or the API token it signed in with), its CSRF secret, and when
it ends.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
When = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("password_hash", sa.String(300), nullable=False),
        sa.Column("tenant", sa.String(200)),
        sa.Column("role", sa.String(20), nullable=False),
        sa.Column("created_at", When, nullable=False),
        sa.Column("removed_at", When),
        sa.PrimaryKeyConstraint("id", name="pk_users"),
        sa.UniqueConstraint("name", name="uq_users_name"),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "web_sessions",
        sa.Column("secret_sha256", sa.String(64), nullable=False),
        sa.Column("user_id", Id),
        sa.Column("token_id", Id),
        sa.Column("csrf", sa.String(64), nullable=False),
        sa.Column("created_at", When, nullable=False),
        sa.Column("expires_at", When, nullable=False),
        sa.PrimaryKeyConstraint("secret_sha256", name="pk_web_sessions"),
    )
    op.create_index("ix_web_sessions_expires_at", "web_sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_web_sessions_expires_at", table_name="web_sessions")
    op.drop_table("web_sessions")
    op.drop_table("users")
