"""A tenant's alert channels and rules kept as code, checked as the API's bodies of them
are (corral.tenant_alerts, client.tenant_alerts).

An `AlertChannel` document says its channel's kind as `type` (`kind` is the document's):
`type: email` with `to`, `type: slack` with `webhook_url`, `type: webhook` with `url` and
perhaps `secret`. A web channel's URL (its path or query is the secret) and a webhook's
secret are exported as KEPT. An `AlertRule` document has a rule's fields (on, match,
channels, throttle, after, late_by); the rule a monitor's channels make is the monitor's,
and no AlertRule.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from corral import documents, errors, store, tenant_alerts
from corral.client import apply_kinds

SECRET = ("webhook_url", "url", "secret")
"""A channel's fields exported as KEPT."""


def channel_fields(kind: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """A channel (checked or stored) as a document's fields."""
    return {"type": kind, **{k: v for k, v in config.items() if v is not None}}


class ChannelKind(apply_kinds.Kind):
    """`kind: AlertChannel`."""

    name = "AlertChannel"
    what = "channel"

    async def held(self, c: apply_kinds.Services, tenant: str) -> dict[str, apply_kinds.Held]:
        return {
            ch.name: apply_kinds.Held(ch.name, channel_fields(ch.kind, ch.config), ch)
            for ch in await c.tenant_channels(tenant)
        }

    async def wanted(
        self,
        c: apply_kinds.Services,
        doc: documents.Document,
        tenant: str,
        held: apply_kinds.Held | None,
        *,
        limited: bool,
        named: apply_kinds.Named,
    ) -> apply_kinds.Wanted:
        given = self.restored(doc.fields, held)
        if "kind" in given:
            raise errors.InvalidInput(
                "kind: a channel says its kind as `type` (email, slack, webhook)"
            )
        kind = tenant_alerts.channel_kind(given.pop("type", None), "type")
        stored = (
            None
            if held is None
            else tenant_alerts.channel_url(held.stored.kind, held.stored.config)
        )
        name, kind, config = await c.tenant_channel_checked(
            {**given, "kind": kind, "name": doc.name}, stored=stored
        )
        where = (doc.where, self.what, tenant, name)
        write: store.manifests.Write
        if held is None:
            write = store.manifests.ChannelMade(*where, kind, config, tenant_alerts.MAX_CHANNELS)
        else:
            write = store.manifests.ChannelChanged(*where, kind, config)
        return apply_kinds.Wanted(channel_fields(kind, config), write)

    def exported(self, held: apply_kinds.Held) -> dict[str, Any]:
        return {k: documents.KEPT if k in SECRET else v for k, v in held.fields.items()}

    def restored(self, given: Mapping[str, Any], held: apply_kinds.Held | None) -> dict[str, Any]:
        found = dict(given)
        for key in SECRET:
            if found.get(key) != documents.KEPT:
                continue
            if held is None or held.fields.get(key) is None:
                raise apply_kinds.kept_nothing(key, "alert channel")
            found[key] = held.fields[key]
        return found


class RuleKind(apply_kinds.Kind):
    """`kind: AlertRule`."""

    name = "AlertRule"
    what = "rule"

    async def held(self, c: apply_kinds.Services, tenant: str) -> dict[str, apply_kinds.Held]:
        owned = {m.rule for m in await c.monitors(tenant) if m.rule is not None}
        return {
            r.name: apply_kinds.Held(r.name, dict(r.rule), r)
            for r in await c.tenant_rules(tenant)
            if r.name not in owned
        }

    async def wanted(
        self,
        c: apply_kinds.Services,
        doc: documents.Document,
        tenant: str,
        held: apply_kinds.Held | None,
        *,
        limited: bool,
        named: apply_kinds.Named,
    ) -> apply_kinds.Wanted:
        name = tenant_alerts.name_checked(doc.name)
        rule = tenant_alerts.rule_config(doc.fields, tenant)
        where = (doc.where, self.what, tenant, name)
        write: store.manifests.Write
        if held is None:
            write = store.manifests.RuleMade(*where, rule, tenant_alerts.MAX_RULES)
        else:
            write = store.manifests.RuleChanged(*where, rule)
        return apply_kinds.Wanted(rule, write)
