"""Alert channels and rules a tenant owns: made from a request's body (checked as
corral.tenant_alerts says, a web channel's address through the HTTP jobs' guard), listed,
tested (at most TESTS_A_MINUTE a minute per tenant) and deleted, always within one tenant.

`acts_for` is the tenant the asker acts for (a token's), or None for one of every tenant,
who names the tenant with a `tenant` field or parameter (default: default).
"""

from __future__ import annotations

import math
import urllib.parse
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from corral import errors, store, tenant_alerts
from corral.client import alerts

MINUTE = timedelta(minutes=1)


def qualified(rule: store.tenant_alerts.TenantRule) -> str:
    """How the outbox, the history and mutes name a tenant's rule."""
    return tenant_alerts.qualified(rule.tenant, rule.name)


def whose(acts_for: str | None, given: Any) -> str:
    """The tenant a request acts on: the asker's own; one of every tenant names it
    (default: default). Another tenant's, asked by a tenant's token, is refused."""
    if given is not None and not isinstance(given, str):
        raise errors.InvalidInput("tenant: a tenant's name")
    if acts_for is None:
        return given or "default"
    if given not in (None, acts_for):
        raise errors.InvalidInput(f"tenant: this token acts for tenant {acts_for!r} only")
    return acts_for


class TenantAlerts(alerts.Alerts):
    """Make, list, test and delete the alert channels and rules tenants own."""

    async def tenant_channels(self, tenant: str) -> list[store.tenant_alerts.TenantChannel]:
        """`tenant`'s alert channels, by name (secrets too: show them through shapes)."""
        return await self.store.tenant_alerts.channels(tenant=tenant)

    async def tenant_rules(self, tenant: str) -> list[store.tenant_alerts.TenantRule]:
        """`tenant`'s alert rules, by name."""
        return await self.store.tenant_alerts.rules(tenant=tenant)

    async def tenants_alerts(self) -> store.tenant_alerts.Owned:
        """Every tenant's alert channels and rules (secrets too: show them through shapes)."""
        return await self.store.tenant_alerts.every()

    async def tenant_channel_add(
        self, tenant: str, body: Mapping[str, Any]
    ) -> store.tenant_alerts.TenantChannel:
        """Make a channel of `tenant` from a request's body (name, kind and its fields)."""
        name, kind, config = await self.tenant_channel_checked(body)
        return await self.store.tenant_alerts.channel_add(
            tenant=tenant,
            name=name,
            kind=kind,
            config=config,
            now=self.clock.now(),
            most=tenant_alerts.MAX_CHANNELS,
        )

    async def tenant_channel_checked(
        self, body: Mapping[str, Any], *, stored: str | None = None
    ) -> tuple[str, str, dict[str, Any]]:
        """A channel's name, kind and fields to store, from a request's body (name, kind and
        its fields); InvalidInput naming the field. Where a web channel posts is checked
        through the HTTP jobs' guard, unless it is `stored`, where it posts already."""
        given = {k: v for k, v in body.items() if k not in ("name", "tenant")}
        name = tenant_alerts.name_checked(body.get("name"))
        kind, config = tenant_alerts.channel_config(given, self.settings.alerts)
        url = tenant_alerts.channel_url(kind, config)
        if url is not None and url != stored:
            await self._guarded(url, "webhook_url" if kind == "slack" else "url")
        return name, kind, config

    async def _guarded(self, url: str, field: str) -> None:
        """InvalidInput naming `field` when the HTTP jobs' guard refuses where `url` goes."""
        import httpx  # the HTTP client, only where a channel is made: not for every command

        from corral.executors import http_guard

        guard = http_guard.Guard(self.settings.executors.http.allow_networks)
        parts = urllib.parse.urlsplit(url)
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
            await guard.address(parts.hostname or "", port)
        except ValueError:
            raise errors.InvalidInput(f"{field}: not a valid URL") from None
        except errors.DestinationRefused as exc:
            raise errors.InvalidInput(f"{field}: refused: {exc}") from None
        except httpx.ConnectError as exc:
            raise errors.InvalidInput(f"{field}: {exc}") from None

    async def tenant_rule_add(
        self, tenant: str, body: Mapping[str, Any]
    ) -> store.tenant_alerts.TenantRule:
        """Make a rule of `tenant` from a request's body: its channels must be the
        tenant's own, its match is the tenant's jobs only."""
        given = {k: v for k, v in body.items() if k not in ("name", "tenant")}
        name = tenant_alerts.name_checked(body.get("name"))
        rule = tenant_alerts.rule_config(given, tenant)
        return await self.store.tenant_alerts.rule_add(
            tenant=tenant, name=name, rule=rule, now=self.clock.now(), most=tenant_alerts.MAX_RULES
        )

    async def tenant_channel_delete(self, tenant: str, name: str) -> None:
        """Delete `tenant`'s channel `name`: NotFound when it has none so named, Conflict
        while one of its rules sends to it."""
        if not await self.store.tenant_alerts.channel_delete(tenant=tenant, name=name):
            raise errors.NotFound(f"no alert channel {name!r}")

    async def tenant_rule_delete(self, tenant: str, name: str) -> None:
        """Delete `tenant`'s rule `name`: NotFound when it has none so named."""
        if not await self.store.tenant_alerts.rule_delete(tenant=tenant, name=name):
            raise errors.NotFound(f"no alert rule {name!r}")

    async def tenant_channel_test(self, tenant: str, name: str) -> store.alerts.Alert:
        """A test message through `tenant`'s channel `name` now, as the outbox holds it
        after the try: NotFound when it has none so named, RateLimited past
        TESTS_A_MINUTE tests of the tenant's channels in a minute."""
        if name not in {c.name for c in await self.tenant_channels(tenant)}:
            raise errors.NotFound(f"no alert channel {name!r}")
        now = self.clock.now()
        prefix = tenant_alerts.qualified(tenant, "")
        recent = await self.store.tenant_alerts.tests_since(prefix=prefix, since=now - MINUTE)
        if len(recent) >= tenant_alerts.TESTS_A_MINUTE:
            wait = (recent[-tenant_alerts.TESTS_A_MINUTE] + MINUTE - now).total_seconds()
            raise errors.RateLimited(
                f"name: at most {tenant_alerts.TESTS_A_MINUTE} channel tests a minute per"
                " tenant; try again later",
                quota="alert_tests",
                tenant=tenant,
                retry_after=max(1, math.ceil(wait)),
            )
        return await self.alert_test(tenant_alerts.qualified(tenant, name))
