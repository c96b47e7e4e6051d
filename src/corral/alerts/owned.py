"""The alerter's other source of rules and channels: those tenants own, in the store
(corral.tenant_alerts). Read once a pass, two statements; each rule becomes the same
AlertRule the settings' are, named `tenant:TENANT/NAME` and its match narrowed to its
tenant, and each channel is built when a message first needs it (again when it changed).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import pydantic

from corral import alert_settings, config, errors, store, tenant_alerts
from corral.alerts import channels

log = logging.getLogger("corral.alerts")

Built = channels.Email | channels.Slack | channels.Webhook
"""A channel ready to send."""


class Owned:
    """Tenants' rules (`rules`, by their outbox names) and channels, as last read."""

    def __init__(self, *, store: store.Store, settings: config.Settings, now: Any) -> None:
        self.store = store
        self.settings = settings
        self.now = now
        self.rules: dict[str, alert_settings.AlertRule] = {}
        self._stored: dict[str, tuple[str, Mapping[str, Any]]] = {}  # name: kind, config
        self._built: dict[str, tuple[str, Built]] = {}  # name: its config, built

    async def refresh(self) -> None:
        """Read every tenant's rules and channels as they stand now."""
        found = await self.store.tenant_alerts.every()
        made: dict[str, alert_settings.AlertRule] = {}
        for r in found.rules:
            try:
                made[tenant_alerts.qualified(r.tenant, r.name)] = tenant_alerts.rule_of(
                    r.tenant, r.rule
                )
            except pydantic.ValidationError as exc:  # stored by an older corral: skipped
                log.error("tenant %s's alert rule %s is not usable: %s", r.tenant, r.name, exc)
        self.rules = made
        self._stored = {
            tenant_alerts.qualified(c.tenant, c.name): (c.kind, c.config) for c in found.channels
        }

    def kind(self, name: str) -> str | None:
        """The kind of the tenant's channel `name` (None: no such channel now)."""
        stored = self._stored.get(name)
        return None if stored is None else stored[0]

    async def channel(self, name: str) -> Built:
        """The tenant's channel `name` (an outbox name), ready to send: read again when it
        is not known yet; errors.Undelivered when there is none so named any more, or an
        e-mail channel has no tenant_smtp to send through."""
        if name not in self._stored:
            await self.refresh()
        if name not in self._stored:
            raise errors.Undelivered(f"the tenant's channel {name!r} was deleted")
        kind, stored = self._stored[name]
        key = json.dumps([kind, stored], sort_keys=True)
        built = self._built.get(name)
        if built is None or built[0] != key:
            if built is not None:
                await _close(built[1])
            made = tenant_alerts.channel_of(kind, stored, self.settings.alerts)
            self._built[name] = (key, channels.made(made, self.settings, self.now))
        return self._built[name][1]

    async def close(self) -> None:
        for _, built in self._built.values():
            await _close(built)
        self._built = {}


async def _close(channel: Built) -> None:
    if isinstance(channel, channels._Web):
        await channel.close()
