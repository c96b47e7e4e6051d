"""Monitors kept as code: a `Monitor` document has the fields of a monitor's API body
(`period`, or `cron` and `tz`; `grace`; `channels`), checked as that body is
(client.monitors), and is what a monitor of its tenant holds. Its ping URL is its own,
never a document's: a monitor changed by apply keeps it.

Its `channels` are those of the alert rule the monitor made (`monitor-NAME`), which is the
monitor's and not an `AlertRule` of its own.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from corral import documents, durations, monitoring, store, tenant_alerts
from corral.client import apply_kinds


def fields_of(monitor: monitoring.Monitor, channels: list[str] | None) -> dict[str, Any]:
    """A monitor (made or stored) as a document's fields."""
    found: dict[str, Any] = {}
    if monitor.period is not None:
        found["period"] = durations.format_duration(monitor.period)
    else:
        found["cron"] = monitor.cron
        if monitor.tz != "UTC":
            found["tz"] = monitor.tz
    found["grace"] = durations.format_duration(monitor.grace)
    if channels:
        found["channels"] = list(channels)
    return found


class MonitorKind(apply_kinds.Kind):
    """`kind: Monitor`."""

    name = "Monitor"
    what = "monitor"

    async def held(self, c: apply_kinds.Services, tenant: str) -> dict[str, apply_kinds.Held]:
        rules = {r.name: r.rule for r in await c.tenant_rules(tenant)}
        found = {}
        for m in await c.monitors(tenant):
            channels = list(rules.get(m.rule, {}).get("channels", ())) if m.rule else None
            found[m.name] = apply_kinds.Held(m.name, fields_of(m, channels), m)
        return found

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
        new, rule = c.monitor_new(tenant, {**doc.fields, "name": doc.name})
        channels = None if rule is None else list(rule["channels"])
        where = (doc.where, self.what, tenant, doc.name)
        write: store.manifests.Write
        if held is None:
            most = c.monitors_most(tenant)
            write = store.manifests.MonitorMade(*where, new, rule, most, tenant_alerts.MAX_RULES)
        else:
            changed = dataclasses.replace(held.stored, period=new.period, cron=new.cron)
            changed = dataclasses.replace(changed, tz=new.tz, grace=new.grace)
            write = store.manifests.MonitorChanged(*where, changed, rule, tenant_alerts.MAX_RULES)
        return apply_kinds.Wanted(fields_of(new, channels), write)
