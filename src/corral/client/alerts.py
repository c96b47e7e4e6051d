"""Alerts as people look at them: the outbox's history with every try, muting a rule for
a while, and a test message sent through a channel at once."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from corral import store
from corral.client import service


@dataclass(frozen=True, slots=True)
class History:
    """The newest messages of the outbox, and the tries of each, by its id."""

    alerts: list[store.alerts.Alert]
    tries: dict[int, list[store.alerts.Try]]


class Alerts(service.Service):
    """Read the alerts outbox, mute rules, test channels."""

    async def alerts(
        self, *, limit: int = 50, rule: str | None = None, tenant: str | None = None
    ) -> list[store.alerts.Alert]:
        """The newest messages, of `rule`, about `tenant` (None: any)."""
        return await self.store.alerts.list(limit=limit, rule=rule, tenant=tenant)

    async def alert_history(self, *, limit: int = 50, rule: str | None = None) -> History:
        """The newest messages (of `rule`) with every try of each."""
        found = await self.store.alerts.list(limit=limit, rule=rule)
        return History(found, await self.store.alerts.tries(alert_ids=[a.id for a in found]))

    async def alerts_muted(self) -> dict[str, datetime]:
        """The rules muted now, each with when it sends again."""
        return await self.store.alerts.muted(now=self.clock.now())

    async def alert_mute(self, rule: str, span: timedelta) -> datetime:
        """Send nothing for `rule` for `span` (kept in the store: every alerter obeys); when
        it sends again."""
        now = self.clock.now()
        await self.store.alerts.mute(rule=rule, until=now + span, now=now)
        return now + span

    async def alert_unmute(self, rule: str) -> bool:
        """Let `rule` send again now; False when it was not muted."""
        return await self.store.alerts.unmute(rule=rule)

    async def alert_test(self, channel: str) -> store.alerts.Alert:
        """A test message sent through `channel` now, as the outbox holds it after the try
        (delivered, or not with its error)."""
        from corral import alerts as alerting  # its channels' libraries: only when asked

        now = self.clock.now()
        message: dict[str, Any] = {
            "dedupe_key": f"test|{channel}|{now.isoformat()}",
            "rule": "-",
            "channel": channel,
            "kind": "test",
            "cause": "test",
            "subject": f"channel:{channel}",
            "job_id": None,
            "details": {},
            "due_at": now + timedelta(hours=1),  # not a running alerter's to send
        }
        made = await self.store.alerts.add(message=message, now=now)
        sender = alerting.Alerter(store=self.store, clock=self.clock, settings=self.settings)
        try:
            await sender.deliver_now(made)
        finally:
            await sender.close()
        [found] = [a for a in await self.store.alerts.list(limit=50) if a.id == made]
        return found
