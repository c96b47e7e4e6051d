"""Alerts: where each rule and subject stands, in one row

`alert_streaks` (one row per rule and subject) gains `window_at`, when the throttle window
of its newest message opened, and `owes_recovery`, whether a failure was sent and no
"recovered" message since. The alerter read both from its newest messages before, which
cost a query per subject on every pass; now one query reads every subject a pass needs,
and the subjects that a success can change are those with a row owing something.

The rows are filled from the messages already sent: the window from the newest
message's creation (close to the event it is about), the recovery from whether a
failure message is newer than the newest recovered one.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

When = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("alert_streaks") as table:
        table.add_column(sa.Column("window_at", When))
        table.add_column(
            sa.Column("owes_recovery", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    op.execute(
        """
        INSERT INTO alert_streaks (rule, subject, failures, owes_recovery)
        SELECT DISTINCT rule, subject, 0, false FROM alerts a
        WHERE a.kind = 'alert' AND NOT EXISTS (
            SELECT 1 FROM alert_streaks s WHERE s.rule = a.rule AND s.subject = a.subject
        )
        """
    )
    newest = """(SELECT max(id) FROM alerts a
        WHERE a.rule = alert_streaks.rule AND a.subject = alert_streaks.subject AND {})"""
    op.execute(
        f"""
        UPDATE alert_streaks SET
            window_at = (SELECT created_at FROM alerts WHERE id = {
            newest.format("a.kind = 'alert'")
        }),
            owes_recovery = COALESCE({
            newest.format(
                "a.kind = 'alert' AND a.cause NOT IN ('schedule_late', 'schedule_missed')"
            )
        }, 0) > COALESCE({newest.format("a.kind = 'recovered'")}, 0)
        """
    )


def downgrade() -> None:
    with op.batch_alter_table("alert_streaks") as table:
        table.drop_column("owes_recovery")
        table.drop_column("window_at")
