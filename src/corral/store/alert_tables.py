"""The tables of alerts (corral.alerts): the outbox and its tries, the alerter's cursor,
each rule's streaks and mutes, and the channels and rules a tenant owns. Apart from
tables.py, which imports them into the one schema, as that module is as long as a module
may be."""

from __future__ import annotations

from sqlalchemy import (
    Boolean,
    Column,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
    false,
    text,
)

from corral.store.columns import Id, Json, UTCDateTime, at, id_column, metadata, tenant_column

# The alerts outbox (corral.alerts): one row per message per channel, unique on its dedupe
# key, written with the alerter's cursor move; pending until delivered or given up.
alerts = Table(
    "alerts",
    metadata,
    id_column(),
    Column("dedupe_key", String(500), nullable=False),
    Column("rule", String(200), nullable=False),
    Column("channel", String(200), nullable=False),
    Column("kind", String(20), nullable=False),  # alert, digest, recovered, test
    Column("cause", String(40), nullable=False),
    Column("subject", String(300), nullable=False),  # store/alert_subjects.py
    Column("job_id", Id),
    Column("details", Json, nullable=False),  # what the message says
    Column("state", String(20), nullable=False),  # pending, delivered, failed
    at("created_at"),
    at("due_at"),
    Column("tries", Integer, nullable=False),
    Column("last_error", Text),
    Column("delivered_at", UTCDateTime),
    UniqueConstraint("dedupe_key"),
    Index("ix_alerts_subject", "rule", "subject", "id"),
    sqlite_autoincrement=True,
)
PENDING = text("state = 'pending'")
"""The predicate of ix_alerts_pending (indexes.py), as its readers write it."""

alert_tries = Table(
    "alert_tries",
    metadata,
    id_column(),
    Column("alert_id", Id, nullable=False),
    at("at"),
    Column("ok", Boolean, nullable=False),
    Column("error", Text),
    Index("ix_alert_tries_alert", "alert_id", "id"),
    sqlite_autoincrement=True,
)

alert_cursors = Table(
    "alert_cursors",
    metadata,
    Column("name", String(50), primary_key=True),
    Column("event_id", Id, nullable=False),
    at("updated_at"),
)

# Where each rule and subject stands (corral.alerts.rules.Sent): its streak of jobs that
# ended badly, when its throttle window opened, whether it owes a "recovered" message.
alert_streaks = Table(
    "alert_streaks",
    metadata,
    Column("rule", String(200), primary_key=True),
    Column("subject", String(300), primary_key=True),
    Column("failures", Integer, nullable=False),
    Column("window_at", UTCDateTime),
    Column("owes_recovery", Boolean, nullable=False, server_default=false()),
)

alert_mutes = Table(
    "alert_mutes",
    metadata,
    Column("rule", String(200), primary_key=True),
    at("until"),
    at("muted_at"),
)


# Alert channels and rules a tenant owns (corral.client.tenant_alerts), each named within its
# tenant: `config` a channel's kind's fields (addresses, a webhook's URL and secret), `rule`
# a rule's (on, match, channels, throttle, ...), its match narrowed to the tenant when read.
tenant_alert_channels = Table(
    "tenant_alert_channels",
    metadata,
    id_column(),
    tenant_column(),
    Column("name", String(100), nullable=False),
    Column("kind", String(20), nullable=False),
    Column("config", Json, nullable=False),
    at("created_at"),
    Column("managed", Boolean, nullable=False, server_default=false()),  # made by apply
    UniqueConstraint("tenant", "name"),
    sqlite_autoincrement=True,
)

tenant_alert_rules = Table(
    "tenant_alert_rules",
    metadata,
    id_column(),
    tenant_column(),
    Column("name", String(100), nullable=False),
    Column("rule", Json, nullable=False),
    at("created_at"),
    Column("managed", Boolean, nullable=False, server_default=false()),  # made by apply
    UniqueConstraint("tenant", "name"),
    sqlite_autoincrement=True,
)
