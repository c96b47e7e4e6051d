"""Alert channels and rules a tenant owns: made, listed and deleted within their tenant,
and all of them read at once for the alerter's pass.

What a channel's or a rule's fields may be is checked before they are stored
(corral.client.tenant_alerts); here only what needs the transaction: a name taken, the
tenant's limits, a rule's channels being the tenant's own, a channel a rule still uses.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Table, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from corral import errors
from corral.store import dialects
from corral.store.tables import alerts, monitors, tenant_alert_channels, tenant_alert_rules

if TYPE_CHECKING:
    from corral.store.database import Database

CH, RU = tenant_alert_channels.c, tenant_alert_rules.c


@dataclass(frozen=True, slots=True)
class TenantChannel:
    """A tenant's alert channel as stored: its kind's fields in `config` (secrets too)."""

    tenant: str
    name: str
    kind: str
    config: Mapping[str, Any]
    created_at: datetime


@dataclass(frozen=True, slots=True)
class TenantRule:
    """A tenant's alert rule as stored: its fields (on, match, channels, ...) in `rule`."""

    tenant: str
    name: str
    rule: Mapping[str, Any]
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Owned:
    """Every tenant's channels and rules, as one alerter pass reads them."""

    channels: list[TenantChannel] = field(default_factory=list)
    rules: list[TenantRule] = field(default_factory=list)


def _channel(row: Any) -> TenantChannel:
    return TenantChannel(row.tenant, row.name, row.kind, dict(row.config), row.created_at)


def _rule(row: Any) -> TenantRule:
    return TenantRule(row.tenant, row.name, dict(row.rule), row.created_at)


def _hold_count(conn: Connection, table: Table, tenant: str, most: int, what: str) -> None:
    """Conflict naming the limit when `tenant` has `most` rows of `table` already. The adds
    of one tenant take turns (on PostgreSQL a lock of the table's and the tenant's names,
    held until the transaction ends), so each counts the rows of those before it: locking
    the rows there are would not stop an insert, and with none there is nothing to lock."""
    dialects.take_turns(conn, f"{table.name}:{tenant}")
    count = select(func.count()).select_from(table).where(table.c.tenant == tenant)
    rows = conn.execute(count).scalar_one()
    if rows >= most:
        raise errors.Conflict(
            f"name: tenant {tenant!r} has {rows} alert {what} already, the most a"
            f" tenant may have ({most}); delete one first"
        )


def _insert(conn: Connection, table: Table, what: str, values: Mapping[str, Any]) -> Any:
    try:
        with conn.begin_nested():
            return conn.execute(insert(table).values(**values).returning(*table.c)).one()
    except IntegrityError:
        raise errors.Conflict(
            f"name: tenant {values['tenant']!r} has an alert {what} named {values['name']!r}"
            " already"
        ) from None


def channel_add(
    conn: Connection,
    *,
    tenant: str,
    name: str,
    kind: str,
    config: Mapping[str, Any],
    now: datetime,
    most: int,
) -> TenantChannel:
    """Store a channel of `tenant`: Conflict when the name is taken or it has `most`."""
    _hold_count(conn, tenant_alert_channels, tenant, most, "channels")
    values = {"tenant": tenant, "name": name, "kind": kind, "config": dict(config)}
    row = _insert(conn, tenant_alert_channels, "channel", {**values, "created_at": now})
    return _channel(row)


def rule_add(
    conn: Connection,
    *,
    tenant: str,
    name: str,
    rule: Mapping[str, Any],
    now: datetime,
    most: int,
) -> TenantRule:
    """Store a rule of `tenant`: InvalidInput when a channel it names is not the tenant's,
    Conflict when the name is taken or it has `most`."""
    _hold_count(conn, tenant_alert_rules, tenant, most, "rules")
    _channels_own(conn, tenant, rule)
    values = {"tenant": tenant, "name": name, "rule": dict(rule), "created_at": now}
    row = _insert(conn, tenant_alert_rules, "rule", values)
    return _rule(row)


def _channels_own(conn: Connection, tenant: str, rule: Mapping[str, Any]) -> None:
    """InvalidInput naming the first channel of `rule` that is not `tenant`'s."""
    named = list(rule.get("channels", ()))
    own = set(
        conn.execute(select(CH.name).where(CH.tenant == tenant, CH.name.in_(named))).scalars()
    )
    if missing := [c for c in named if c not in own]:
        raise errors.InvalidInput(
            f"channels: tenant {tenant!r} has no alert channel named {missing[0]!r}"
        )


def channel_change(
    conn: Connection, *, tenant: str, name: str, kind: str, config: Mapping[str, Any]
) -> None:
    """Give `tenant`'s channel `name` another kind or fields (checked as a new one's are);
    NotFound when it has none so named."""
    done = conn.execute(
        update(tenant_alert_channels)
        .where(CH.tenant == tenant, CH.name == name)
        .values(kind=kind, config=dict(config))
    )
    if not done.rowcount:
        raise errors.NotFound(f"no alert channel {name!r}")


