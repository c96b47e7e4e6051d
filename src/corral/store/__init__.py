"""The durable store: jobs, attempts and events in SQLite (embedded) or PostgreSQL (scale).

`Store` holds the database (database.py: its connections, transactions and schema) and a
typed handle per thing stored, each at the end of its noun's module, calling that module's
functions and those of the modules split from it by concern (schedules.py and firings.py,
alerts.py and alert_reads.py, workers.py and parking.py, attempts.py and attempt_ends.py):
`store.jobs` (jobs.py), `store.attempts`, `store.events`, `store.schedules`, `store.alerts`,
`store.tokens` (API tokens, the audit log, signing secrets), `store.users` (the dashboard's
users and sessions), `store.workers` (Python workers and parked jobs), `store.operations`
(bulk actions), `store.quotas` (what tenants' quotas count: their writes are held to them
by the handles of what they write), `store.runlogs`, `store.sinks` (checkpoints and publish
pointers), `store.loops`, `store.tenants` (each tenant's use of its quotas) and
`store.tenant_alerts` (the alert channels and rules tenants own), `store.monitors` and
`store.monitor_pings` (monitors, their history and their pings), `store.flows` (tenants'
flows, and their claim) and `store.manifests` (a plan of `corral apply`, written whole, and
which objects apply made). A handle's call
runs one store function in one transaction on a worker thread, or, on PostgreSQL, a statement of the
hot path (hotpath.py, hotreads.py) on async connections of its own.
"""

from __future__ import annotations

from sqlalchemy import Engine
from sqlalchemy import exc as sa_exc

from corral import errors
from corral.store import (
    alerts,
    attempts,
    database,
    dialects,
    events,
    flows,
    jobs,
    loops,
    manifests,
    monitor_pings,
    monitors,
    operations,
    quotas,
    runlogs,
    schedules,
    sinks,
    tenant_alerts,
    tenants,
    tokens,
    users,
    workers,
)
from corral.store.attempts import Status
from corral.store.claims import DefaultLimits
from corral.store.completions import Finish, Outcome
from corral.timeouts import Timeouts

__all__ = ["DefaultLimits", "Finish", "Outcome", "Status", "Store"]


class Store:
    """One database, and a handle on each thing stored in it."""

    def __init__(self, engine: Engine, *, limits: dialects.ConnectionLimits | None = None) -> None:
        self.database = database.Database(engine, limits=limits)
        self.jobs = jobs.Jobs(self.database)
        self.attempts = attempts.Attempts(self.database)
        self.events = events.Events(self.database)
        self.schedules = schedules.Schedules(self.database)
        self.alerts = alerts.Alerts(self.database)
        self.tokens = tokens.Tokens(self.database)
        self.users = users.Users(self.database)
        self.workers = workers.Workers(self.database)
        self.operations = operations.Operations(self.database)
        self.quotas = quotas.Quotas(self.database)
        self.runlogs = runlogs.RunLogs(self.database)
        self.sinks = sinks.Sinks(self.database)
        self.loops = loops.Loops(self.database)
        self.tenants = tenants.Tenants(self.database)
        self.tenant_alerts = tenant_alerts.TenantAlerts(self.database)
        self.monitors = monitors.Monitors(self.database)
        self.monitor_pings = monitor_pings.MonitorPings(self.database)
        self.flows = flows.Flows(self.database)
        self.manifests = manifests.Manifests(self.database)

    @classmethod
    def connect(cls, url: str, *, timeouts: Timeouts | None = None) -> Store:
        """A Store for `url` (no connection is made until the first call), with the time
        limits of `timeouts` (default: the default settings') on its PostgreSQL connections."""
        limits = dialects.ConnectionLimits.of(timeouts or Timeouts())
        try:
            return cls(dialects.engine_create(url, limits), limits=limits)
        except (sa_exc.ArgumentError, ImportError, ValueError) as exc:
            raise errors.ConfigError(f"database_url: {url!r} is not usable: {exc}") from exc

    async def close(self) -> None:
        """Close the database's threads, pools and connections."""
        await self.database.close()
