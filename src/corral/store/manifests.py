"""Objects kept as code (`corral apply`): a tenant's plan, every write of it in one
transaction, and which of its objects apply made (`managed`), the ones `apply --prune` may
delete.

The client works out the plan (corral.client.apply: each document checked as the CLI
and the API check that kind, compared with what is stored); here it is written whole or
not at all. An error of one write names the document it is for first, and undoes them all;
a dry run writes the plan and then undoes it, so that what only the transaction can tell
(a name taken, a quota full, a rule's channel missing) is found without changing anything.

Each kind of object is a key of TABLES: the table whose `managed` column marks it, its
delete in DELETES and its writes as Write classes. A schedule's flow is checked again by
the schedule's own write (store.schedules), so a flow the same plan makes, written before
it, counts.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy import Connection, Table, select, update

from corral import documents, errors, flows, monitoring, quotas, scheduling
from corral.store import flows as flow_store
from corral.store import monitors, schedules, tenant_alerts
from corral.store import quotas as holds
from corral.store.tables import flows as flow_table
from corral.store.tables import monitors as monitor_table
from corral.store.tables import schedules as schedule_table
from corral.store.tables import tenant_alert_channels, tenant_alert_rules

if TYPE_CHECKING:
    from corral.store.database import Database

TABLES: Mapping[str, Table] = {
    "schedule": schedule_table,
    "monitor": monitor_table,
    "channel": tenant_alert_channels,
    "rule": tenant_alert_rules,
    "flow": flow_table,
}
"""Each kind of object a plan writes, and the table whose `managed` column marks it."""


@dataclass(frozen=True, slots=True)
class Write:
    """One write of a plan: on `tenant`'s object `name` of `what` (a key of TABLES), for the
    document `where` names (what an error of it says first). Unless `marks` is False, the
    object is managed after it."""

    where: str
    what: str
    tenant: str
    name: str
    marks: ClassVar[bool] = True

    def run(self, conn: Connection, now: datetime) -> None:
        """Mark the object managed, and nothing more: one made by hand that a document
        now holds, as it is."""


@dataclass(frozen=True, slots=True)
class ScheduleMade(Write):
    new: scheduling.NewSchedule
    anchor: datetime
    next_due: datetime | None
    quota: quotas.Limits | None  # a tenant's request: held to its max_schedules

    def run(self, conn: Connection, now: datetime) -> None:
        write = functools.partial(
            schedules.schedule_create,
            new=self.new,
            anchor=self.anchor,
            next_due=self.next_due,
            now=now,
        )
        if self.quota is None:
            write(conn)
        else:
            holds.schedule_held(conn, quota=self.quota, now=now, write=write)


@dataclass(frozen=True, slots=True)
class ScheduleChanged(Write):
    schedule_id: int
    changes: Mapping[str, Any]
    next_due: datetime | None

    def run(self, conn: Connection, now: datetime) -> None:
        schedules.schedule_update(
            conn,
            schedule_id=self.schedule_id,
            changes=self.changes,
            next_due=self.next_due,
            now=now,
        )


@dataclass(frozen=True, slots=True)
class MonitorMade(Write):
    new: monitoring.Monitor
    rule: Mapping[str, Any] | None
    most: int
    rules_most: int

    def run(self, conn: Connection, now: datetime) -> None:
        monitors.monitor_add(
            conn, new=self.new, rule=self.rule, most=self.most, rules_most=self.rules_most, now=now
        )


@dataclass(frozen=True, slots=True)
class MonitorChanged(Write):
    changed: monitoring.Monitor
    rule: Mapping[str, Any] | None
    rules_most: int

    def run(self, conn: Connection, now: datetime) -> None:
        monitors.monitor_update(
            conn, changed=self.changed, rule=self.rule, rules_most=self.rules_most, now=now
        )


@dataclass(frozen=True, slots=True)
class ChannelMade(Write):
    kind: str
    config: Mapping[str, Any]
    most: int

    def run(self, conn: Connection, now: datetime) -> None:
        tenant_alerts.channel_add(
            conn,
            tenant=self.tenant,
            name=self.name,
            kind=self.kind,
            config=self.config,
            now=now,
            most=self.most,
        )


@dataclass(frozen=True, slots=True)
class ChannelChanged(Write):
    kind: str
    config: Mapping[str, Any]

    def run(self, conn: Connection, now: datetime) -> None:
        tenant_alerts.channel_change(
            conn, tenant=self.tenant, name=self.name, kind=self.kind, config=self.config
        )


@dataclass(frozen=True, slots=True)
class RuleMade(Write):
    rule: Mapping[str, Any]
    most: int

    def run(self, conn: Connection, now: datetime) -> None:
        tenant_alerts.rule_add(
            conn, tenant=self.tenant, name=self.name, rule=self.rule, now=now, most=self.most
        )


@dataclass(frozen=True, slots=True)
class RuleChanged(Write):
    rule: Mapping[str, Any]

    def run(self, conn: Connection, now: datetime) -> None:
        tenant_alerts.rule_change(conn, tenant=self.tenant, name=self.name, rule=self.rule)


@dataclass(frozen=True, slots=True)
class FlowMade(Write):
    limits: flows.Limits
    most: int

    def run(self, conn: Connection, now: datetime) -> None:
        flow_store.flow_add(
            conn, tenant=self.tenant, name=self.name, limits=self.limits, now=now, most=self.most
        )


@dataclass(frozen=True, slots=True)
class FlowChanged(Write):
    limits: flows.Limits

    def run(self, conn: Connection, now: datetime) -> None:
        changed = flow_store.flow_update(
            conn, tenant=self.tenant, name=self.name, limits=self.limits, now=now
        )
        if changed is None:
            raise errors.NotFound(f"no flow {self.name!r}: deleted meanwhile")


def _schedule_delete(conn: Connection, *, tenant: str, name: str) -> bool:
    found = schedules.schedule_get(conn, name=name, tenant=tenant)
    schedules.schedule_delete(conn, schedule_id=found.id)
    return True


DELETES: Mapping[str, Callable[..., bool]] = {
    "schedule": _schedule_delete,
    "monitor": monitors.monitor_delete,
    "channel": tenant_alerts.channel_delete,
    "rule": tenant_alerts.rule_delete,
    "flow": flow_store.flow_delete,
}
"""How each kind of object is deleted (False: there was none so named)."""


@dataclass(frozen=True, slots=True)
class Deleted(Write):
    """A managed object the files no longer hold (`--prune`)."""

    marks: ClassVar[bool] = False

    def run(self, conn: Connection, now: datetime) -> None:
        if not DELETES[self.what](conn, tenant=self.tenant, name=self.name):
            raise errors.NotFound(f"no {self.what} {self.name!r}: deleted meanwhile")


class _DryRun(Exception):  # not an error: how a dry run's transaction ends
    """The plan was written as a dry run: roll it back."""


def plan_apply(
    conn: Connection, *, tenant: str, writes: Sequence[Write], now: datetime, dry_run: bool
) -> int:
    """Run `writes`, every one of `tenant`'s, in order, each object written marked managed
    (a delete's object gone): how many were run. An error of one names its document first,
    and nothing is kept; with `dry_run` nothing is kept either (_DryRun, once all passed)."""
    for write in writes:
        if write.tenant != tenant:
            raise errors.InvalidInput(f"{write.where}: tenant: {write.tenant!r} is not {tenant!r}")
        try:
            write.run(conn, now)
            if write.marks:
                _mark(conn, TABLES[write.what], tenant, write.name)
        except errors.CorralError as exc:
            raise documents.located(exc, write.where) from exc
    if dry_run:
        raise _DryRun
    return len(writes)


def _mark(conn: Connection, table: Table, tenant: str, name: str) -> None:
    conn.execute(
        update(table).where(table.c.tenant == tenant, table.c.name == name).values(managed=True)
    )


def managed_read(conn: Connection, *, tenant: str) -> dict[str, set[str]]:
    """The names of `tenant`'s managed objects, by kind (each a key of TABLES)."""
    found: dict[str, set[str]] = {}
    for what, table in TABLES.items():
        stmt = select(table.c.name).where(table.c.tenant == tenant, table.c.managed.is_(True))
        found[what] = set(conn.execute(stmt).scalars())
    return found


# --- the handle ----------------------------------------------------------------------------


class Manifests:
    """The store's handle on plans of objects kept as code (`store.manifests`)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def managed(self, *, tenant: str) -> dict[str, set[str]]:
        return await self._db.read(functools.partial(managed_read, tenant=tenant))

    async def apply(
        self, *, tenant: str, writes: Sequence[Write], now: datetime, dry_run: bool
    ) -> int:
        """plan_apply, in one transaction; with `dry_run`, rolled back once it passed."""
        call = functools.partial(plan_apply, tenant=tenant, writes=writes, now=now, dry_run=dry_run)
        try:
            return await self._db.tx(call)
        except _DryRun:
            return len(writes)
