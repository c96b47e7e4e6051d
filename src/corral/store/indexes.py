"""The schema's partial indexes, as the migrations make them, for the tools that compare a
database with the metadata (Alembic's autogenerate, the schema tests); queries need
nothing from here. Declaring a PostgreSQL partial index loads SQLAlchemy's PostgreSQL
dialect, a large package, so no store module imports this one: a command on SQLite
starts without it. Importing it adds the indexes to `tables.metadata`, once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import Index, text

from corral.store import job_lists
from corral.store import quotas as quota_counts
from corral.store.tables import (
    DUE,
    JOB_ENDS,
    LIVE,
    PENDING,
    SENT,
    alerts,
    attempts,
    events,
    jobs,
    loop_warnings,
    metadata,
    operation_items,
    schedules,
    signing_secrets,
)

__all__ = ["EXPRESSIONS", "compared_on", "metadata"]
"""The whole schema: `tables.metadata` with these indexes."""

EXPRESSIONS = frozenset({"ix_jobs_schedule", "ix_jobs_http_url"})
"""The indexes of an expression, which `compared_on` leaves out: SQLAlchemy reflects none on
SQLite (and names one on both databases twice here, an index of each's own expression).
tests/contract/test_job_search.py compares their definitions instead."""

# Partial indexes: a job is in each only while it is in that state, so finished jobs (most
# of a busy table) cost them nothing, and a job's later updates skip them. Queries state
# the state as a literal, not a parameter, or a planner cannot match the index's WHERE.
_QUEUED = text("state = 'queued' AND flow IS NULL")
# The claim finds the tenants with queued jobs by skipping through this index (one probe a
# tenant), and walks each one's part in order, stopping after `limit` rows, so its cost does
# not grow with the number of finished jobs or of queued ones (LIMIT). Jobs of a flow are
# not in it (the main claim never takes them; the flow claim walks ix_jobs_flow_queued), so
# a backlog a flow holds costs the main claim nothing.
Index(
    "ix_jobs_queued_tenant",
    jobs.c.tenant,
    jobs.c.priority.desc(),
    jobs.c.run_at,
    jobs.c.id,
    sqlite_where=_QUEUED,
    postgresql_where=_QUEUED,
)
# Running jobs in pools: what a pooled claim counts. Only those: a job outside any pool
# is never in it, and no other query can pick it by mistake.
_POOLED = text("state = 'running' AND pool IS NOT NULL")
Index("ix_jobs_pooled", jobs.c.pool, sqlite_where=_POOLED, postgresql_where=_POOLED)
# Jobs of a flow (corral.flows), queued and running: what the flow claim walks and counts
# (store/flow_claims.py). Jobs of no flow are in neither, so they cost them nothing.
_FLOW_QUEUED = text("state = 'queued' AND flow IS NOT NULL")
Index(
    "ix_jobs_flow_queued",
    jobs.c.tenant,
    jobs.c.flow,
    jobs.c.priority.desc(),
    jobs.c.run_at,
    jobs.c.id,
    sqlite_where=_FLOW_QUEUED,
    postgresql_where=_FLOW_QUEUED,
)
_FLOW_RUNNING = text("state = 'running' AND flow IS NOT NULL")
Index(
    "ix_jobs_flow_running",
    jobs.c.tenant,
    jobs.c.flow,
    sqlite_where=_FLOW_RUNNING,
    postgresql_where=_FLOW_RUNNING,
)
# A key is unique per tenant; most jobs have none, and those are not in the index.
_KEYED = text("idempotency_key IS NOT NULL")
Index(
    "uq_jobs_idempotency",
    jobs.c.tenant,
    jobs.c.idempotency_key,
    unique=True,
    sqlite_where=_KEYED,
    postgresql_where=_KEYED,
)

# Waiting callback jobs by tenant: what a tenant's quota count takes away (store/quotas.py).
Index(
    "ix_jobs_callbacks_waiting",
    jobs.c.tenant,
    sqlite_where=quota_counts.CALLBACKS_WAITING,
    postgresql_where=quota_counts.CALLBACKS_WAITING,
)

# Live attempts by fence (tables.LIVE says which and why).
Index(
    "ix_attempts_live",
    attempts.c.id,
    sqlite_where=LIVE,
    postgresql_where=LIVE,
)

# Running blind attempts by the loop that sent them: what recovery reads once a sender is
# dead. Only those with a sender (HTTP requests), and only while they run.
Index("ix_attempts_sent_by", attempts.c.sent_by, sqlite_where=SENT, postgresql_where=SENT)

# One open warning a condition: many processes that see it begin write it once.
_OPEN = text("ended_at IS NULL")
Index(
    "uq_loop_warnings_open",
    loop_warnings.c.condition,
    unique=True,
    sqlite_where=_OPEN,
    postgresql_where=_OPEN,
)

# Job ends by time (tables.JOB_ENDS): the overview's charts count a window's.
Index(
    "ix_events_job_ends",
    events.c.at,
    events.c.to_state,
    events.c.job_id,
    sqlite_where=JOB_ENDS,
    postgresql_where=JOB_ENDS,
)

# Jobs waiting for their time (`corral submit --at`/`--delay`): the scheduler moves each to
# queued once due, reading this index by run_at.
_SCHEDULED = text("state = 'scheduled'")
Index("ix_jobs_scheduled", jobs.c.run_at, sqlite_where=_SCHEDULED, postgresql_where=_SCHEDULED)
# The same jobs by tenant: the claim takes each tenant's longest due ones, by its share.
Index(
    "ix_jobs_scheduled_tenant",
    jobs.c.tenant,
    jobs.c.run_at,
    jobs.c.id,
    sqlite_where=_SCHEDULED,
    postgresql_where=_SCHEDULED,
)

# Schedules by their next nominal time, but the paused and ended ones (tables.DUE).
Index("ix_schedules_due", schedules.c.next_due, sqlite_where=DUE, postgresql_where=DUE)

# Alerts waiting for delivery, by when they are due: what the deliverer reads.
Index("ix_alerts_pending", alerts.c.due_at, sqlite_where=PENDING, postgresql_where=PENDING)

# One current signing secret a tenant (the one that has not begun to retire).
_CURRENT = text("retires_at IS NULL")
Index(
    "uq_signing_secrets_current",
    signing_secrets.c.tenant,
    unique=True,
    sqlite_where=_CURRENT,
    postgresql_where=_CURRENT,
)

# A bulk operation's items still to do, in job order.
_TODO = text("done_at IS NULL")
Index(
    "ix_operation_items_todo",
    operation_items.c.operation_id,
    operation_items.c.job_id,
    sqlite_where=_TODO,
    postgresql_where=_TODO,
)

# Labels by containment (@>), which is how a job list's label filter reads them on
# PostgreSQL (dialects.json_has): a GIN index, jsonb_path_ops (it serves @> only, and is
# smaller for it). PostgreSQL only: SQLite reads a label with json_extract, which no index
# of the column serves.
Index(
    "ix_jobs_labels",
    jobs.c.labels,
    postgresql_using="gin",
    postgresql_ops={"labels": "jsonb_path_ops"},
).ddl_if(dialect="postgresql")

# A schedule's jobs, the newest first (the job list's schedule filter): the schedule's name
# in a firing's payload (job_lists.schedule_of, the same expression on each database), and
# the id. Only the jobs of firings: any other job has no schedule, and is not in it.
_PG_SCHEDULE, _SQLITE_SCHEDULE = (
    job_lists.schedule_of("postgresql"),
    job_lists.schedule_of("sqlite"),
)
Index(
    "ix_jobs_schedule",
    _PG_SCHEDULE,
    jobs.c.id,
    postgresql_where=_PG_SCHEDULE.is_not(None),
).ddl_if(dialect="postgresql")
Index(
    "ix_jobs_schedule",
    _SQLITE_SCHEDULE,
    jobs.c.id,
    sqlite_where=_SQLITE_SCHEDULE.is_not(None),
).ddl_if(dialect="sqlite")

# HTTP jobs' URLs by their trigrams (pg_trgm): what the job list's URL search (a contains,
# in any case: ILIKE) reads on PostgreSQL. SQLite reads it with a LIKE, which no index
# serves.
Index(
    "ix_jobs_http_url",
    job_lists.url_of("postgresql").label("url"),
    postgresql_using="gin",
    postgresql_ops={"url": "gin_trgm_ops"},
    postgresql_where=text("executor = 'http'"),
).ddl_if(dialect="postgresql")


def compared_on(dialect: str) -> Callable[..., bool]:
    """Alembic's `include_object` for comparing a `dialect` database with `metadata`: an
    index made on other dialects only (ddl_if) is not looked for there, nor one of
    EXPRESSIONS anywhere."""

    def include(obj: Any, name: str | None, kind: str, reflected: bool, compare_to: Any) -> bool:
        if kind == "index" and name in EXPRESSIONS:
            return False
        only = getattr(obj, "_ddl_if", None) if kind == "index" and not reflected else None
        return only is None or only.dialect in (None, dialect)

    return include
