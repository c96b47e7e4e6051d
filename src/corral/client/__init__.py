"""The Python API for submitting, inspecting and cancelling jobs, as services.

    async with corral.connect() as client:
        job_id, created = await client.submit(spec={"command": ["echo", "hello"]})

Each concern is a service in a module of its own (client.jobs, client.schedules,
client.follow, client.tokens, client.tenants, ...), and `Client` is all of them over one
store. It is also the only way api/, web/ and cli/ reach the store.
"""

from __future__ import annotations

from corral.client import (
    alerts,
    apply,
    apply_alerts,
    apply_kinds,
    apply_monitors,
    apply_schedules,
    arguments,
    attempts,
    audit,
    backfill,
    bodies,
    checks,
    counts,
    events,
    explain,
    flows,
    follow,
    jobs,
    monitors,
    operations,
    schedule_reads,
    schedules,
    schema,
    service,
    signing,
    tenant_alerts,
    tenants,
    tokens,
    users,
    workers,
)


class Client(
    apply.Apply,
    explain.Explain,
    follow.Follow,
    schedules.Schedules,
    schedule_reads.ScheduleReads,
    backfill.Backfill,
    operations.Operations,
    users.Users,
    signing.Signing,
    attempts.Attempts,
    events.Events,
    audit.Audit,
    workers.Workers,
    tenant_alerts.TenantAlerts,
    monitors.Monitors,
    flows.Flows,
    counts.Counts,
    tenants.Tenants,
):
    """Submit and manage jobs against one store: every service of the client at once."""


__all__ = [
    "Client",
    "alerts",
    "apply",
    "apply_alerts",
    "apply_kinds",
    "apply_monitors",
    "apply_schedules",
    "arguments",
    "attempts",
    "audit",
    "backfill",
    "bodies",
    "checks",
    "counts",
    "events",
    "explain",
    "flows",
    "follow",
    "jobs",
    "monitors",
    "operations",
    "schedule_reads",
    "schedules",
    "schema",
    "service",
    "signing",
    "tenant_alerts",
    "tenants",
    "tokens",
    "users",
    "workers",
]
