"""The tables of monitors (corral.monitoring): the monitors tenants keep, each one's pings
(the last PINGS_KEPT) and its state history, and when monitors were last judged. Apart from
tables.py, which imports them into the one schema, as that module is as long as a module
may be."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
    false,
    text,
)

from corral.store.columns import Id, Json, UTCDateTime, at, id_column, made, metadata, tenant_column

# A monitor of a tenant, named within it; `ping_key` (a random uuid) is its ping URL's
# secret. The judge reads those whose `check_at` came (ix_monitors_check_at); a ping of an up
# monitor moves only `last_ping_at`, and its window of pings a second.
monitors = Table(
    "monitors",
    metadata,
    id_column(),
    tenant_column(),
    Column("name", String(100), nullable=False),
    Column("ping_key", String(36), nullable=False, unique=True),
    Column("period_seconds", Integer),
    Column("cron", String(200)),
    Column("tz", String(64), nullable=False),
    Column("grace_seconds", Integer, nullable=False),
    Column("state", String(10), nullable=False),
    at("state_at"),
    at("basis_at"),
    Column("expected_at", UTCDateTime),
    Column("check_at", UTCDateTime, index=True),
    Column("last_ping_at", UTCDateTime),
    Column("run_started_at", UTCDateTime),
    Column("ping_window_at", UTCDateTime),
    Column("ping_window_count", Integer, nullable=False, server_default=text("0")),
    Column("ping_count", BigInteger, nullable=False, server_default=text("0")),
    Column("rule", String(100)),  # the tenant's alert rule its --channel made
    *made(),
    Column("managed", Boolean, nullable=False, server_default=false()),  # made by apply
    UniqueConstraint("tenant", "name"),
    sqlite_autoincrement=True,
)

# Each ping a monitor recorded: what it said, from where, the first BODY_BYTES of its body.
monitor_pings = Table(
    "monitor_pings",
    metadata,
    id_column(),
    Column("monitor_id", Id, nullable=False),
    at("at"),
    Column("kind", String(10), nullable=False),  # success, start, fail
    Column("exit_code", Integer),
    Column("source", String(100), nullable=False),
    Column("user_agent", String(300), nullable=False),
    Column("body", Text, nullable=False),
    Column("duration_seconds", Float),  # since its /start, when one came first
    Index("ix_monitor_pings_monitor_id", "monitor_id", "id"),
    sqlite_autoincrement=True,
)

# Each change of a monitor's state (and each gap in the judging that gave it a fresh start).
monitor_changes = Table(
    "monitor_changes",
    metadata,
    id_column(),
    Column("monitor_id", Id, nullable=False),
    at("at"),
    Column("from_state", String(10), nullable=False),
    Column("to_state", String(10), nullable=False),
    Column("reason", Text, nullable=False),
    Column("details", Json, nullable=False),
    Index("ix_monitor_changes_monitor_id", "monitor_id", "id"),
    sqlite_autoincrement=True,
)

# When monitors were last judged, and by which process (its row in loops): one row (id 1),
# written by every pass of the judge; the gap rule reads it (corral.monitor_judge).
monitors_judged = Table(
    "monitors_judged",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    at("judged_at"),
    Column("loop_id", String(32)),
)
