"""The tables of flows (corral.flows): a tenant's flows and the starts their rates count.
Apart from tables.py, which re-exports them, for its length; on the same MetaData."""

from __future__ import annotations

from sqlalchemy import (
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
)

from corral.store.columns import Id, UTCDateTime, at, id_column, made, metadata, tenant_column

# Flows a tenant owns (corral.flows), each named within its tenant: a rate (`rate` starts
# within any window of `per_seconds`) and a parallelism, either or both (NULL: none), and
# the hold a Retry-After puts on the whole flow (`held_until`, and what it was); `managed`:
# made or changed by `corral apply`, which `apply --prune` may delete.
flows = Table(
    "flows",
    metadata,
    id_column(),
    tenant_column(),
    Column("name", String(100), nullable=False),
    Column("rate", Integer),
    Column("per_seconds", Float),
    Column("parallelism", Integer),
    Column("held_until", UTCDateTime),
    Column("held_reason", Text),
    Column("managed", Boolean, nullable=False, server_default=false()),  # made by apply
    *made(),
    UniqueConstraint("tenant", "name"),
    sqlite_autoincrement=True,
)

# The starts each flow's rate counts: one row per attempt its claim started, at the claim's
# time; those past the longest window are deleted by the next claim of the flow. No key but
# the flow and the time: nothing else reads a row.
flow_starts = Table(
    "flow_starts",
    metadata,
    Column("flow_id", Id, nullable=False),
    at("started_at"),
    Index("ix_flow_starts_flow", "flow_id", "started_at"),
)