def rule_change(conn: Connection, *, tenant: str, name: str, rule: Mapping[str, Any]) -> None:
    """Give `tenant`'s rule `name` other fields: InvalidInput when a channel it names is not
    the tenant's, NotFound when it has none so named."""
    _channels_own(conn, tenant, rule)
    done = conn.execute(
        update(tenant_alert_rules)
        .where(RU.tenant == tenant, RU.name == name)
        .values(rule=dict(rule))
    )
    if not done.rowcount:
        raise errors.NotFound(f"no alert rule {name!r}")


def channels_list(conn: Connection, *, tenant: str) -> list[TenantChannel]:
    """`tenant`'s channels, by name."""
    found = conn.execute(select(tenant_alert_channels).where(CH.tenant == tenant).order_by(CH.name))
    return [_channel(r) for r in found]


def rules_list(conn: Connection, *, tenant: str) -> list[TenantRule]:
    """`tenant`'s rules, by name."""
    found = conn.execute(select(tenant_alert_rules).where(RU.tenant == tenant).order_by(RU.name))
    return [_rule(r) for r in found]


def channel_delete(conn: Connection, *, tenant: str, name: str) -> bool:
    """Delete `tenant`'s channel `name` (False: it has none so named); Conflict while a
    rule of the tenant names it."""
    using = [r.name for r in rules_list(conn, tenant=tenant) if name in r.rule.get("channels", ())]
    if using:
        raise errors.Conflict(
            f"name: alert rule {using[0]!r} sends to channel {name!r}; delete the rule first"
        )
    gone = conn.execute(delete(tenant_alert_channels).where(CH.tenant == tenant, CH.name == name))
    return bool(gone.rowcount)


def rule_delete(conn: Connection, *, tenant: str, name: str) -> bool:
    """Delete `tenant`'s rule `name` (False: it has none so named). A monitor whose
    --channel made it forgets it: the monitor's delete leaves alone a rule made later under
    the name, and its next `corral apply` makes its rule again."""
    gone = conn.execute(delete(tenant_alert_rules).where(RU.tenant == tenant, RU.name == name))
    M = monitors.c
    conn.execute(update(monitors).where(M.tenant == tenant, M.rule == name).values(rule=None))
    return bool(gone.rowcount)


def owned_every(conn: Connection) -> Owned:
    """Every tenant's channels and rules: two statements, whatever the tenants."""
    channels = [_channel(r) for r in conn.execute(select(tenant_alert_channels).order_by(CH.id))]
    rules = [_rule(r) for r in conn.execute(select(tenant_alert_rules).order_by(RU.id))]
    return Owned(channels, rules)


def rules_exist(conn: Connection) -> bool:
    """Whether any tenant has an alert rule: one probe of the table."""
    return conn.execute(select(RU.id).limit(1)).first() is not None


def tests_since(conn: Connection, *, prefix: str, since: datetime) -> list[datetime]:
    """When each test message to a channel whose outbox name begins with `prefix` was
    made after `since`, oldest first."""
    AL = alerts.c
    stmt = (
        select(AL.created_at)
        .where(
            AL.kind == "test",
            AL.created_at > since,
            AL.channel.startswith(prefix, autoescape=True),
        )
        .order_by(AL.created_at)
    )
    return list(conn.execute(stmt).scalars())


# --- the handle ----------------------------------------------------------------------------


class TenantAlerts:
    """The store's handle on tenants' alert channels and rules (`store.tenant_alerts`).

    Each method runs the store function its name says, in one transaction; that
    function's docstring says what the call does.
    """

    def __init__(self, db: Database) -> None:
        self._db = db

    async def channel_add(
        self,
        *,
        tenant: str,
        name: str,
        kind: str,
        config: Mapping[str, Any],
        now: datetime,
        most: int,
    ) -> TenantChannel:
        return await self._db.tx(
            functools.partial(
                channel_add, tenant=tenant, name=name, kind=kind, config=config, now=now, most=most
            )
        )

    async def rule_add(
        self, *, tenant: str, name: str, rule: Mapping[str, Any], now: datetime, most: int
    ) -> TenantRule:
        return await self._db.tx(
            functools.partial(rule_add, tenant=tenant, name=name, rule=rule, now=now, most=most)
        )

    async def channels(self, *, tenant: str) -> list[TenantChannel]:
        return await self._db.read(functools.partial(channels_list, tenant=tenant))

    async def rules(self, *, tenant: str) -> list[TenantRule]:
        return await self._db.read(functools.partial(rules_list, tenant=tenant))

    async def channel_delete(self, *, tenant: str, name: str) -> bool:
        return await self._db.tx(functools.partial(channel_delete, tenant=tenant, name=name))

    async def rule_delete(self, *, tenant: str, name: str) -> bool:
        return await self._db.tx(functools.partial(rule_delete, tenant=tenant, name=name))

    async def every(self) -> Owned:
        return await self._db.read(owned_every)

    async def any_rule(self) -> bool:
        return await self._db.read(rules_exist)

    async def tests_since(self, *, prefix: str, since: datetime) -> list[datetime]:
        return await self._db.read(functools.partial(tests_since, prefix=prefix, since=since))
