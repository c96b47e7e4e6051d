"""Monitors, as tenants and the operator keep them: made from a request's body (checked as
corral.monitoring says; its --channel rule as a tenant's rule is), listed, shown with their
pings and history, paused, resumed, given a new ping URL and deleted, always within one
tenant; and a ping recorded, found by its URL's key alone (the ping route's one call).

A monitor's ping URL is under settings.public_url: a monitor is not made while it is unset,
as nobody could be told where to ping.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from corral import errors, monitoring, redaction, store, tenancy, tenant_alerts
from corral.client import service

NO_PUBLIC_URL = (
    "public_url: corral's public_url is not set, so a monitor would have no ping URL to"
    ' give; set public_url in corral.toml (public_url = "https://corral.example.com") or'
    " CORRAL_PUBLIC_URL to the address its cron jobs reach corral at"
)
FIELDS = ("name", "tenant", "period", "cron", "tz", "grace", "channels")
"""What a request to make a monitor may say."""


def body_text(body: bytes) -> str:
    """The first BODY_BYTES of a ping's body as text a database holds (undecodable bytes
    and NUL characters replaced)."""
    text = body[: monitoring.BODY_BYTES].decode("utf-8", errors="replace")
    return text.replace("\x00", "\ufffd")


class Monitors(service.Service):
    """Make, list, show, pause, resume, rotate and delete monitors; record their pings."""

    def ping_url(self, monitor: monitoring.Monitor, *, secret: bool = True) -> str | None:
        """Where the monitor is pinged (None: public_url is not set). Whoever holds the URL
        may ping, so a caller who may only look (a viewer) is shown it with its key
        redacted (`secret` False)."""
        base = self.settings.public_base
        if base is None:
            return None
        return monitoring.ping_url(base, monitor.ping_key if secret else redaction.REDACTED)

    async def monitor_add(self, tenant: str, body: Mapping[str, Any]) -> monitoring.Monitor:
        """Make a monitor of `tenant` from a request's body (name, period or cron and tz,
        grace, channels): InvalidInput naming the field, QuotaExceeded past the tenant's
        max_monitors, Conflict when the name is taken or public_url is not set."""
        new, rule = self.monitor_new(tenant, body)
        return await self.store.monitors.add(
            new=new,
            rule=rule,
            most=self.monitors_most(tenant),
            rules_most=tenant_alerts.MAX_RULES,
            now=new.created_at,
        )

    def monitors_most(self, tenant: str) -> int:
        """The most monitors `tenant` may have (its max_monitors)."""
        return tenancy.resolved(self.settings.tenants, tenant).max_monitors

    def monitor_new(
        self, tenant: str, body: Mapping[str, Any]
    ) -> tuple[monitoring.Monitor, dict[str, Any] | None]:
        """The monitor `monitor_add` would store of a request's body, checked, made now,
        and the alert rule its channels make (None: it names none)."""
        if unknown := sorted(set(body) - set(FIELDS)):
            raise errors.InvalidInput(f"{unknown[0]}: unknown field (allowed: {', '.join(FIELDS)})")
        if self.settings.public_base is None:
            raise errors.Conflict(NO_PUBLIC_URL)
        name = monitoring.name_checked(body.get("name"))
        period, cron, tz, grace = monitoring.cadence_checked(
            period=body.get("period"),
            cron=body.get("cron"),
            tz=body.get("tz"),
            grace=body.get("grace"),
        )
        rule = self._rule(tenant, name, body.get("channels"))
        now = self.clock.now()
        new = monitoring.Monitor(
            id=0,
            tenant=tenant,
            name=name,
            ping_key="",
            period=period,
            cron=cron,
            tz=tz,
            grace=grace,
            state=monitoring.UP,
            state_at=now,
            basis_at=now,
            expected_at=None,
            check_at=None,
            last_ping_at=None,
            run_started_at=None,
            created_at=now,
        )
        return new, rule

    @staticmethod
    def _rule(tenant: str, name: str, channels: Any) -> dict[str, Any] | None:
        """The alert rule `channels` make for the monitor, checked as a tenant's rule is
        (None: no channel named)."""
        if channels is None or channels == []:
            return None
        if not isinstance(channels, list) or not all(isinstance(c, str) for c in channels):
            raise errors.InvalidInput("channels: a list of the tenant's alert channels' names")
        return tenant_alerts.rule_config(monitoring.rule_of(name, channels), tenant)

    async def monitors(self, tenant: str | None) -> list[monitoring.Monitor]:
        """`tenant`'s monitors (None: every tenant's), by tenant and name."""
        return await self.store.monitors.listed(tenant=tenant)

    async def monitor(self, tenant: str, name: str) -> monitoring.Monitor:
        """`tenant`'s monitor `name`; NotFound when it has none so named."""
        return await self.store.monitors.get(tenant=tenant, name=name)

    async def monitor_pings(
        self, monitor: monitoring.Monitor, limit: int = 100
    ) -> list[store.monitor_pings.Ping]:
        """The monitor's newest pings, the newest first."""
        return await self.store.monitor_pings.newest(monitor_id=monitor.id, limit=limit)

    async def monitor_changes(
        self, monitor: monitoring.Monitor, limit: int = 100
    ) -> list[store.monitors.StateChange]:
        """The monitor's history (its states, and the gaps that gave it a fresh start),
        the newest first."""
        return await self.store.monitors.changes(monitor_id=monitor.id, limit=limit)

    async def monitor_pause(self, tenant: str, name: str) -> bool:
        """Pause it: not judged, whatever its pings (False: it was paused already)."""
        return await self.store.monitors.pause(tenant=tenant, name=name, now=self.clock.now())

    async def monitor_resume(self, tenant: str, name: str) -> bool:
        """Resume it, its next ping expected from now (False: it was not paused)."""
        return await self.store.monitors.resume(tenant=tenant, name=name, now=self.clock.now())

    async def monitor_rotate(self, tenant: str, name: str) -> monitoring.Monitor:
        """Give it a new ping URL (the old one is not found from now); the monitor after."""
        await self.store.monitors.rotate(tenant=tenant, name=name, now=self.clock.now())
        return await self.monitor(tenant, name)

    async def monitor_delete(self, tenant: str, name: str) -> None:
        """Delete it, with its pings, its history and its --channel rule; NotFound when
        `tenant` has none so named."""
        if not await self.store.monitors.delete(tenant=tenant, name=name):
            raise errors.NotFound(f"no monitor {name!r}")

    async def monitor_ping(
        self, key: str, action: str | None, *, source: str, user_agent: str, body: bytes
    ) -> store.monitor_pings.Recorded:
        """Record a ping of the monitor whose URL's key is `key`; `action` the URL's last
        part (start, fail, an exit code; None: a success). InvalidInput for another."""
        kind, code = monitoring.ping_kind(action)
        return await self.store.monitor_pings.record(
            key=key,
            kind=kind,
            exit_code=code,
            source=source,
            user_agent=user_agent,
            body=body_text(body),
            now=self.clock.now(),
        )

    async def monitors_counted(self) -> dict[str, int]:
        """How many monitors are in each state, every state named (0 for none)."""
        found = await self.store.monitors.counts()
        return {state: found.get(state, 0) for state in monitoring.STATES}

    async def public_warnings(self) -> list[str]:
        """What `corral check` says of public_url: unset while monitors or alert rules
        exist (no ping URL to give, no link in an alert), or set through the deprecated
        alerts.base_url."""
        found = []
        if self.settings.public_url is None and self.settings.alerts.base_url is not None:
            found.append(
                "alerts.base_url is deprecated: set public_url to the same address instead"
            )
        if self.settings.public_base is None:
            rules = bool(self.settings.alerts.rules) or await self.store.tenant_alerts.any_rule()
            if rules or await self.store.monitors.any():
                found.append(
                    "public_url is not set while monitors or alert rules exist: monitors have"
                    " no ping URL to give and alerts link to nothing; set public_url to the"
                    " address corral is reached at"
                )
        return found
